/* The communication layer's common part: options and environment, argument
 * checks, requests and their timeout, the broken flag, splitting and the mesh.
 * The backends (comm_self.c, comm_mpi.c, comm_nccl.c) only move bytes. */
#include "comm/comm.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/bootstrap.h"
#include "comm/comm_impl.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"

rf_comm_opts rf_comm_opts_default(void) {
    return (rf_comm_opts){.timeout_s = 300, .bootstrap_timeout_s = 900, .mem = RF_COMM_HOST};
}

/* A positive number of seconds from the environment, or dflt. */
static int env_seconds(const char *name, double *v) {
    const char *s = getenv(name);
    if (!s || !*s) return RF_OK;
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (errno || *end || !(d > 0) || d > 1e7)
        return rf_fail(RF_ERR_INVALID, "%s=%s: expected a positive number of seconds", name, s);
    *v = d;
    return RF_OK;
}

static int resolve_opts(const rf_comm_opts *in, rf_comm_opts *o) {
    rf_comm_opts d = rf_comm_opts_default();
    *o = in ? *in : d;
    if (!(o->timeout_s > 0)) o->timeout_s = d.timeout_s;
    if (!(o->bootstrap_timeout_s > 0)) o->bootstrap_timeout_s = d.bootstrap_timeout_s;
    if (o->mem != RF_COMM_HOST && o->mem != RF_COMM_DEVICE)
        return rf_fail(RF_ERR_INVALID, "comm: bad memory kind %d", (int)o->mem);
    int rc = env_seconds("REFINERY_COMM_TIMEOUT", &o->timeout_s);
    if (!rc) rc = env_seconds("REFINERY_BOOTSTRAP_TIMEOUT", &o->bootstrap_timeout_s);
    const char *ss = getenv("REFINERY_COMM_SYNC_SEND");
    if (!rc && ss && *ss) {
        if (strcmp(ss, "0") && strcmp(ss, "1"))
            return rf_fail(RF_ERR_INVALID, "REFINERY_COMM_SYNC_SEND=%s: expected 0 or 1", ss);
        o->sync_send = ss[0] == '1';
    }
    return rc;
}

/* *found = 0 when unset; RF_ERR_INVALID naming the variable when not an
 * integer in [lo, hi]. */
static int env_int(const char *name, long lo, long hi, long *v, int *found) {
    const char *s = getenv(name);
    *found = s && *s;
    if (!*found) return RF_OK;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || *end || x < lo || x > hi)
        return rf_fail(RF_ERR_INVALID, "%s=%s: expected an integer in [%ld, %ld]", name, s, lo, hi);
    *v = x;
    return RF_OK;
}

/* Reads a pair "rank variable, size variable"; both or neither. */
static int env_pair(const char *rname, const char *wname, rf_comm_env *e, int *found) {
    long r = 0, w = 0;
    int fr, fw, rc = env_int(wname, 1, 1 << 20, &w, &fw);
    if (rc == RF_OK) rc = env_int(rname, 0, (1 << 20) - 1, &r, &fr);
    if (rc) return rc;
    *found = fr || fw;
    if (fr != fw)
        return rf_fail(RF_ERR_INVALID, "%s is set but %s is not: set both", fr ? rname : wname,
                       fr ? wname : rname);
    if (*found && r >= w)
        return rf_fail(RF_ERR_INVALID, "%s=%ld is not below %s=%ld", rname, r, wname, w);
    if (*found) e->rank = (int)r, e->world = (int)w;
    return RF_OK;
}

