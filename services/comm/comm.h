/* Collective communication for a group of trainer ranks.
 *
 * One interface, several backends. A caller holds an `rf_comm *`: a group of
 * `world` ranks of which it is `rank`. Every collective is offered blocking
 * and asynchronous (the `i` variants return an `rf_comm_req *` that
 * rf_comm_wait() completes and frees), so gradient communication can overlap
 * the backward pass. The caller never names a backend: rf_comm_init_from_env()
 * chooses one from the environment and from where the tensors live:
 *
 *   backend  tensors        when
 *   self     host or none   world size 1 (every op is the identity or a copy)
 *   mpi      host (CPU)     started by mpirun (OpenMPI)
 *   nccl     device (GPU)   CUDA=1 build and opts.device == RF_COMM_DEVICE
 *
 * Conventions (as in NCCL):
 *   - counts are in elements, not bytes;
 *   - all-reduce is in place when send == recv;
 *   - reduce-scatter: send holds world*count elements, block r (elements
 *     [r*count, (r+1)*count)) of the reduction lands in rank r's recv (count
 *     elements). In place when recv == send + rank*count. Uneven sizes are the
 *     caller's padding: rf_comm_shard() gives every rank's range;
 *   - all-gather: every rank gives count elements, recv gets world*count,
 *     rank r's block at r*count. In place when send == recv + rank*count;
 *   - broadcast is in place, from `root`;
 *   - send/recv pair one sender with one receiver; messages between the same
 *     two ranks arrive in order. There are no tags. With NCCL, point-to-point
 *     operations of one rank run in the order issued, so a rank must never
 *     wait on a receive whose matching send the peer issues only after its own
 *     receive: a ring (send to next, receive from prev) is one
 *     rf_comm_sendrecv, which runs both halves together on every backend.
 * Every rank of a group must issue the same collectives in the same order.
 *
 * Errors: every call returns RF_OK or a negative rf_err (common/error.h) with
 * a detail in rf_errmsg(). A dead or silent peer never hangs a call: a blocking
 * call, or rf_comm_wait(), gives up after opts.timeout_s seconds with RF_ERR_IO
 * and a detail that begins "timeout:" and names the op, the rank, the group
 * size and the element count (or the peer). The clock of an async op starts
 * when rf_comm_wait() is called, so a long backward pass between start and
 * wait does not count against it. After a timeout or a transport error the
 * communicator is BROKEN: the operation may still be pending in the backend
 * and can never be cancelled, so every later call on it (and on any group split
 * from the same world) fails at once with RF_ERR_IO, and the only sensible
 * thing left is to log rf_errmsg() and exit the process non-zero; under mpirun
 * that makes mpirun end the other ranks, in pods the other ranks time out the
 * same way. rf_comm_destroy() on a broken communicator frees our memory but
 * does not call into the transport (MPI_Finalize would wait for the dead peer).
 *
 * Threads: a communicator and its requests are used by one thread at a time.
 *
 * Ownership: rf_comm_init_from_env() and rf_comm_split() return a
 * communicator the caller destroys with rf_comm_destroy(); groups made by
 * rf_comm_split()/rf_comm_mesh_init() must be destroyed before the world they
 * came from (the world's destroy finalizes MPI when it initialized it). Every
 * request must be waited on before its communicator is destroyed. */
#ifndef RF_COMM_H
#define RF_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rf_comm rf_comm;
typedef struct rf_comm_req rf_comm_req;

typedef enum rf_comm_dtype {
    RF_COMM_F32 = 0,
    RF_COMM_F64 = 1,
    RF_COMM_I32 = 2,
    RF_COMM_I64 = 3,
    RF_COMM_U8 = 4, /* flags: MAX of per-rank 0/1 is "any", MIN is "all" */
} rf_comm_dtype;

typedef enum rf_comm_op {
    RF_COMM_SUM = 0,
    RF_COMM_AVG = 1, /* sum / world; floating-point types only */
    RF_COMM_MAX = 2,
    RF_COMM_MIN = 3,
} rf_comm_op;

