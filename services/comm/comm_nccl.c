/* The NCCL backend for device tensors (CUDA=1 builds only).
 *
 * Every communicator is created non-blocking (ncclConfig_t.blocking = 0, NCCL
 * >= 2.14), so no NCCL call can hang the host: an init, split or enqueue that
 * answers ncclInProgress is polled with ncclCommGetAsyncError until it settles
 * or its deadline passes. Operations run on the communicator's own stream;
 * each request records a CUDA event after its operation, and comm.c's wait
 * polls cudaEventQuery and ncclCommGetAsyncError. On a timeout or an async
 * error the communicator is aborted (ncclCommAbort), which stops its kernels,
 * and the group is broken (comm.h).
 *
 * The caller's compute stream is not synchronised with ours: buffers must be
 * ready when an operation is started (synchronise the compute stream, or
 * record an event on it and make this stream wait, before calling), and the
 * result is ready on the host's view once rf_comm_wait returns.
 *
 * Compiled by gcc against the CUDA runtime and NCCL headers; it runs only on a
 * machine with GPUs. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "common/error.h"
#include "common/sys.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "comm_nccl.c needs NCCL >= 2.14 (non-blocking communicators, ncclCommSplit)"
#endif

_Static_assert(sizeof(ncclUniqueId) == RF_COMM_NCCL_ID_BYTES, "NCCL unique id size");

typedef struct nccl_impl {
    ncclComm_t comm; /* NULL once aborted */
    cudaStream_t stream;
    int device;
    float *scratch;       /* one device float: the barrier's all-reduce */
    rf_comm *bootstrap;   /* the MPI world that carried the id, destroyed with us */
    cudaStream_t after;   /* rf_comm_order_after's stream (NULL: none) */
    cudaEvent_t after_ev; /* recorded on it before each operation */
} nccl_impl;

typedef struct nccl_req {
    cudaEvent_t ev;
    int has_ev;
} nccl_req;

static int cuda_fail(cudaError_t e, const char *what) {
    return rf_fail(RF_ERR_IO, "%s: %s", what, cudaGetErrorString(e));
}

static int nccl_fail(ncclResult_t r, ncclComm_t comm, const char *what) {
    const char *last = comm ? ncclGetLastError(comm) : NULL;
    return rf_fail(RF_ERR_IO, "%s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "",
                   last ? last : "");
}

static void nap(void) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}

/* Polls a non-blocking communicator until its pending call settles. */
static int settle(ncclComm_t comm, double timeout_s, const char *what) {
    double deadline = rf_now() + timeout_s;
    for (;;) {
        ncclResult_t st = ncclSuccess, r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess) return nccl_fail(r, comm, "ncclCommGetAsyncError");
        if (st == ncclSuccess) return RF_OK;
        if (st != ncclInProgress) return nccl_fail(st, comm, what);
        if (rf_now() > deadline)
            return rf_fail(RF_ERR_IO, "timeout: %s did not complete in %.1f s", what, timeout_s);
        nap();
    }
}

/* An NCCL call's result: settled when in progress. */
static int check(ncclResult_t r, ncclComm_t comm, double timeout_s, const char *what) {
    if (r == ncclInProgress) return settle(comm, timeout_s, what);
    return r == ncclSuccess ? RF_OK : nccl_fail(r, comm, what);
}

static ncclDataType_t ntype(rf_comm_dtype t) {
    switch (t) {
    case RF_COMM_F32:
        return ncclFloat32;
    case RF_COMM_F64:
        return ncclFloat64;
    case RF_COMM_I32:
        return ncclInt32;
    case RF_COMM_I64:
        return ncclInt64;
    case RF_COMM_U8:
        return ncclUint8;
    }
    return ncclFloat32;
}

static ncclRedOp_t nop(rf_comm_op op) {
    switch (op) {
    case RF_COMM_SUM:
        return ncclSum;
    case RF_COMM_AVG:
        return ncclAvg;
    case RF_COMM_MAX:
        return ncclMax;
    case RF_COMM_MIN:
        return ncclMin;
    }
    return ncclSum;
}

