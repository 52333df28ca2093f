/* The MPI backend (OpenMPI) for host tensors. Every operation is a
 * nonblocking MPI call (MPI_Iallreduce, ...) that comm.c polls with MPI_Test
 * until done or its deadline, so a dead or silent peer cannot hang a rank.
 * Errors are returned, not fatal (MPI_ERRORS_RETURN on every communicator).
 *
 * What MPI lacks is done here: the average is a sum divided on completion,
 * and NCCL's in-place reduce-scatter (recv inside send at block `rank`)
 * reduces into a temporary that is copied on completion. Counts are ints in
 * MPI: more than INT_MAX elements in one call is RF_ERR_RANGE. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "common/error.h"
#include "common/sys.h"

#define TAG 7127

typedef struct mpi_impl {
    MPI_Comm comm;
} mpi_impl;

typedef struct mpi_req {
    MPI_Request r;
    MPI_Request r2; /* sendrecv: the receive (r is the send) */
    void *tmp;      /* reduce-scatter in place: the result before its copy to dst */
    void *dst;      /* where the result belongs */
    size_t n;       /* its elements */
    int average;    /* divide by the world size on completion */
} mpi_req;

static int initialized_here; /* MPI_Init_thread was ours: MPI_Finalize is too */

static int mpi_fail(int code, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(code, s, &n) != MPI_SUCCESS) n = 0;
    s[n] = 0;
    return rf_fail(RF_ERR_IO, "%s: %s", what, n ? s : "MPI error");
}