int rf_comm_env_read(rf_comm_env *e) {
    memset(e, 0, sizeof *e);
    e->world = 1;
    e->local_rank = -1;
    snprintf(e->run_id, sizeof e->run_id, "default");
    int found = 0, rc;
    long v;
    if ((rc = env_pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", e, &found))) return rc;
    if (found) {
        e->launch = RF_COMM_LAUNCH_MPIRUN;
        if ((rc = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, 1 << 20, &v, &found))) return rc;
        if (found) e->local_rank = (int)v;
    } else {
        if ((rc = env_pair("RANK", "WORLD_SIZE", e, &found))) return rc;
        if (!found && (rc = env_pair("JOB_COMPLETION_INDEX", "REFINERY_WORLD_SIZE", e, &found)))
            return rc;
        if (!found) return RF_OK; /* a single process */
        e->launch = RF_COMM_LAUNCH_ENV;
        if ((rc = env_int("LOCAL_RANK", 0, 1 << 20, &v, &found))) return rc;
        if (found) e->local_rank = (int)v;
        if (e->world > 1) {
            const char *a = getenv("MASTER_ADDR");
            if (!a || !*a)
                return rf_fail(RF_ERR_INVALID,
                               "MASTER_ADDR is not set: a group of %d ranks started from the "
                               "environment needs rank 0's address",
                               e->world);
            if (strlen(a) >= sizeof e->master_addr)
                return rf_fail(RF_ERR_INVALID, "MASTER_ADDR is longer than %zu bytes",
                               sizeof e->master_addr - 1);
            snprintf(e->master_addr, sizeof e->master_addr, "%s", a);
            if ((rc = env_int("MASTER_PORT", 1, 65535, &v, &found))) return rc;
            if (!found) return rf_fail(RF_ERR_INVALID, "MASTER_PORT is not set");
            e->master_port = (int)v;
        }
    }
    const char *id = getenv("REFINERY_RUN_ID");
    if (id && *id) {
        if (strlen(id) > RF_BOOT_MAX_RUN_ID)
            return rf_fail(RF_ERR_INVALID, "REFINERY_RUN_ID is longer than %d bytes",
                           RF_BOOT_MAX_RUN_ID);
        snprintf(e->run_id, sizeof e->run_id, "%s", id);
    }
    if ((rc = env_int("REFINERY_ATTEMPT", 0, UINT32_MAX > LONG_MAX ? LONG_MAX : UINT32_MAX, &v,
                      &found)))
        return rc;
    if (found) e->attempt = (uint32_t)v;
    return RF_OK;
}

int rf_comm_alloc(const rf_comm_backend *be, const rf_comm_opts *o, rf_comm_shared *sh,
                  rf_comm **out) {
    rf_comm *c = calloc(1, sizeof *c);
    if (!c) return rf_fail(RF_ERR_NOMEM, "comm: out of memory");
    if (!sh) {
        sh = calloc(1, sizeof *sh);
        if (!sh) {
            free(c);
            return rf_fail(RF_ERR_NOMEM, "comm: out of memory");
        }
    }
    sh->refs++;
    c->be = be, c->sh = sh, c->opts = *o;
    *out = c;
    return RF_OK;
}

void rf_comm_free(rf_comm *c) {
    rf_comm_shared *sh = c->sh;
    if (--sh->refs == 0) {
        for (size_t i = 0; i < sh->nkept; i++)
            free(sh->kept[i]);
        free(sh->kept);
        free(sh);
    }
    free(c);
}

void rf_comm_keep(rf_comm *c, void *p) {
    if (!p) return;
    rf_comm_shared *sh = c->sh;
    void **k = realloc(sh->kept, (sh->nkept + 1) * sizeof *k);
    if (!k) return; /* leak it: freeing memory MPI may still write is worse */
    sh->kept = k;
    sh->kept[sh->nkept++] = p;
}

static int init_self(const rf_comm_opts *o, rf_comm **out) {
    int rc = rf_comm_alloc(&rf_comm_self_backend, o, NULL, out);
    if (rc) return rc;
    (*out)->rank = 0, (*out)->world = 1, (*out)->owns_transport = 1;
    return RF_OK;
}

#ifdef REFINERY_CUDA
/* The NCCL world: the id comes from rank 0 by MPI (under mpirun), by the TCP
 * bootstrap (pods), or is made here (one rank). */
static int init_nccl(const rf_comm_opts *o, const rf_comm_env *e, rf_comm **out) {
    unsigned char id[RF_COMM_NCCL_ID_BYTES] = {0};
    int rc = RF_OK;
    rf_comm *mpi = NULL;
    if (e->launch == RF_COMM_LAUNCH_MPIRUN && e->world > 1) {
#ifdef REFINERY_MPI
        rf_comm_opts ho = *o;
        ho.mem = RF_COMM_HOST;
        if ((rc = rf_comm_mpi_init(&ho, &mpi))) return rc;
        if (rf_comm_rank(mpi) == 0) rc = rf_comm_nccl_unique_id(id);
        if (rc == RF_OK) rc = rf_comm_broadcast(mpi, id, sizeof id, RF_COMM_U8, 0);
#else
        return rf_fail(RF_ERR_UNSUPPORTED, "comm: started by mpirun but built without MPI");
#endif
    } else if (e->world > 1) {
        rf_boot_opts bo = {.run_id = e->run_id,
                           .attempt = e->attempt,
                           .rank = e->rank,
                           .world = e->world,
                           .timeout_s = o->bootstrap_timeout_s};
        if (e->rank == 0) {
            rf_boot_server *s = NULL;
            rc = rf_comm_nccl_unique_id(id);
            if (rc == RF_OK) rc = rf_boot_listen(NULL, e->master_port, &s);
            if (rc == RF_OK) rc = rf_boot_serve(s, &bo, id, sizeof id);
            rf_boot_server_close(s);
        } else {
            rc = rf_boot_fetch(e->master_addr, e->master_port, &bo, id, sizeof id);
        }
    } else {
        rc = rf_comm_nccl_unique_id(id);
    }
    if (rc == RF_OK)
        rc = rf_comm_nccl_init(o, id, mpi ? rf_comm_rank(mpi) : e->rank,
                               mpi ? rf_comm_world(mpi) : e->world, e->local_rank, out);
    if (rc != RF_OK) {
        if (mpi) rf_comm_destroy(mpi);
        return rc;
    }
    if (mpi) rf_comm_nccl_attach(*out, mpi);
    return RF_OK;
}
#endif

int rf_comm_init(const rf_comm_opts *in, const rf_comm_env *e, rf_comm **out) {
    *out = NULL;
    rf_comm_opts o;
    int rc = resolve_opts(in, &o);
    if (rc) return rc;
    if (e->world < 1 || e->rank < 0 || e->rank >= e->world)
        return rf_fail(RF_ERR_INVALID, "comm: rank %d of world %d", e->rank, e->world);
    if (o.mem == RF_COMM_DEVICE) {
#ifdef REFINERY_CUDA
        return init_nccl(&o, e, out);
#else
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "comm: device tensors need the CUDA=1 build (NCCL backend)");
#endif
    }
    if (e->world == 1) return init_self(&o, out);
    if (e->launch == RF_COMM_LAUNCH_MPIRUN) {
#ifdef REFINERY_MPI
        if ((rc = rf_comm_mpi_init(&o, out))) return rc;
        if (rf_comm_rank(*out) != e->rank || rf_comm_world(*out) != e->world) {
            rc = rf_fail(RF_ERR_INTERNAL, "comm: MPI says rank %d of %d, the environment %d of %d",
                         rf_comm_rank(*out), rf_comm_world(*out), e->rank, e->world);
            rf_comm_destroy(*out);
            *out = NULL;
        }
        return rc;
#else
        return rf_fail(RF_ERR_UNSUPPORTED, "comm: started by mpirun but built without MPI");
#endif
    }
    return rf_fail(RF_ERR_UNSUPPORTED,
                   "comm: a CPU group of %d ranks from RANK/WORLD_SIZE is not supported; start "
                   "CPU groups with mpirun (the environment/TCP path is for NCCL groups)",
                   e->world);
}

