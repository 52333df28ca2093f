/* Inside the communication layer: the backend table and the structures the
 * backends share with comm.c. Nothing outside services/comm/ includes this.
 *
 * A backend is a table of function pointers, like SQLite's sqlite3_vfs; every
 * slot returns RF_OK or a negative rf_err with rf_fail()'s detail. comm.c owns
 * everything common: argument checks, the request lifetime, the timeout loop
 * (it calls `test` until done or the deadline, then `abandon`), the broken
 * flag, and the blocking calls (start + wait). A backend only moves bytes. */
#ifndef RF_COMM_IMPL_H
#define RF_COMM_IMPL_H

#include "comm/comm.h"

typedef enum rf_comm_kind {
    RF_COMM_K_ALLREDUCE,
    RF_COMM_K_REDUCE_SCATTER,
    RF_COMM_K_ALLGATHER,
    RF_COMM_K_BROADCAST,
    RF_COMM_K_SEND,
    RF_COMM_K_RECV,
    RF_COMM_K_BARRIER,
    RF_COMM_K_SENDRECV,
} rf_comm_kind;

/* One operation, as the public call described it (checked by comm.c). */
typedef struct rf_comm_call {
    rf_comm_kind kind;
    const void *send;
    void *recv; /* broadcast, recv: the buffer */
    size_t count;
    rf_comm_dtype dtype;
    rf_comm_op op;
    int peer;      /* broadcast: root; send, recv, sendrecv: the rank sent to or received from */
    int peer2;     /* sendrecv: the rank received from */
    size_t count2; /* sendrecv: the elements received (count is those sent) */
} rf_comm_call;

typedef struct rf_comm_backend {
    const char *name;
    size_t req_size; /* bytes of backend state in each request (req->be) */
    /* Starts the operation. On error nothing is pending. */
    int (*start)(rf_comm *c, const rf_comm_call *call, rf_comm_req *req);
    /* Polls once without blocking: *done = 1 once complete (and finished:
     * averages divided, temporaries copied and freed). An error is a
     * transport failure. */
    int (*test)(rf_comm *c, rf_comm_req *req, int *done);
    /* The request timed out or failed: give up on it (NCCL aborts the
     * communicator so its kernels stop). Memory the transport may still write
     * into must not be freed here: hand it to rf_comm_keep(). */
    int (*abandon)(rf_comm *c, rf_comm_req *req);
    /* Makes the group of ranks with the same color (ordered by key, ties by
     * rank): sets out->impl, out->rank and out->world (comm.c has filled the
     * other fields). Collective over c, and bounded by c's timeout. */
    int (*split)(rf_comm *c, int color, int key, rf_comm *out);
    /* Frees impl. When c->sh->broken it must not call into the transport
     * (a dead peer would hang it); `finalize` is set for the world that
     * started the transport (MPI_Finalize) when the group is not broken. */
    int (*destroy)(rf_comm *c, int finalize);
    /* Optional (NULL: RF_ERR_UNSUPPORTED): rf_comm_order_after. */
    int (*order_after)(rf_comm *c, void *stream);
} rf_comm_backend;

/* State shared by a world and every group split from it. */
typedef struct rf_comm_shared {
    int refs;
    int broken;
    char why[512]; /* the failure that broke it */
    void **kept;   /* buffers of abandoned requests, freed with the world */
    size_t nkept;
} rf_comm_shared;

struct rf_comm {
    const rf_comm_backend *be;
    rf_comm_shared *sh;
    rf_comm_opts opts;
    int rank, world;
    int owns_transport; /* this world initialized MPI / NCCL */
    int ordered;        /* rf_comm_order_after gave it a stream */
    void *impl;         /* the backend's */
};

struct rf_comm_req {
    rf_comm *c;
    rf_comm_call call;
    int done;                        /* test reported completion, or failure */
    int err;                         /* the failure test reported (0: none) */
    int entered;                     /* the access hook's enter() ran for it */
    _Alignas(16) unsigned char be[]; /* backend->req_size bytes */
};

extern const rf_comm_backend rf_comm_self_backend;
extern const rf_comm_backend rf_comm_mpi_backend; /* comm_mpi.c, when built with MPI */

/* Allocates a communicator of backend be sharing sh (NULL: a new world's
 * shared state); the caller sets rank, world, impl. rf_comm_free releases
 * it without calling the backend. */
int rf_comm_alloc(const rf_comm_backend *be, const rf_comm_opts *o, rf_comm_shared *sh,
                  rf_comm **out);
void rf_comm_free(rf_comm *c);

/* Keeps p alive until the world is destroyed (see abandon). */
void rf_comm_keep(rf_comm *c, void *p);

/* comm_mpi.c: starts MPI (MPI_Init_thread unless already initialized) and
 * makes a world communicator for the MPI backend. */
int rf_comm_mpi_init(const rf_comm_opts *opts, rf_comm **out);

#ifdef REFINERY_CUDA
/* comm_nccl.c: the unique id (NCCL_UNIQUE_ID_BYTES = 128). */
#define RF_COMM_NCCL_ID_BYTES 128
int rf_comm_nccl_unique_id(unsigned char id[RF_COMM_NCCL_ID_BYTES]);
/* Makes a world NCCL communicator from an id every rank holds. local_rank < 0:
 * the device is rank % device count; RF_COMM_NCCL_CURRENT_DEVICE: the calling
 * thread's current CUDA device (rf_comm_dup_mem). */
#define RF_COMM_NCCL_CURRENT_DEVICE (-2)
int rf_comm_nccl_init(const rf_comm_opts *opts, const unsigned char id[RF_COMM_NCCL_ID_BYTES],
                      int rank, int world, int local_rank, rf_comm **out);
/* Attaches a communicator (the MPI world used to broadcast the id) to be
 * destroyed with the NCCL world. */
void rf_comm_nccl_attach(rf_comm *nccl_world, rf_comm *bootstrap);
#endif

#endif