/* Where the buffers passed to the collectives live. */
typedef enum rf_comm_mem {
    RF_COMM_HOST = 0,   /* CPU memory: self or mpi backend */
    RF_COMM_DEVICE = 1, /* CUDA device memory: nccl backend (CUDA=1 builds) */
} rf_comm_mem;

typedef struct rf_comm_opts {
    /* Seconds one collective may take before the group is declared broken.
     * Default 300 (also used when <= 0); REFINERY_COMM_TIMEOUT overrides. */
    double timeout_s;
    /* Seconds the TCP bootstrap of pods keeps trying (clients: to reach rank 0
     * and fetch the id; rank 0: for every client to fetch it). Default 900:
     * pods of one group may start minutes apart.
     * REFINERY_BOOTSTRAP_TIMEOUT overrides. */
    double bootstrap_timeout_s;
    rf_comm_mem mem; /* default RF_COMM_HOST */
    /* Test knob, default 0; REFINERY_COMM_SYNC_SEND=1 sets it: the mpi
     * backend's sends (send, sendrecv) complete only once the peer's matching
     * receive has begun (MPI_Issend), as NCCL's do, instead of returning once
     * MPI has buffered a small message. A schedule that needs that buffering
     * (a send waited on before the peer posts its receive) then stops with a
     * timeout here rather than only on a GPU group (the trainer's pipeline on
     * a test device is run this way: pipeline.h). self and nccl ignore it. */
    int sync_send;
} rf_comm_opts;

/* The defaults above, for callers that change one field. */
rf_comm_opts rf_comm_opts_default(void);

/* How a process learns its place in the group, read from the environment by
 * rf_comm_env_read() (exposed so that it can be checked without starting a
 * group). First match wins:
 *   1. mpirun: OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (OpenMPI). The
 *      group starts with MPI_Init_thread; with RF_COMM_DEVICE rank 0's NCCL
 *      id travels by MPI_Bcast.
 *   2. pods: RANK and WORLD_SIZE (PyTorchJob convention), or an Indexed Job's
 *      JOB_COMPLETION_INDEX and REFINERY_WORLD_SIZE; rank 0 at MASTER_ADDR
 *      (a DNS name or address) and MASTER_PORT. REFINERY_RUN_ID and
 *      REFINERY_ATTEMPT tag the bootstrap so that a restarted group never
 *      takes a stale id (defaults "default" and 0). With world size > 1 this
 *      path needs RF_COMM_DEVICE (NCCL over the TCP bootstrap of
 *      comm/bootstrap.h); CPU groups are started by mpirun.
 *   3. nothing set: world size 1 (the self backend). */
typedef enum rf_comm_launch {
    RF_COMM_LAUNCH_SINGLE = 0,
    RF_COMM_LAUNCH_MPIRUN = 1,
    RF_COMM_LAUNCH_ENV = 2,
} rf_comm_launch;

typedef struct rf_comm_env {
    rf_comm_launch launch;
    int rank, world;
    int local_rank;        /* picks the GPU; OMPI_COMM_WORLD_LOCAL_RANK or
                              LOCAL_RANK, else -1 (then rank % devices) */
    char master_addr[256]; /* ENV launch only */
    int master_port;       /* ENV launch only */
    char run_id[128];
    uint32_t attempt;
} rf_comm_env;

/* Fills *env from the environment; RF_ERR_INVALID (naming the variable) when a
 * value is malformed, out of range or missing (e.g. RANK without WORLD_SIZE). */
int rf_comm_env_read(rf_comm_env *env);

/* Starts this process's world group as rf_comm_env_read() describes; opts may
 * be NULL for the defaults. */
int rf_comm_init_from_env(const rf_comm_opts *opts, rf_comm **out);
/* The same from an explicit rf_comm_env (tests, or callers with their own
 * discovery). */
int rf_comm_init(const rf_comm_opts *opts, const rf_comm_env *env, rf_comm **out);

/* Frees the communicator; finalizes the transport when this is the world that
 * started it and the group is not broken. NULL is a no-op. */
int rf_comm_destroy(rf_comm *c);