int rf_comm_init_from_env(const rf_comm_opts *opts, rf_comm **out) {
    *out = NULL;
    rf_comm_env e;
    int rc = rf_comm_env_read(&e);
    return rc ? rc : rf_comm_init(opts, &e, out);
}

int rf_comm_destroy(rf_comm *c) {
    if (!c) return RF_OK;
    int rc = c->be->destroy(c, c->owns_transport && !c->sh->broken);
    rf_comm_free(c);
    return rc;
}

int rf_comm_rank(const rf_comm *c) {
    return c->rank;
}
int rf_comm_world(const rf_comm *c) {
    return c->world;
}
const char *rf_comm_backend_name(const rf_comm *c) {
    return c->be->name;
}
int rf_comm_broken(const rf_comm *c) {
    return c->sh->broken;
}
rf_comm_mem rf_comm_mem_of(const rf_comm *c) {
    return c->opts.mem;
}

int rf_comm_dup_mem(rf_comm *c, rf_comm_mem mem, rf_comm **out) {
    *out = NULL;
    if (c->opts.mem != RF_COMM_HOST || mem != RF_COMM_DEVICE)
        return rf_fail(RF_ERR_UNSUPPORTED, "comm: no %s group from a %s group",
                       mem == RF_COMM_DEVICE ? "device" : "host",
                       c->opts.mem == RF_COMM_DEVICE ? "device" : "host");
#ifdef REFINERY_CUDA
    unsigned char id[RF_COMM_NCCL_ID_BYTES] = {0};
    /* rank 0's failure to make an id reaches the others as a zero flag */
    int idrc = c->rank == 0 ? rf_comm_nccl_unique_id(id) : RF_OK;
    unsigned char ok = idrc == RF_OK;
    int rc = rf_comm_broadcast(c, &ok, 1, RF_COMM_U8, 0);
    if (!rc && !ok)
        rc = c->rank == 0 ? idrc : rf_fail(RF_ERR_IO, "comm: rank 0 could not make an NCCL id");
    if (!rc) rc = rf_comm_broadcast(c, id, sizeof id, RF_COMM_U8, 0);
    if (rc) return rf_fail_ctx(rc, "comm: passing the NCCL id");
    rf_comm_opts o = c->opts;
    o.mem = RF_COMM_DEVICE;
    return rf_comm_nccl_init(&o, id, c->rank, c->world, RF_COMM_NCCL_CURRENT_DEVICE, out);
#else
    return rf_fail(RF_ERR_UNSUPPORTED, "comm: device tensors need the CUDA=1 build (NCCL backend)");
#endif
}

