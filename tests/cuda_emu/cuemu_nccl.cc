// cuda_emu's NCCL. A communicator of one rank copies (collectives) or matches
// a send to oneself with the next receive from oneself. Under mpirun (MPI
// initialised by the code under test) a communicator of more ranks is an MPI
// communicator of the processes that joined it, each process standing for
// one GPU: "device" memory is host memory, so every operation is the MPI
// nonblocking operation on the same buffers, queued on its stream and
// completed when an event recorded after it is queried, or the stream is
// synchronised, as NCCL's kernels complete on the GPU. Joining: the unique id
// names its maker's world rank; the others send it their world rank, it
// answers with the members in order, and they create the communicator of
// that group (MPI_Comm_create_group: only the members take part).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#ifdef REFINERY_MPI
#define OMPI_SKIP_MPICXX  1 // the C API only (the C++ bindings warn)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#include "cuemu_int.h"

namespace {

struct pending_send {
    const void *buf;
    size_t count;
    ncclDataType_t type;
};

#ifdef REFINERY_MPI
// One queued operation: its MPI requests, then what completes it (Avg's
// division, a staging copy back, buffers to free).
struct op {
    uint64_t seq;
    cudaStream_t stream;
    std::vector<MPI_Request> reqs;
    void *avg_buf = nullptr; // divide count elements by n when done
    size_t avg_count = 0;
    ncclDataType_t avg_type = ncclFloat32;
    int avg_n = 1;
    void *tmp = nullptr; // a staging copy of an overlapping send buffer
};
std::deque<op> g_ops;
#endif
uint64_t g_seq = 0;
std::recursive_mutex g_mu;
int g_group = 0;
std::deque<std::pair<ncclComm_t, pending_send>> g_recvs; // self receives inside a group

} // namespace

struct cuemu_nccl {
    int rank = 0, nranks = 1;
#ifdef REFINERY_MPI
    MPI_Comm comm = MPI_COMM_NULL; // more than one rank
#endif
    std::deque<pending_send> sends; // one rank: sends to oneself not yet received
    std::string last;
};

namespace {

const uint32_t ID_MAGIC = 0x43554555u; // "CUEU"
struct id_body {
    uint32_t magic;
    int32_t world_rank; // the maker's
    uint64_t serial;    // the maker's count of ids
};
uint64_t g_serial = 0;

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

ncclResult_t fail(ncclComm_t c, const std::string &why) {
    if (c) c->last = why;
    std::fprintf(stderr, "cuda_emu nccl: %s\n", why.c_str());
    return ncclInvalidUsage;
}

ncclResult_t copy_local(ncclComm_t c, const void *send, void *recv, size_t count,
                        ncclDataType_t t) {
    if (count && (!send || !recv)) return fail(c, "NULL buffer");
    size_t n = count * type_size(t);
    cuemu_check_range(send, n, "nccl send buffer");
    cuemu_check_range(recv, n, "nccl receive buffer");
    if (n && send != recv) std::memmove(recv, send, n);
    return ncclSuccess;
}

ncclResult_t match_local(ncclComm_t c, void *recv, size_t count, ncclDataType_t t) {
    if (c->sends.empty()) return fail(c, "a receive from oneself with no send (would hang)");
    pending_send s = c->sends.front();
    c->sends.pop_front();
    if (s.count != count || s.type != t)
        return fail(c, "a receive from oneself whose count or type differs from its send");
    return copy_local(c, s.buf, recv, count, t);
}

#ifdef REFINERY_MPI
MPI_Datatype mpi_type(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
        return MPI_INT8_T;
    case ncclUint8:
        return MPI_UINT8_T;
    case ncclInt32:
        return MPI_INT32_T;
    case ncclUint32:
        return MPI_UINT32_T;
    case ncclInt64:
        return MPI_INT64_T;
    case ncclUint64:
        return MPI_UINT64_T;
    case ncclFloat32:
        return MPI_FLOAT;
    case ncclFloat64:
        return MPI_DOUBLE;
    default:
        return MPI_DATATYPE_NULL; // fp16, bf16: not used by Refinery's collectives
    }
}
MPI_Op mpi_op(ncclRedOp_t o) {
    switch (o) {
    case ncclSum:
    case ncclAvg:
        return MPI_SUM;
    case ncclProd:
        return MPI_PROD;
    case ncclMax:
        return MPI_MAX;
    default:
        return MPI_MIN;
    }
}