int rf_comm_rank(const rf_comm *c);
int rf_comm_world(const rf_comm *c);
const char *rf_comm_backend_name(const rf_comm *c); /* "self", "mpi", "nccl" */
/* Non-zero after a timeout or transport error (see above). */
int rf_comm_broken(const rf_comm *c);
/* Where c's buffers live (the opts.mem it was made with). */
rf_comm_mem rf_comm_mem_of(const rf_comm *c);
/* A new group of the same ranks, in the same order, for buffers in `mem`,
 * with c's timeouts; collective over c. From a host group (self or mpi) to
 * RF_COMM_DEVICE: an NCCL group whose id rank 0 makes and c carries, on the
 * calling thread's current CUDA device (the one the caller's kernels use).
 * The new group owns its own transport state (its failures do not break c);
 * destroy it before c. RF_ERR_UNSUPPORTED without CUDA=1 or for any other
 * pair of memory kinds. */
int rf_comm_dup_mem(rf_comm *c, rf_comm_mem mem, rf_comm **out);
size_t rf_comm_dtype_size(rf_comm_dtype t);
/* Device groups: orders each later operation of c after the work queued on
 * `stream` (the cudaStream_t of the caller's kernels, on c's device) by the
 * time the operation starts. The operation's own stream waits for an event
 * recorded there, so the caller need not wait on the host for its kernels
 * before a collective reads what they wrote; rf_comm_wait and the blocking
 * calls still wait for the operation itself (and its timeout), after which
 * anything the caller queues sees the result. RF_ERR_UNSUPPORTED for host
 * groups (self, mpi), whose transports read memory from the host as they
 * start; RF_ERR_INVALID for a NULL stream. */
int rf_comm_order_after(rf_comm *c, void *stream);
/* Whether rf_comm_order_after succeeded on c. */
int rf_comm_ordered(const rf_comm *c);
/* A test hook (process-wide; NULL, NULL: none, the default): enter() runs
 * before an operation on a host-memory group (self, mpi) starts, and leave()
 * once its request is over (rf_comm_wait, or a failed start), each with the
 * bytes the operation reads (send, sbytes) and writes (recv, rbytes; a NULL
 * pointer and 0 for a side it does not have). The trainer's test device
 * cpu-guarded (trainer/backend.h), whose memory host code may touch only
 * inside its own kernels, opens those bytes for the transport this way. A
 * non-zero enter() fails the operation (leave() still follows it; its return
 * is ignored). Set them before any operation. */
typedef int (*rf_comm_access_fn)(const void *send, size_t sbytes, const void *recv, size_t rbytes);
void rf_comm_set_access_hooks(rf_comm_access_fn enter, rf_comm_access_fn leave);

/* Blocking collectives. */
int rf_comm_allreduce(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t,
                      rf_comm_op op);
int rf_comm_reduce_scatter(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t,
                           rf_comm_op op);
int rf_comm_allgather(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t);
int rf_comm_broadcast(rf_comm *c, void *buf, size_t count, rf_comm_dtype t, int root);
int rf_comm_send(rf_comm *c, const void *buf, size_t count, rf_comm_dtype t, int peer);
int rf_comm_recv(rf_comm *c, void *buf, size_t count, rf_comm_dtype t, int peer);
/* Sends count elements of send to rank dst and receives count elements from
 * rank src into recv, both at once (a ring shift, a pipeline exchange). */
int rf_comm_sendrecv(rf_comm *c, const void *send, int dst, void *recv, int src, size_t count,
                     rf_comm_dtype t);
/* The same with scount elements sent and rcount received (dst and src may
 * be one rank: a pipeline stage sends its neighbour an activation while
 * receiving a gradient of another size from it). */
int rf_comm_sendrecv_n(rf_comm *c, const void *send, size_t scount, int dst, void *recv,
                       size_t rcount, int src, rf_comm_dtype t);
int rf_comm_barrier(rf_comm *c);

/* Asynchronous variants: on RF_OK *req is a request the caller must pass to
 * rf_comm_wait(); the buffers must stay untouched until then. On error *req is
 * NULL. */