size_t rf_comm_dtype_size(rf_comm_dtype t) {
    switch (t) {
    case RF_COMM_F32:
    case RF_COMM_I32:
        return 4;
    case RF_COMM_F64:
    case RF_COMM_I64:
        return 8;
    case RF_COMM_U8:
        return 1;
    }
    return 0;
}

static const char *kind_name(rf_comm_kind k) {
    static const char *names[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast",
                                  "send",       "recv",           "barrier",    "send-recv"};
    return (unsigned)k < sizeof names / sizeof *names ? names[k] : "?";
}

static const char *dtype_name(rf_comm_dtype t) {
    static const char *names[] = {"f32", "f64", "i32", "i64", "u8"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "?";
}

/* Describes a call for messages: "all-reduce of 7 f32 on rank 1 of 4". */
static void describe(const rf_comm *c, const rf_comm_call *k, char *s, size_t n) {
    if (k->kind == RF_COMM_K_BARRIER)
        snprintf(s, n, "barrier on rank %d of %d", c->rank, c->world);
    else if (k->kind == RF_COMM_K_SEND || k->kind == RF_COMM_K_RECV)
        snprintf(s, n, "%s of %zu %s on rank %d of %d %s peer %d", kind_name(k->kind), k->count,
                 dtype_name(k->dtype), c->rank, c->world, k->kind == RF_COMM_K_SEND ? "to" : "from",
                 k->peer);
    else if (k->kind == RF_COMM_K_SENDRECV)
        snprintf(s, n,
                 "send-recv of %zu %s (receiving %zu) on rank %d of %d to peer %d from peer %d",
                 k->count, dtype_name(k->dtype), k->count2, c->rank, c->world, k->peer, k->peer2);
    else if (k->kind == RF_COMM_K_BROADCAST)
        snprintf(s, n, "broadcast of %zu %s on rank %d of %d from root %d", k->count,
                 dtype_name(k->dtype), c->rank, c->world, k->peer);
    else
        snprintf(s, n, "%s of %zu %s on rank %d of %d", kind_name(k->kind), k->count,
                 dtype_name(k->dtype), c->rank, c->world);
}

static int fail_broken(const rf_comm *c) {
    return rf_fail(RF_ERR_IO, "comm (%s): the group is unusable after an earlier failure: %s",
                   c->be->name, c->sh->why);
}

static void mark_broken(rf_comm *c, const char *why) {
    if (!c->sh->broken) { /* the first failure is the cause; later ones follow from it */
        size_t n = strlen(why);
        n = n < sizeof c->sh->why - 1 ? n : sizeof c->sh->why - 1;
        memcpy(c->sh->why, why, n);
        c->sh->why[n] = 0;
    }
    c->sh->broken = 1;
    rf_error("comm", "%s", why);
}

/* The bytes an operation reads at k->send and writes at k->recv. */
static void extents(const rf_comm *c, const rf_comm_call *k, size_t *sbytes, size_t *rbytes) {
    size_t es = k->kind == RF_COMM_K_BARRIER ? 0 : rf_comm_dtype_size(k->dtype);
    size_t w = (size_t)c->world;
    *sbytes = k->count * es * (k->kind == RF_COMM_K_REDUCE_SCATTER ? w : 1);
    *rbytes = k->count * es * (k->kind == RF_COMM_K_ALLGATHER ? w : 1);
    if (k->kind == RF_COMM_K_RECV || k->kind == RF_COMM_K_BROADCAST) *sbytes = 0;
    if (k->kind == RF_COMM_K_SEND) *rbytes = 0;
    if (k->kind == RF_COMM_K_SENDRECV) *rbytes = k->count2 * es;
}

static int check_call(const rf_comm *c, const rf_comm_call *k) {
    if (!c) return rf_fail(RF_ERR_INVALID, "comm: NULL communicator");
    if (c->sh->broken) return fail_broken(c);
    if (k->kind != RF_COMM_K_BARRIER) {
        if (rf_comm_dtype_size(k->dtype) == 0)
            return rf_fail(RF_ERR_INVALID, "comm: bad dtype %d", (int)k->dtype);
        size_t most = k->count > k->count2 ? k->count : k->count2;
        if (most > ((size_t)1 << 40))
            return rf_fail(RF_ERR_RANGE, "comm: count %zu is too large", most);
    }
    if (k->kind == RF_COMM_K_ALLREDUCE || k->kind == RF_COMM_K_REDUCE_SCATTER) {
        if ((unsigned)k->op > RF_COMM_MIN)
            return rf_fail(RF_ERR_INVALID, "comm: bad reduction %d", (int)k->op);
        if (k->op == RF_COMM_AVG && k->dtype != RF_COMM_F32 && k->dtype != RF_COMM_F64)
            return rf_fail(RF_ERR_INVALID, "comm: average of %s: only f32 and f64",
                           dtype_name(k->dtype));
    }
    int needs_send = k->kind == RF_COMM_K_ALLREDUCE || k->kind == RF_COMM_K_REDUCE_SCATTER ||
                     k->kind == RF_COMM_K_ALLGATHER || k->kind == RF_COMM_K_SEND ||
                     k->kind == RF_COMM_K_SENDRECV;
    int needs_recv = k->kind != RF_COMM_K_SEND && k->kind != RF_COMM_K_BARRIER;
    size_t rcount = k->kind == RF_COMM_K_SENDRECV ? k->count2 : k->count;
    if ((k->count > 0 && needs_send && !k->send) || (rcount > 0 && needs_recv && !k->recv))
        return rf_fail(RF_ERR_INVALID, "comm: %s with a NULL buffer", kind_name(k->kind));
    if ((k->kind == RF_COMM_K_BROADCAST || k->kind == RF_COMM_K_SEND ||
         k->kind == RF_COMM_K_RECV) &&
        (k->peer < 0 || k->peer >= c->world))
        return rf_fail(RF_ERR_INVALID, "comm: %s with %s %d outside the group of %d",
                       kind_name(k->kind), k->kind == RF_COMM_K_BROADCAST ? "root" : "peer",
                       k->peer, c->world);
    /* Buffers may coincide only in NCCL's in-place layouts (comm.h). */
    size_t es = rf_comm_dtype_size(k->dtype), sbytes, rbytes;
    extents(c, k, &sbytes, &rbytes);
    uintptr_t sa = (uintptr_t)k->send, ra = (uintptr_t)k->recv;
    int overlap = needs_send && needs_recv && sbytes > 0 && rbytes > 0 && sa < ra + rbytes &&
                  ra < sa + sbytes;
    if (overlap) {
        uintptr_t at = (uintptr_t)c->rank * k->count * es;
        int in_place = k->kind == RF_COMM_K_ALLREDUCE        ? sa == ra
                       : k->kind == RF_COMM_K_REDUCE_SCATTER ? ra == sa + at
                       : k->kind == RF_COMM_K_ALLGATHER      ? sa == ra + at
                                                             : 0;
        if (!in_place)
            return rf_fail(RF_ERR_INVALID,
                           "comm: %s with overlapping buffers that are not the in-place layout",
                           kind_name(k->kind));
    }
    if (k->kind == RF_COMM_K_SENDRECV &&
        (k->peer < 0 || k->peer >= c->world || k->peer2 < 0 || k->peer2 >= c->world))
        return rf_fail(RF_ERR_INVALID, "comm: send-recv with peers %d, %d outside the group of %d",
                       k->peer, k->peer2, c->world);
    /* To and from oneself the send is the receive: NCCL leaves unequal sizes
     * undefined, MPI truncates, so every backend refuses them. */
    if (k->kind == RF_COMM_K_SENDRECV && k->peer == c->rank && k->peer2 == c->rank &&
        k->count2 != k->count)
        return rf_fail(RF_ERR_INVALID,
                       "comm: send-recv to oneself of %zu elements, receiving %zu: sizes differ",
                       k->count, k->count2);
    return RF_OK;
}

static rf_comm_access_fn access_enter, access_leave;

void rf_comm_set_access_hooks(rf_comm_access_fn enter, rf_comm_access_fn leave) {
    access_enter = enter;
    access_leave = leave;
}

/* The access hooks' arguments of r's operation. */
static void hook(rf_comm_access_fn fn, const rf_comm_req *r, int *rc) {
    size_t sbytes, rbytes;
    extents(r->c, &r->call, &sbytes, &rbytes);
    int e = fn(sbytes ? r->call.send : NULL, sbytes, rbytes ? r->call.recv : NULL, rbytes);
    if (rc) *rc = e;
}

static void req_free(rf_comm_req *r) {
    if (r->entered && access_leave) hook(access_leave, r, NULL);
    free(r);
}

static int start(rf_comm *c, const rf_comm_call *k, rf_comm_req **out) {
    *out = NULL;
    int rc = check_call(c, k);
    if (rc) return rc;
    rf_comm_req *r = calloc(1, sizeof *r + c->be->req_size);
    if (!r) return rf_fail(RF_ERR_NOMEM, "comm: out of memory");
    r->c = c, r->call = *k;
    if (access_enter && c->opts.mem == RF_COMM_HOST) {
        r->entered = 1;
        hook(access_enter, r, &rc);
        if (rc) {
            req_free(r);
            return rc;
        }
    }
    rc = c->be->start(c, k, r);
    if (rc) {
        char what[160], why[512];
        describe(c, k, what, sizeof what);
        rf_fail_ctx(rc, "comm (%s): %s", c->be->name, what);
        if (rc == RF_ERR_IO) { /* the transport failed: nothing more will work */
            snprintf(why, sizeof why, "%s", rf_errmsg());
            mark_broken(c, why);
        }
        req_free(r);
        return rc;
    }
    *out = r;
    return RF_OK;
}

/* Seconds rf_comm_wait polls without sleeping (see there). */
#define SPIN_S 1.0

static void sleep_ns(long ns) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

int rf_comm_test(rf_comm_req *r, int *done) {
    *done = 0;
    if (!r) return rf_fail(RF_ERR_INVALID, "comm: NULL request");
    rf_comm *c = r->c;
    if (r->done) {
        *done = 1;
        return r->err ? rf_fail(r->err, "comm (%s): the request failed earlier", c->be->name)
                      : RF_OK;
    }
    if (c->sh->broken) return fail_broken(c);
    int rc = c->be->test(c, r, &r->done);
    if (rc) {
        char what[160], why[600];
        describe(c, &r->call, what, sizeof what);
        snprintf(why, sizeof why, "comm (%s): %s failed: %s", c->be->name, what, rf_errmsg());
        r->done = 1, r->err = rc;                 /* nothing more will come of it */
        if (rc == RF_ERR_IO) mark_broken(c, why); /* the transport failed */
        return rf_fail(rc, "%s", why);
    }
    *done = r->done;
    return RF_OK;
}

int rf_comm_wait(rf_comm_req *r) {
    if (!r) return RF_OK;
    rf_comm *c = r->c;
    int rc = RF_OK;
    if (c->sh->broken && !r->done) {
        c->be->abandon(c, r);
        rc = fail_broken(c);
        req_free(r);
        return rc;
    }
    double t0 = rf_now(), deadline = t0 + c->opts.timeout_s;
    long nap = 1000; /* ns; grows to 1 ms so that waiting ranks leave the cores to the others */
    if (r->done && r->err) /* rf_comm_test saw it fail */
        rc = c->sh->broken ? fail_broken(c)
                           : rf_fail(r->err, "comm (%s): the request failed earlier", c->be->name);
    while (!r->done) {
        int done;
        if ((rc = rf_comm_test(r, &done))) break;
        if (done) break;
        if (rf_now() > deadline) {
            char what[160], why[512];
            describe(c, &r->call, what, sizeof what);
            snprintf(why, sizeof why,
                     "timeout: comm (%s): %s did not complete in %.1f s: a peer is dead or "
                     "stuck; the group is now unusable",
                     c->be->name, what, rf_now() - t0);
            c->be->abandon(c, r);
            mark_broken(c, why);
            rc = rf_fail(RF_ERR_IO, "%s", why);
            break;
        }
        /* MPI progresses a nonblocking collective only inside MPI_Test, one
         * step per call: poll hard while a normal operation can still be
         * running, then back off so that a rank waiting on a dead peer does
         * not hold a core for the whole timeout. (Sleeping from the start
         * made an all-reduce of 1M floats at 2 ranks ~9x slower than
         * MPI_Allreduce: tests/comm/bench_allreduce.c.) */
        if (rf_now() - t0 < SPIN_S) {
            sched_yield();
        } else {
            sleep_ns(nap);
            if (nap < 1000000) nap *= 2;
        }
    }
    if (r->err == RF_ERR_IO) c->be->abandon(c, r); /* the transport failed under it */
    req_free(r);
    return rc;
}

static int run(rf_comm *c, const rf_comm_call *k) {
    rf_comm_req *r;
    int rc = start(c, k, &r);
    return rc ? rc : rf_comm_wait(r);
}

#define CALL(...) (&(rf_comm_call){__VA_ARGS__})

int rf_comm_iallreduce(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t,
                       rf_comm_op op, rf_comm_req **req) {
    return start(c, CALL(RF_COMM_K_ALLREDUCE, send, recv, count, t, op, 0, 0, 0), req);
}
int rf_comm_ireduce_scatter(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t,
                            rf_comm_op op, rf_comm_req **req) {
    return start(c, CALL(RF_COMM_K_REDUCE_SCATTER, send, recv, count, t, op, 0, 0, 0), req);
}
int rf_comm_iallgather(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t,
                       rf_comm_req **req) {
    return start(c, CALL(RF_COMM_K_ALLGATHER, send, recv, count, t, RF_COMM_SUM, 0, 0, 0), req);
}
int rf_comm_ibroadcast(rf_comm *c, void *buf, size_t count, rf_comm_dtype t, int root,
                       rf_comm_req **req) {
    return start(c, CALL(RF_COMM_K_BROADCAST, buf, buf, count, t, RF_COMM_SUM, root, 0, 0), req);
}
int rf_comm_isend(rf_comm *c, const void *buf, size_t count, rf_comm_dtype t, int peer,
                  rf_comm_req **req) {
    return start(c, CALL(RF_COMM_K_SEND, buf, NULL, count, t, RF_COMM_SUM, peer, 0, 0), req);
}
int rf_comm_irecv(rf_comm *c, void *buf, size_t count, rf_comm_dtype t, int peer,
                  rf_comm_req **req) {
    return start(c, CALL(RF_COMM_K_RECV, NULL, buf, count, t, RF_COMM_SUM, peer, 0, 0), req);
}
int rf_comm_isendrecv(rf_comm *c, const void *send, int dst, void *recv, int src, size_t count,
                      rf_comm_dtype t, rf_comm_req **req) {
    return start(c, CALL(RF_COMM_K_SENDRECV, send, recv, count, t, RF_COMM_SUM, dst, src, count),
                 req);
}
int rf_comm_isendrecv_n(rf_comm *c, const void *send, size_t scount, int dst, void *recv,
                        size_t rcount, int src, rf_comm_dtype t, rf_comm_req **req) {
    return start(c, CALL(RF_COMM_K_SENDRECV, send, recv, scount, t, RF_COMM_SUM, dst, src, rcount),
                 req);
}
int rf_comm_ibarrier(rf_comm *c, rf_comm_req **req) {
    return start(c, CALL(RF_COMM_K_BARRIER, NULL, NULL, 0, RF_COMM_U8, RF_COMM_SUM, 0, 0, 0), req);
}

int rf_comm_allreduce(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t,
                      rf_comm_op op) {
    return run(c, CALL(RF_COMM_K_ALLREDUCE, send, recv, count, t, op, 0, 0, 0));
}
int rf_comm_reduce_scatter(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t,
                           rf_comm_op op) {
    return run(c, CALL(RF_COMM_K_REDUCE_SCATTER, send, recv, count, t, op, 0, 0, 0));
}
int rf_comm_allgather(rf_comm *c, const void *send, void *recv, size_t count, rf_comm_dtype t) {
    return run(c, CALL(RF_COMM_K_ALLGATHER, send, recv, count, t, RF_COMM_SUM, 0, 0, 0));
}
int rf_comm_broadcast(rf_comm *c, void *buf, size_t count, rf_comm_dtype t, int root) {
    return run(c, CALL(RF_COMM_K_BROADCAST, buf, buf, count, t, RF_COMM_SUM, root, 0, 0));
}
int rf_comm_send(rf_comm *c, const void *buf, size_t count, rf_comm_dtype t, int peer) {
    return run(c, CALL(RF_COMM_K_SEND, buf, NULL, count, t, RF_COMM_SUM, peer, 0, 0));
}
int rf_comm_recv(rf_comm *c, void *buf, size_t count, rf_comm_dtype t, int peer) {
    return run(c, CALL(RF_COMM_K_RECV, NULL, buf, count, t, RF_COMM_SUM, peer, 0, 0));
}
int rf_comm_sendrecv(rf_comm *c, const void *send, int dst, void *recv, int src, size_t count,
                     rf_comm_dtype t) {
    return run(c, CALL(RF_COMM_K_SENDRECV, send, recv, count, t, RF_COMM_SUM, dst, src, count));
}
int rf_comm_sendrecv_n(rf_comm *c, const void *send, size_t scount, int dst, void *recv,
                       size_t rcount, int src, rf_comm_dtype t) {
    return run(c, CALL(RF_COMM_K_SENDRECV, send, recv, scount, t, RF_COMM_SUM, dst, src, rcount));
}
int rf_comm_barrier(rf_comm *c) {
    return run(c, CALL(RF_COMM_K_BARRIER, NULL, NULL, 0, RF_COMM_U8, RF_COMM_SUM, 0, 0, 0));
}

int rf_comm_order_after(rf_comm *c, void *stream) {
    if (!c || !stream)
        return rf_fail(RF_ERR_INVALID, "comm: order after a NULL %s",
                       c ? "stream" : "communicator");
    if (!c->be->order_after || c->opts.mem != RF_COMM_DEVICE)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "comm (%s): ordering after a device stream needs a device group (nccl)",
                       c->be->name);
    int rc = c->be->order_after(c, stream);
    if (rc) return rf_fail_ctx(rc, "comm (%s): ordering after the caller's stream", c->be->name);
    c->ordered = 1;
    return RF_OK;
}