static int nccl_start(rf_comm *c, const rf_comm_call *k, rf_comm_req *req) {
    nccl_impl *m = c->impl;
    nccl_req *q = (nccl_req *)req->be;
    if (!m->comm) return rf_fail(RF_ERR_IO, "the NCCL communicator was aborted");
    cudaError_t ce = cudaSetDevice(m->device);
    if (ce != cudaSuccess) return cuda_fail(ce, "cudaSetDevice");
    if (m->after && ((ce = cudaEventRecord(m->after_ev, m->after)) != cudaSuccess ||
                     (ce = cudaStreamWaitEvent(m->stream, m->after_ev, 0)) != cudaSuccess))
        return cuda_fail(ce, "ordering after the caller's stream");
    ncclDataType_t t = ntype(k->dtype);
    ncclResult_t r = ncclSuccess;
    const char *what = "NCCL";
    switch (k->kind) {
    case RF_COMM_K_ALLREDUCE:
        what = "ncclAllReduce";
        r = ncclAllReduce(k->send, k->recv, k->count, t, nop(k->op), m->comm, m->stream);
        break;
    case RF_COMM_K_REDUCE_SCATTER:
        what = "ncclReduceScatter";
        r = ncclReduceScatter(k->send, k->recv, k->count, t, nop(k->op), m->comm, m->stream);
        break;
    case RF_COMM_K_ALLGATHER:
        what = "ncclAllGather";
        r = ncclAllGather(k->send, k->recv, k->count, t, m->comm, m->stream);
        break;
    case RF_COMM_K_BROADCAST:
        what = "ncclBroadcast";
        r = ncclBroadcast(k->recv, k->recv, k->count, t, k->peer, m->comm, m->stream);
        break;
    case RF_COMM_K_SEND:
        what = "ncclSend";
        r = ncclSend(k->send, k->count, t, k->peer, m->comm, m->stream);
        break;
    case RF_COMM_K_RECV:
        what = "ncclRecv";
        r = ncclRecv(k->recv, k->count, t, k->peer, m->comm, m->stream);
        break;
    case RF_COMM_K_SENDRECV: {
        /* Grouped, so that a ring's sends and receives progress together. */
        what = "ncclSend/ncclRecv";
        r = ncclGroupStart();
        if (r == ncclSuccess) {
            ncclResult_t a = ncclSend(k->send, k->count, t, k->peer, m->comm, m->stream);
            ncclResult_t b = ncclRecv(k->recv, k->count2, t, k->peer2, m->comm, m->stream);
            r = ncclGroupEnd();
            if (a != ncclSuccess && a != ncclInProgress) r = a;
            if (b != ncclSuccess && b != ncclInProgress) r = b;
        }
        break;
    }
    case RF_COMM_K_BARRIER:
        what = "barrier (ncclAllReduce)";
        r = ncclAllReduce(m->scratch, m->scratch, 1, ncclFloat32, ncclSum, m->comm, m->stream);
        break;
    }
    int rc = check(r, m->comm, c->opts.timeout_s, what);
    if (rc) return rc;
    if ((ce = cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming)) != cudaSuccess)
        return cuda_fail(ce, "cudaEventCreate");
    q->has_ev = 1;
    if ((ce = cudaEventRecord(q->ev, m->stream)) != cudaSuccess) {
        cudaEventDestroy(q->ev);
        q->has_ev = 0;
        return cuda_fail(ce, "cudaEventRecord");
    }
    return RF_OK;
}

static void drop_event(nccl_req *q) {
    if (q->has_ev) cudaEventDestroy(q->ev);
    q->has_ev = 0;
}