int rf_comm_iallreduce(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t,
                       rf_comm_op op, rf_comm_req **req);
int rf_comm_ireduce_scatter(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t,
                            rf_comm_op op, rf_comm_req **req);
int rf_comm_iallgather(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t,
                       rf_comm_req **req);
int rf_comm_ibroadcast(rf_comm *c, void *buf, size_t count, rf_comm_dtype t, int root,
                       rf_comm_req **req);
int rf_comm_isend(rf_comm *c, const void *buf, size_t count, rf_comm_dtype t, int peer,
                  rf_comm_req **req);
int rf_comm_irecv(rf_comm *c, void *buf, size_t count, rf_comm_dtype t, int peer,
                  rf_comm_req **req);
int rf_comm_isendrecv(rf_comm *c, const void *send, int dst, void *recv, int src, size_t count,
                      rf_comm_dtype t, rf_comm_req **req);
int rf_comm_isendrecv_n(rf_comm *c, const void *send, size_t scount, int dst, void *recv,
                        size_t rcount, int src, rf_comm_dtype t, rf_comm_req **req);
int rf_comm_ibarrier(rf_comm *c, rf_comm_req **req);

/* Completes the request (within opts.timeout_s from this call) and frees it,
 * success or not. NULL is a no-op. */
int rf_comm_wait(rf_comm_req *req);
/* Gives the backend a chance to progress the request without blocking (MPI
 * progresses nonblocking collectives only inside MPI calls, so a caller that
 * overlaps a long computation may call this between layers); *done is set to
 * 1 once complete (the request must still be passed to rf_comm_wait). */
int rf_comm_test(rf_comm_req *req, int *done);

/* Splits the group: ranks passing the same color form one new group, ordered
 * by key (ties by rank). Collective over c. Every rank gets a group. */
int rf_comm_split(rf_comm *c, int color, int key, rf_comm **out);

/* The dp x pp x tp mesh. Ranks are laid out with tp fastest, then pp, then
 * dp, like picotron's view(dp, pp, tp):
 *
 *     rank = (dp_i * pp + pp_i) * tp + tp_i
 *
 * so the ranks of one tensor-parallel group are adjacent (on one node, where
 * the fast links are), a pipeline group strides by tp, and a data-parallel
 * group strides by pp*tp. Example dp=2, tp=2, pp=1: tp groups {0,1} {2,3},
 * dp groups {0,2} {1,3}, pp groups {0} {1} {2} {3}. */
typedef struct rf_comm_mesh {
    int dp, tp, pp;       /* sizes of the axes */
    int dp_i, tp_i, pp_i; /* this rank's coordinates */
    rf_comm *dp_comm;     /* ranks that differ only in dp_i (size dp) */
    rf_comm *tp_comm;     /* ... only in tp_i (size tp) */
    rf_comm *pp_comm;     /* ... only in pp_i (size pp) */
} rf_comm_mesh;

/* Coordinates of `rank` and back; RF_ERR_INVALID when a size is < 1 or a
 * coordinate or rank is out of range. */
int rf_comm_mesh_coords(int rank, int dp, int tp, int pp, int *dp_i, int *tp_i, int *pp_i);
int rf_comm_mesh_rank(int dp, int tp, int pp, int dp_i, int tp_i, int pp_i);
/* Makes the three sub-groups of world (collective over world).
 * RF_ERR_INVALID, naming the sizes, when dp*tp*pp != world size. */
int rf_comm_mesh_init(rf_comm *world, int dp, int tp, int pp, rf_comm_mesh *m);
/* Destroys the three sub-groups (not the world). */
int rf_comm_mesh_destroy(rf_comm_mesh *m);

/* Rank r's range [lo, hi) of n elements split over world ranks in blocks of
 * ceil(n / world) (the last blocks may be short or empty), and that block
 * size: pad buffers to block*world elements for reduce-scatter/all-gather. */
size_t rf_comm_shard(size_t n, int world, int rank, size_t *lo, size_t *hi);

#ifdef __cplusplus
}
#endif

#endif