bool finish(op &o, bool wait) {
    int done = 1;
    if (!o.reqs.empty()) {
        if (wait)
            MPI_Waitall((int)o.reqs.size(), o.reqs.data(), MPI_STATUSES_IGNORE);
        else
            MPI_Testall((int)o.reqs.size(), o.reqs.data(), &done, MPI_STATUSES_IGNORE);
    }
    if (!done) return false;
    o.reqs.clear();
    if (o.avg_buf) {
        if (o.avg_type == ncclFloat32)
            for (size_t i = 0; i < o.avg_count; i++)
                ((float *)o.avg_buf)[i] /= (float)o.avg_n;
        else if (o.avg_type == ncclFloat64)
            for (size_t i = 0; i < o.avg_count; i++)
                ((double *)o.avg_buf)[i] /= (double)o.avg_n;
        o.avg_buf = nullptr;
    }
    std::free(o.tmp);
    o.tmp = nullptr;
    return true;
}

// Queues o on its stream. Outside a group, NCCL runs a stream's operations
// one after another: the ones before are completed first.
void enqueue(op &&o) {
    if (!g_group) cuemu_nccl_wait(o.stream, g_seq, true);
    o.seq = ++g_seq;
    g_ops.push_back(std::move(o));
}

// A staging copy of send when it overlaps recv's bytes (MPI forbids aliasing
// outside MPI_IN_PLACE, whose layouts are not NCCL's).
const void *unaliased(op &o, const void *send, size_t sbytes, const void *recv, size_t rbytes) {
    const char *s = (const char *)send, *r = (const char *)recv;
    if (s + sbytes <= r || r + rbytes <= s) return send;
    o.tmp = std::malloc(sbytes ? sbytes : 1);
    std::memcpy(o.tmp, send, sbytes);
    return o.tmp;
}

ncclResult_t mpi_rc(ncclComm_t c, int rc, const char *what) {
    if (rc == MPI_SUCCESS) return ncclSuccess;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return fail(c, std::string(what) + ": " + msg);
}

// The operation the MPI call (status rc) started as r: queued, or its error.
ncclResult_t queue(ncclComm_t c, op &&o, int rc, MPI_Request r, const char *what) {
    if (rc != MPI_SUCCESS) return mpi_rc(c, rc, what);
    o.reqs.push_back(r);
    enqueue(std::move(o));
    return ncclSuccess;
}
#endif

} // namespace

uint64_t cuemu_nccl_issued(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(g_mu);
#ifdef REFINERY_MPI
    for (auto it = g_ops.rbegin(); it != g_ops.rend(); ++it)
        if (it->stream == s) return it->seq;
#endif
    (void)s;
    return 0;
}

bool cuemu_nccl_wait(cudaStream_t s, uint64_t upto, bool wait) {
    std::lock_guard<std::recursive_mutex> g(g_mu);
    bool all = true;
#ifdef REFINERY_MPI
    for (op &o : g_ops) { // progress everything, in order; report s's up to upto
        bool mine = (!s || o.stream == s) && o.seq <= upto;
        if (!finish(o, wait && mine) && mine) all = false;
    }
    while (!g_ops.empty() && g_ops.front().reqs.empty() && !g_ops.front().tmp)
        g_ops.pop_front();
#else
    (void)s;
    (void)upto;
    (void)wait;
#endif
    return all;
}

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : r == ncclInvalidUsage ? "invalid usage" : "error";
}
const char *ncclGetLastError(ncclComm_t comm) {
    return comm ? comm->last.c_str() : "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    std::memset(id, 0, sizeof *id);
    id_body b = {ID_MAGIC, 0, ++g_serial};
#ifdef REFINERY_MPI
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &b.world_rank);
#endif
    std::memcpy(id->internal, &b, sizeof b);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    (void)config;
    *comm = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    if (nranks == 1) {
        *comm = new cuemu_nccl();
        return ncclSuccess;
    }