static int nccl_test(rf_comm *c, rf_comm_req *req, int *done) {
    nccl_impl *m = c->impl;
    nccl_req *q = (nccl_req *)req->be;
    cudaError_t ce = cudaEventQuery(q->ev);
    if (ce == cudaSuccess) {
        drop_event(q);
        *done = 1;
        return RF_OK;
    }
    if (ce != cudaErrorNotReady) return cuda_fail(ce, "cudaEventQuery");
    /* Still running: a peer that died shows up here as an async error. */
    ncclResult_t st = ncclSuccess, r = ncclCommGetAsyncError(m->comm, &st);
    if (r != ncclSuccess) return nccl_fail(r, m->comm, "ncclCommGetAsyncError");
    if (st != ncclSuccess && st != ncclInProgress) return nccl_fail(st, m->comm, "NCCL");
    return RF_OK;
}

static int nccl_abandon(rf_comm *c, rf_comm_req *req) {
    nccl_impl *m = c->impl;
    drop_event((nccl_req *)req->be);
    if (m->comm) {
        /* Stops the kernels waiting for the dead peer; the communicator is
         * gone afterwards (and the group broken). */
        ncclCommAbort(m->comm);
        m->comm = NULL;
    }
    return RF_OK;
}

static ncclConfig_t config(void) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

static int make_impl(rf_comm *out, int device, nccl_impl **mp) {
    nccl_impl *m = calloc(1, sizeof *m);
    if (!m) return rf_fail(RF_ERR_NOMEM, "out of memory");
    m->device = device;
    cudaError_t ce = cudaSetDevice(device);
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess) ce = cudaMalloc((void **)&m->scratch, sizeof(float));
    if (ce == cudaSuccess) ce = cudaMemset(m->scratch, 0, sizeof(float));
    if (ce != cudaSuccess) {
        if (m->stream) cudaStreamDestroy(m->stream);
        if (m->scratch) cudaFree(m->scratch);
        free(m);
        return cuda_fail(ce, "setting up the NCCL stream");
    }
    out->impl = m;
    *mp = m;
    return RF_OK;
}

static void free_impl(nccl_impl *m) {
    if (!m) return;
    if (m->after_ev) cudaEventDestroy(m->after_ev);
    if (m->scratch) cudaFree(m->scratch);
    if (m->stream) cudaStreamDestroy(m->stream);
    free(m);
}

static int nccl_split(rf_comm *c, int color, int key, rf_comm *out) {
    nccl_impl *m = c->impl, *g;
    if (!m->comm) return rf_fail(RF_ERR_IO, "the NCCL communicator was aborted");
    int rc = make_impl(out, m->device, &g);
    if (rc) return rc;
    ncclConfig_t cfg = config();
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommSplit(m->comm, color, key, &nc, &cfg);
    /* The new communicator settles as its own non-blocking init. */
    rc = r == ncclSuccess || r == ncclInProgress ? RF_OK : nccl_fail(r, m->comm, "ncclCommSplit");
    if (rc == RF_OK && nc) rc = settle(nc, c->opts.timeout_s, "ncclCommSplit");
    if (rc == RF_OK) rc = settle(m->comm, c->opts.timeout_s, "ncclCommSplit (parent)");
    if (rc == RF_OK && !nc) rc = rf_fail(RF_ERR_IO, "ncclCommSplit gave no communicator");
    if (rc == RF_OK) {
        r = ncclCommUserRank(nc, &out->rank);
        if (r == ncclSuccess) r = ncclCommCount(nc, &out->world);
        if (r != ncclSuccess) rc = nccl_fail(r, nc, "ncclCommUserRank");
    }
    if (rc) {
        if (nc) ncclCommAbort(nc);
        free_impl(g);
        out->impl = NULL;
        return rc;
    }
    g->comm = nc;
    return RF_OK;
}

static int nccl_order_after(rf_comm *c, void *stream) {
    nccl_impl *m = c->impl;
    cudaError_t ce = cudaSetDevice(m->device);
    if (ce == cudaSuccess && !m->after_ev)
        ce = cudaEventCreateWithFlags(&m->after_ev, cudaEventDisableTiming);
    if (ce != cudaSuccess) return cuda_fail(ce, "cudaEventCreate");
    m->after = (cudaStream_t)stream;
    return RF_OK;
}