static MPI_Datatype mtype(rf_comm_dtype t) {
    switch (t) {
    case RF_COMM_F32:
        return MPI_FLOAT;
    case RF_COMM_F64:
        return MPI_DOUBLE;
    case RF_COMM_I32:
        return MPI_INT32_T;
    case RF_COMM_I64:
        return MPI_INT64_T;
    case RF_COMM_U8:
        return MPI_UINT8_T;
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Op mop(rf_comm_op op) {
    switch (op) {
    case RF_COMM_SUM:
    case RF_COMM_AVG:
        return MPI_SUM;
    case RF_COMM_MAX:
        return MPI_MAX;
    case RF_COMM_MIN:
        return MPI_MIN;
    }
    return MPI_OP_NULL;
}

/* A point-to-point send: synchronous under opts.sync_send (comm.h). */
static int isend(rf_comm *c, const void *buf, int n, MPI_Datatype t, int peer, MPI_Request *r) {
    mpi_impl *m = c->impl;
    return c->opts.sync_send ? MPI_Issend(buf, n, t, peer, TAG, m->comm, r)
                             : MPI_Isend(buf, n, t, peer, TAG, m->comm, r);
}

static int mpi_start(rf_comm *c, const rf_comm_call *k, rf_comm_req *req) {
    mpi_impl *m = c->impl;
    mpi_req *q = (mpi_req *)req->be;
    if (k->count > INT_MAX)
        return rf_fail(RF_ERR_RANGE, "%zu elements: MPI takes at most %d per call", k->count,
                       INT_MAX);
    int n = (int)k->count, rc = MPI_SUCCESS;
    size_t esz = rf_comm_dtype_size(k->dtype);
    MPI_Datatype t = mtype(k->dtype);
    q->average = k->op == RF_COMM_AVG && c->world > 1 &&
                 (k->kind == RF_COMM_K_ALLREDUCE || k->kind == RF_COMM_K_REDUCE_SCATTER);
    q->dst = k->recv, q->n = k->count;
    switch (k->kind) {
    case RF_COMM_K_ALLREDUCE:
        rc = MPI_Iallreduce(k->send == k->recv ? MPI_IN_PLACE : k->send, k->recv, n, t, mop(k->op),
                            m->comm, &q->r);
        break;
    case RF_COMM_K_REDUCE_SCATTER: {
        void *out = k->recv;
        if ((const char *)k->send + (size_t)c->rank * k->count * esz == (char *)k->recv &&
            k->count > 0) {
            if (!(q->tmp = malloc(k->count * esz))) return rf_fail(RF_ERR_NOMEM, "out of memory");
            out = q->tmp;
        }
        rc = MPI_Ireduce_scatter_block(k->send, out, n, t, mop(k->op), m->comm, &q->r);
        break;
    }
    case RF_COMM_K_ALLGATHER: {
        int in_place = (const char *)k->recv + (size_t)c->rank * k->count * esz == k->send;
        rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : k->send, n, t, k->recv, n, t, m->comm, &q->r);
        break;
    }
    case RF_COMM_K_BROADCAST:
        rc = MPI_Ibcast(k->recv, n, t, k->peer, m->comm, &q->r);
        break;
    case RF_COMM_K_SEND:
        rc = isend(c, k->send, n, t, k->peer, &q->r);
        break;
    case RF_COMM_K_RECV:
        rc = MPI_Irecv(k->recv, n, t, k->peer, TAG, m->comm, &q->r);
        break;
    case RF_COMM_K_BARRIER:
        rc = MPI_Ibarrier(m->comm, &q->r);
        break;
    case RF_COMM_K_SENDRECV:
        if (k->count2 > INT_MAX)
            return rf_fail(RF_ERR_RANGE, "%zu elements: MPI takes at most %d per call", k->count2,
                           INT_MAX);
        rc = MPI_Irecv(k->recv, (int)k->count2, t, k->peer2, TAG, m->comm, &q->r2);
        if (rc == MPI_SUCCESS) rc = isend(c, k->send, n, t, k->peer, &q->r);
        break;
    }
    if (rc != MPI_SUCCESS) {
        free(q->tmp);
        q->tmp = NULL;
        return mpi_fail(rc, "MPI");
    }
    return RF_OK;
}

static void divide(void *p, size_t n, rf_comm_dtype t, int world) {
    if (t == RF_COMM_F32) {
        float *f = p, s = 1.0f / (float)world;
        for (size_t i = 0; i < n; i++)
            f[i] *= s;
    } else if (t == RF_COMM_F64) {
        double *d = p, s = 1.0 / world;
        for (size_t i = 0; i < n; i++)
            d[i] *= s;
    }
}

static int mpi_test(rf_comm *c, rf_comm_req *req, int *done) {
    mpi_req *q = (mpi_req *)req->be;
    MPI_Status st;
    int flag = 0, rc;
    if (req->call.kind == RF_COMM_K_SENDRECV) {
        MPI_Request both[2] = {q->r, q->r2};
        MPI_Status sts[2];
        rc = MPI_Testall(2, both, &flag, sts);
        q->r = both[0], q->r2 = both[1];
        st = sts[1];
    } else {
        rc = MPI_Test(&q->r, &flag, &st);
    }
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Test");
    if (!flag) return RF_OK;
    *done = 1;
    void *res = q->tmp ? q->tmp : q->dst;
    if (q->average) divide(res, q->n, req->call.dtype, c->world);
    if (q->tmp) {
        memcpy(q->dst, q->tmp, q->n * rf_comm_dtype_size(req->call.dtype));
        free(q->tmp);
        q->tmp = NULL;
    }
    if (req->call.kind == RF_COMM_K_RECV || req->call.kind == RF_COMM_K_SENDRECV) {
        int got = 0;
        MPI_Get_count(&st, mtype(req->call.dtype), &got);
        size_t want = req->call.kind == RF_COMM_K_SENDRECV ? req->call.count2 : req->call.count;
        if ((size_t)got != want)
            return rf_fail(RF_ERR_INVALID, "received %d elements, expected %zu", got, want);
    }
    return RF_OK;
}

static int mpi_abandon(rf_comm *c, rf_comm_req *req) {
    mpi_req *q = (mpi_req *)req->be;
    /* A collective cannot be cancelled; MPI may still write the temporary. */
    rf_comm_keep(c, q->tmp);
    q->tmp = NULL;
    return RF_OK;
}

/* Polls one request until done or the deadline (for set-up steps, outside
 * comm.c's request machinery). */
static int wait_raw(MPI_Request *r, double timeout_s, const char *what) {
    double deadline = rf_now() + timeout_s;
    for (;;) {
        int flag = 0, rc = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, what);
        if (flag) return RF_OK;
        if (rf_now() > deadline)
            return rf_fail(RF_ERR_IO, "timeout: %s did not complete in %.1f s", what, timeout_s);
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

static int make_impl(MPI_Comm from, double timeout_s, rf_comm *out) {
    mpi_impl *m = calloc(1, sizeof *m);
    if (!m) return rf_fail(RF_ERR_NOMEM, "out of memory");
    MPI_Request r;
    int rc = MPI_Comm_idup(from, &m->comm, &r);
    if (rc != MPI_SUCCESS) {
        free(m);
        return mpi_fail(rc, "MPI_Comm_idup");
    }
    if ((rc = wait_raw(&r, timeout_s, "MPI_Comm_idup"))) {
        free(m); /* the duplicate may still complete: leave it to MPI */
        return rc;
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &out->rank);
    MPI_Comm_size(m->comm, &out->world);
    out->impl = m;
    return RF_OK;
}

static int mpi_split(rf_comm *c, int color, int key, rf_comm *out) {
    mpi_impl *m = c->impl;
    /* MPI_Comm_split blocks; a timed barrier first makes sure every rank is
     * alive and has reached the split. */
    int rc = rf_comm_barrier(c);
    if (rc) return rc;
    MPI_Comm nc;
    int mr = MPI_Comm_split(m->comm, color, key, &nc);
    if (mr != MPI_SUCCESS) return mpi_fail(mr, "MPI_Comm_split");
    mpi_impl *g = calloc(1, sizeof *g);
    if (!g) {
        MPI_Comm_free(&nc);
        return rf_fail(RF_ERR_NOMEM, "out of memory");
    }
    g->comm = nc;
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(nc, &out->rank);
    MPI_Comm_size(nc, &out->world);
    out->impl = g;
    return RF_OK;
}

static int mpi_destroy(rf_comm *c, int finalize) {
    mpi_impl *m = c->impl;
    int rc = RF_OK;
    if (m && !c->sh->broken) {
        int mr = MPI_Comm_free(&m->comm);
        if (mr != MPI_SUCCESS) rc = mpi_fail(mr, "MPI_Comm_free");
    }
    free(m);
    c->impl = NULL;
    if (finalize && initialized_here) {
        initialized_here = 0;
        int mr = MPI_Finalize();
        if (mr != MPI_SUCCESS && rc == RF_OK) rc = mpi_fail(mr, "MPI_Finalize");
    }
    return rc;
}

const rf_comm_backend rf_comm_mpi_backend = {
    .name = "mpi",
    .req_size = sizeof(mpi_req),
    .start = mpi_start,
    .test = mpi_test,
    .abandon = mpi_abandon,
    .split = mpi_split,
    .destroy = mpi_destroy,
};

int rf_comm_mpi_init(const rf_comm_opts *opts, rf_comm **out) {
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return rf_fail(RF_ERR_INVALID, "comm: MPI was already finalized");
    int owns = 0;
    if (!inited) {
        int provided = 0;
        /* One thread at a time calls MPI (comm.h): SERIALIZED is enough. */
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread");
        if (provided < MPI_THREAD_SERIALIZED)
            return rf_fail(RF_ERR_UNSUPPORTED, "comm: MPI provides thread level %d only", provided);
        initialized_here = owns = 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    rf_comm *c;
    int rc = rf_comm_alloc(&rf_comm_mpi_backend, opts, NULL, &c);
    if (rc) return rc;
    c->owns_transport = owns;
    if ((rc = make_impl(MPI_COMM_WORLD, opts->timeout_s, c))) {
        rf_comm_free(c);
        return rf_fail_ctx(rc, "comm (mpi): starting the world");
    }
    *out = c;
    return RF_OK;
}