#ifdef REFINERY_MPI
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) return fail(nullptr, "more than one rank needs mpirun (MPI) under the emulator");
    id_body b;
    std::memcpy(&b, id.internal, sizeof b);
    if (b.magic != ID_MAGIC) return fail(nullptr, "not an id of ncclGetUniqueId");
    int me = 0, rc;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    // tags 30000-31999: the maker's serial; the comm layer uses its own duplicates of the world
    int tag = 30000 + (int)(b.serial % 2000);
    std::vector<int> members(nranks);
    if (rank == 0) {
        if (me != b.world_rank) return fail(nullptr, "rank 0 is not the id's maker");
        members[0] = me;
        for (int i = 1; i < nranks; i++) {
            int msg[3];
            rc = MPI_Recv(msg, 3, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) return mpi_rc(nullptr, rc, "joining (receive)");
            if (msg[2] != (int)b.serial || msg[0] < 1 || msg[0] >= nranks)
                return fail(nullptr, "joining: a message of another id");
            members[msg[0]] = msg[1];
        }
        for (int i = 1; i < nranks; i++)
            if ((rc = MPI_Send(members.data(), nranks, MPI_INT, members[i], tag, MPI_COMM_WORLD)))
                return mpi_rc(nullptr, rc, "joining (send)");
    } else {
        int msg[3] = {rank, me, (int)b.serial};
        if ((rc = MPI_Send(msg, 3, MPI_INT, b.world_rank, tag, MPI_COMM_WORLD)) ||
            (rc = MPI_Recv(members.data(), nranks, MPI_INT, b.world_rank, tag, MPI_COMM_WORLD,
                           MPI_STATUS_IGNORE)))
            return mpi_rc(nullptr, rc, "joining");
    }
    MPI_Group world, grp;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, nranks, members.data(), &grp);
    cuemu_nccl *c = new cuemu_nccl();
    c->rank = rank;
    c->nranks = nranks;
    rc = MPI_Comm_create_group(MPI_COMM_WORLD, grp, tag, &c->comm);
    MPI_Group_free(&grp);
    MPI_Group_free(&world);
    if (rc != MPI_SUCCESS) {
        delete c;
        return mpi_rc(nullptr, rc, "MPI_Comm_create_group");
    }
    *comm = c;
    return ncclSuccess;
#else
    (void)id;
    return fail(nullptr, "more than one rank needs an MPI build of the emulator");
#endif
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
    (void)config;
    *newcomm = nullptr;
    if (!comm) return ncclInvalidArgument;
    if (comm->nranks == 1) {
        if (color != NCCL_SPLIT_NOCOLOR) *newcomm = new cuemu_nccl();
        return ncclSuccess;
    }
#ifdef REFINERY_MPI
    MPI_Comm nc = MPI_COMM_NULL;
    int rc =
        MPI_Comm_split(comm->comm, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &nc);
    if (rc != MPI_SUCCESS) return mpi_rc(comm, rc, "MPI_Comm_split");
    if (nc == MPI_COMM_NULL) return ncclSuccess;
    cuemu_nccl *c = new cuemu_nccl();
    MPI_Comm_rank(nc, &c->rank);
    MPI_Comm_size(nc, &c->nranks);
    c->comm = nc;
    *newcomm = c;
    return ncclSuccess;
#else
    (void)key;
    return ncclInternalError;
#endif
}