static int nccl_destroy(rf_comm *c, int finalize) {
    nccl_impl *m = c->impl;
    int rc = RF_OK;
    if (!m) return RF_OK;
    if (m->comm) {
        if (c->sh->broken) {
            ncclCommAbort(m->comm); /* never wait on a dead peer */
        } else {
            /* Flushes pending work (bounded), then frees. */
            rc = check(ncclCommFinalize(m->comm), m->comm, c->opts.timeout_s, "ncclCommFinalize");
            if (rc == RF_OK) {
                ncclResult_t r = ncclCommDestroy(m->comm);
                if (r != ncclSuccess && r != ncclInProgress)
                    rc = nccl_fail(r, NULL, "ncclCommDestroy");
            } else {
                ncclCommAbort(m->comm);
            }
        }
        m->comm = NULL;
    }
    if (m->bootstrap) {
        if (c->sh->broken) m->bootstrap->sh->broken = 1; /* no MPI_Finalize with a dead peer */
        int b = rf_comm_destroy(m->bootstrap);
        if (rc == RF_OK) rc = b;
    }
    free_impl(m);
    c->impl = NULL;
    return rc;
}

const rf_comm_backend rf_comm_nccl_backend = {
    .name = "nccl",
    .req_size = sizeof(nccl_req),
    .start = nccl_start,
    .test = nccl_test,
    .abandon = nccl_abandon,
    .split = nccl_split,
    .destroy = nccl_destroy,
    .order_after = nccl_order_after,
};

int rf_comm_nccl_unique_id(unsigned char id[RF_COMM_NCCL_ID_BYTES]) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_fail(r, NULL, "ncclGetUniqueId");
    memcpy(id, u.internal, RF_COMM_NCCL_ID_BYTES);
    return RF_OK;
}

int rf_comm_nccl_init(const rf_comm_opts *opts, const unsigned char id[RF_COMM_NCCL_ID_BYTES],
                      int rank, int world, int local_rank, rf_comm **out) {
    *out = NULL;
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess) return cuda_fail(ce, "comm (nccl): cudaGetDeviceCount");
    if (ndev < 1) return rf_fail(RF_ERR_UNSUPPORTED, "comm (nccl): no CUDA device");
    int device = (local_rank >= 0 ? local_rank : rank) % ndev;
    if (local_rank == RF_COMM_NCCL_CURRENT_DEVICE && (ce = cudaGetDevice(&device)) != cudaSuccess)
        return cuda_fail(ce, "comm (nccl): cudaGetDevice");
    rf_comm *c;
    int rc = rf_comm_alloc(&rf_comm_nccl_backend, opts, NULL, &c);
    if (rc) return rc;
    nccl_impl *m;
    if ((rc = make_impl(c, device, &m))) {
        rf_comm_free(c);
        return rc;
    }
    ncclUniqueId u;
    memcpy(u.internal, id, RF_COMM_NCCL_ID_BYTES);
    ncclConfig_t cfg = config();
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&nc, world, u, rank, &cfg);
    rc = r == ncclSuccess || r == ncclInProgress ? RF_OK
                                                 : nccl_fail(r, nc, "ncclCommInitRankConfig");
    /* Every rank must arrive: bounded like a collective. */
    if (rc == RF_OK) rc = settle(nc, opts->timeout_s, "ncclCommInitRankConfig");
    if (rc) {
        if (nc) ncclCommAbort(nc);
        free_impl(m);
        c->impl = NULL;
        rf_comm_free(c);
        return rf_fail_ctx(rc, "comm (nccl): rank %d of %d on device %d", rank, world, device);
    }
    m->comm = nc;
    c->rank = rank, c->world = world, c->owns_transport = 1;
    *out = c;
    return RF_OK;
}

void rf_comm_nccl_attach(rf_comm *nccl_world, rf_comm *bootstrap) {
    ((nccl_impl *)nccl_world->impl)->bootstrap = bootstrap;
}