int rf_comm_ordered(const rf_comm *c) {
    return c && c->ordered;
}

int rf_comm_split(rf_comm *c, int color, int key, rf_comm **out) {
    *out = NULL;
    if (!c) return rf_fail(RF_ERR_INVALID, "comm: NULL communicator");
    if (c->sh->broken) return fail_broken(c);
    if (color < 0) return rf_fail(RF_ERR_INVALID, "comm: split color %d < 0", color);
    rf_comm *g;
    int rc = rf_comm_alloc(c->be, &c->opts, c->sh, &g);
    if (rc) return rc;
    rc = c->be->split(c, color, key, g);
    if (rc) {
        if (rc == RF_ERR_IO) {
            char why[600];
            snprintf(why, sizeof why, "comm (%s): split on rank %d of %d failed: %s", c->be->name,
                     c->rank, c->world, rf_errmsg());
            mark_broken(c, why);
            rc = rf_fail(rc, "%s", why);
        }
        rf_comm_free(g);
        return rc;
    }
    *out = g;
    return RF_OK;
}

int rf_comm_mesh_coords(int rank, int dp, int tp, int pp, int *dp_i, int *tp_i, int *pp_i) {
    if (dp < 1 || tp < 1 || pp < 1 || (long long)dp * tp * pp > INT_MAX)
        return rf_fail(RF_ERR_INVALID, "comm: mesh dp=%d tp=%d pp=%d", dp, tp, pp);
    if (rank < 0 || rank >= dp * tp * pp)
        return rf_fail(RF_ERR_INVALID, "comm: rank %d outside the mesh of %d", rank, dp * tp * pp);
    *tp_i = rank % tp;
    *pp_i = rank / tp % pp;
    *dp_i = rank / (tp * pp);
    return RF_OK;
}