static void release(ncclComm_t comm) {
#ifdef REFINERY_MPI
    if (comm->comm != MPI_COMM_NULL) MPI_Comm_free(&comm->comm);
#endif
    delete comm;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    cuemu_nccl_wait(nullptr, UINT64_MAX, true);
    return comm->sends.empty() ? ncclSuccess : fail(comm, "finalized with a send never received");
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm) release(comm);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (comm) release(comm); // pending MPI requests are left to MPI
    return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
    if (!comm) return ncclInvalidArgument;
    *state = ncclSuccess;
    return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t opn, ncclComm_t comm, cudaStream_t s) {
    if (!comm) return ncclInvalidArgument;
    std::lock_guard<std::recursive_mutex> g(g_mu);
    if (comm->nranks == 1) return copy_local(comm, send, recv, count, t);
#ifdef REFINERY_MPI
    size_t n = count * type_size(t);
    cuemu_check_range(send, n, "nccl send buffer");
    cuemu_check_range(recv, n, "nccl receive buffer");
    op o;
    o.stream = s;
    const void *src = send == recv ? send : unaliased(o, send, n, recv, n);
    MPI_Request r;
    int rc = send == recv
                 ? MPI_Iallreduce(MPI_IN_PLACE, recv, (int)count, mpi_type(t), mpi_op(opn),
                                  comm->comm, &r)
                 : MPI_Iallreduce(src, recv, (int)count, mpi_type(t), mpi_op(opn), comm->comm, &r);
    if (opn == ncclAvg)
        o.avg_buf = recv, o.avg_count = count, o.avg_type = t, o.avg_n = comm->nranks;
    return queue(comm, std::move(o), rc, r, "allreduce");
#else
    (void)s;
    return fail(comm, "more than one rank needs an MPI build of the emulator");
#endif
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t opn, ncclComm_t comm, cudaStream_t s) {
    if (!comm) return ncclInvalidArgument;
    std::lock_guard<std::recursive_mutex> g(g_mu);
    if (comm->nranks == 1) return copy_local(comm, send, recv, count, t);
#ifdef REFINERY_MPI
    size_t es = type_size(t), sb = count * es * comm->nranks;
    cuemu_check_range(send, sb, "nccl send buffer");
    cuemu_check_range(recv, count * es, "nccl receive buffer");
    op o;
    o.stream = s;
    const void *src = unaliased(o, send, sb, recv, count * es);
    MPI_Request r;
    int rc =
        MPI_Ireduce_scatter_block(src, recv, (int)count, mpi_type(t), mpi_op(opn), comm->comm, &r);
    if (opn == ncclAvg)
        o.avg_buf = recv, o.avg_count = count, o.avg_type = t, o.avg_n = comm->nranks;
    return queue(comm, std::move(o), rc, r, "reduce-scatter");
#else
    (void)s;
    return fail(comm, "more than one rank needs an MPI build of the emulator");
#endif
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t s) {
    if (!comm) return ncclInvalidArgument;
    std::lock_guard<std::recursive_mutex> g(g_mu);
    if (comm->nranks == 1) return copy_local(comm, send, recv, count, t);
#ifdef REFINERY_MPI
    size_t es = type_size(t), rb = count * es * comm->nranks;
    cuemu_check_range(send, count * es, "nccl send buffer");
    cuemu_check_range(recv, rb, "nccl receive buffer");
    op o;
    o.stream = s;
    const void *src = unaliased(o, send, count * es, recv, rb);
    MPI_Request r;
    int rc =
        MPI_Iallgather(src, (int)count, mpi_type(t), recv, (int)count, mpi_type(t), comm->comm, &r);
    return queue(comm, std::move(o), rc, r, "all-gather");
#else
    (void)s;
    return fail(comm, "more than one rank needs an MPI build of the emulator");
#endif
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t s) {
    if (!comm) return ncclInvalidArgument;
    std::lock_guard<std::recursive_mutex> g(g_mu);
    if (root < 0 || root >= comm->nranks)
        return fail(comm, "broadcast from a rank that does not exist");
    if (comm->nranks == 1) return copy_local(comm, send, recv, count, t);
#ifdef REFINERY_MPI
    size_t n = count * type_size(t);
    cuemu_check_range(recv, n, "nccl receive buffer");
    if (comm->rank == root && send != recv) std::memmove(recv, send, n);
    op o;
    o.stream = s;
    MPI_Request r;
    int rc = MPI_Ibcast(recv, (int)count, mpi_type(t), root, comm->comm, &r);
    return queue(comm, std::move(o), rc, r, "broadcast");
#else
    (void)s;
    return fail(comm, "more than one rank needs an MPI build of the emulator");
#endif
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s) {
    if (!comm) return ncclInvalidArgument;
    std::lock_guard<std::recursive_mutex> g(g_mu);
    if (peer < 0 || peer >= comm->nranks) return fail(comm, "send to a rank that does not exist");
    if (comm->nranks == 1) {
        comm->sends.push_back({send, count, t});
        return ncclSuccess;
    }
#ifdef REFINERY_MPI
    cuemu_check_range(send, count * type_size(t), "nccl send buffer");
    op o;
    o.stream = s;
    MPI_Request r;
    int rc = MPI_Isend(send, (int)count, mpi_type(t), peer, 1, comm->comm, &r);
    return queue(comm, std::move(o), rc, r, "send");
#else
    (void)s;
    return fail(comm, "more than one rank needs an MPI build of the emulator");
#endif
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s) {
    if (!comm) return ncclInvalidArgument;
    std::lock_guard<std::recursive_mutex> g(g_mu);
    if (peer < 0 || peer >= comm->nranks)
        return fail(comm, "receive from a rank that does not exist");
    if (comm->nranks == 1) {
        if (g_group) { // matched at ncclGroupEnd, when the group's sends are all posted
            g_recvs.push_back({comm, {recv, count, t}});
            return ncclSuccess;
        }
        return match_local(comm, recv, count, t);
    }
#ifdef REFINERY_MPI
    cuemu_check_range(recv, count * type_size(t), "nccl receive buffer");
    op o;
    o.stream = s;
    MPI_Request r;
    // a message longer than count is an MPI error at completion (MPI_ERR_TRUNCATE), as NCCL's
    int rc = MPI_Irecv(recv, (int)count, mpi_type(t), peer, 1, comm->comm, &r);
    return queue(comm, std::move(o), rc, r, "receive");
#else
    (void)s;
    return fail(comm, "more than one rank needs an MPI build of the emulator");
#endif
}

ncclResult_t ncclGroupStart(void) {
    std::lock_guard<std::recursive_mutex> g(g_mu);
    g_group++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    std::lock_guard<std::recursive_mutex> g(g_mu);
    if (!g_group) return ncclInvalidUsage;
    if (--g_group) return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    while (!g_recvs.empty()) {
        auto q = g_recvs.front();
        g_recvs.pop_front();
        ncclResult_t m = match_local(q.first, (void *)q.second.buf, q.second.count, q.second.type);
        if (m && !r) r = m;
    }
    return r;
}

} // extern "C"