int rf_comm_mesh_rank(int dp, int tp, int pp, int dp_i, int tp_i, int pp_i) {
    if (dp < 1 || tp < 1 || pp < 1 || dp_i < 0 || dp_i >= dp || tp_i < 0 || tp_i >= tp ||
        pp_i < 0 || pp_i >= pp)
        return rf_fail(RF_ERR_INVALID, "comm: coordinates (%d,%d,%d) outside dp=%d tp=%d pp=%d",
                       dp_i, tp_i, pp_i, dp, tp, pp);
    return (dp_i * pp + pp_i) * tp + tp_i;
}

int rf_comm_mesh_destroy(rf_comm_mesh *m) {
    if (!m) return RF_OK;
    int a = rf_comm_destroy(m->dp_comm), b = rf_comm_destroy(m->tp_comm),
        d = rf_comm_destroy(m->pp_comm);
    m->dp_comm = m->tp_comm = m->pp_comm = NULL;
    return a ? a : b ? b : d;
}

int rf_comm_mesh_init(rf_comm *w, int dp, int tp, int pp, rf_comm_mesh *m) {
    memset(m, 0, sizeof *m);
    if (!w) return rf_fail(RF_ERR_INVALID, "comm: NULL communicator");
    if (dp < 1 || tp < 1 || pp < 1 || (long long)dp * tp * pp != w->world)
        return rf_fail(RF_ERR_INVALID,
                       "comm: the mesh dp=%d x tp=%d x pp=%d = %lld ranks does not match the "
                       "world size %d",
                       dp, tp, pp, (long long)dp * tp * pp, w->world);
    m->dp = dp, m->tp = tp, m->pp = pp;
    int rc = rf_comm_mesh_coords(w->rank, dp, tp, pp, &m->dp_i, &m->tp_i, &m->pp_i);
    /* Same color = same coordinates on the other two axes. */
    if (rc == RF_OK) rc = rf_comm_split(w, m->pp_i * tp + m->tp_i, m->dp_i, &m->dp_comm);
    if (rc == RF_OK) rc = rf_comm_split(w, m->dp_i * pp + m->pp_i, m->tp_i, &m->tp_comm);
    if (rc == RF_OK) rc = rf_comm_split(w, m->dp_i * tp + m->tp_i, m->pp_i, &m->pp_comm);
    if (rc == RF_OK &&
        (m->dp_comm->world != dp || m->dp_comm->rank != m->dp_i || m->tp_comm->world != tp ||
         m->tp_comm->rank != m->tp_i || m->pp_comm->world != pp || m->pp_comm->rank != m->pp_i))
        rc = rf_fail(RF_ERR_INTERNAL, "comm: mesh groups disagree with the coordinates");
    if (rc) rf_comm_mesh_destroy(m);
    return rc;
}

size_t rf_comm_shard(size_t n, int world, int rank, size_t *lo, size_t *hi) {
    if (world < 1 || rank < 0 || rank >= world) {
        *lo = *hi = 0;
        return 0;
    }
    size_t block = (n + (size_t)world - 1) / (size_t)world;
    size_t a = block * (size_t)rank;
    *lo = a < n ? a : n;
    *hi = a + block < n ? a + block : n;
    return block;
}
