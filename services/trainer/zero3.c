/* ZeRO stages 2 and 3 over the model's parameter units (see zero3.h). */
#include "trainer/zero3.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

typedef struct unit {
    size_t lo, hi; /* the unit's range of the flat block */
    size_t b;      /* block per rank: ceil((hi - lo) / N) */
    size_t soff;   /* offset of this rank's block in the shard arrays */
} unit;

/* A gathered unit's parameters (N*b floats), or a unit's full gradient (N*b
 * floats, reduce-scattered in place: this rank's block lands at rank*b).
 * unit -1: free. On a device a slot's buffer holds the largest unit (N*bmax
 * floats), made at its first use and kept to the end, so that a step
 * allocates and frees nothing (cudaMalloc waits for its memset, cudaFree for
 * the whole device); in host memory, where allocation is cheap and memory is
 * what ZeRO saves, a buffer of the unit's size per use. */
typedef struct pslot {
    int unit;
    float *buf;
    rf_comm_req *req;
} pslot;

typedef struct gslot {
    int unit;
    float *buf;
    rf_comm_req *req;
    uint64_t seq;
} gslot;

/* Every buffer here is the model's backend memory (be->alloc): the shards,
 * the unit working buffers, the gather buffers and the norm's scalar, so on a
 * device backend NCCL gets device pointers (the group comes from train.c,
 * RF_COMM_DEVICE when be->device_memory). Arithmetic (zeroing, accumulating
 * the reduced blocks, the norm, clipping, AdamW) and copies go through the
 * backend; the host touches shard memory only through to_host/to_device.
 * Backend work may be queued asynchronously, so every collective on a buffer
 * the backend wrote or still reads is preceded by be_wait, which waits on
 * the host unless the group is ordered after the backend's queue on the
 * device (train.c: rf_comm_order_after, NCCL). */
struct rf_zero3 {
    rf_comm *c;
    rf_model *m;
    const rf_backend *be;
    int world, rank, nunits;
    bool shard_params; /* zero 3; false: zero 2 (m->params stays full) */
    unit *u;
    size_t S;               /* shard floats */
    float *p, *g, *m1, *m2; /* shards (p NULL at zero 2) */
    pslot ps[2];
    gslot gs[2];
    double *scalar; /* backend memory: the norm's all-reduce */
    uint64_t seq;
    int rc; /* first error of a hook event */
    uint64_t bytes;
    size_t bmax;        /* the largest unit's block */
    bool keep;          /* be->device_memory: slot buffers kept (pslot) */
    float *tmp;         /* zero 2 on a device: gather's unit buffer (N*bmax floats), kept */
    rf_param_span *own; /* per unit, this rank's real piece of g (the norm's spans) */
    size_t work, work_p, peak, peak_p;
};

/* Floats of this rank's piece of unit k (the rest of its block is padding). */
static size_t real_len(const rf_zero3 *z, const unit *k) {
    size_t s = k->hi - k->lo, a = (size_t)z->rank * k->b;
    if (a >= s) return 0;
    return s - a < k->b ? s - a : k->b;
}

static void account(rf_zero3 *z, long dp, long dg) {
    z->work_p = (size_t)((long)z->work_p + dp);
    z->work = (size_t)((long)z->work + dp + dg);
    if (z->work > z->peak) {
        z->peak = z->work;
        z->peak_p = z->work_p;
    }
}

/* Waits for the work queued on the backend (backend.h: to_host waits for
 * it), so that a collective starts on finished buffers and overwrites none
 * that queued kernels still read. Nothing to wait for on the CPU, nor on the
 * host for a group ordered after the backend's queue (its operations wait
 * for that queue on the device). */
static int be_wait(rf_zero3 *z) {
    if (z->be == rf_backend_cpu() || rf_comm_ordered(z->c)) return RF_OK;
    double x;
    return z->be->to_host(z->be, &x, z->scalar, sizeof x);
}

static float *be_alloc(rf_zero3 *z, size_t n) {
    return rf_backend_alloc(z->be, n * sizeof(float));
}

/* *buf, a slot's buffer for unit u (see pslot), counted in the working
 * memory while held. */
static int slot_take(rf_zero3 *z, float **buf, int u, bool params) {
    if (*buf) return RF_OK; /* kept */
    size_t n = (z->keep ? z->bmax : z->u[u].b) * (size_t)z->world;
    if (!(*buf = be_alloc(z, n))) return RF_ERR_NOMEM;
    account(z, params ? (long)n : 0, params ? 0 : (long)n);
    return RF_OK;
}

/* The slot of unit u done with its buffer: freed unless kept. */
static void slot_release(rf_zero3 *z, float **buf, int u, bool params) {
    if (z->keep || !*buf) return;
    long n = (long)(z->u[u].b * (size_t)z->world);
    account(z, params ? -n : 0, params ? 0 : -n);
    (void)z->be->free(z->be, *buf);
    *buf = NULL;
}

static int fail(rf_zero3 *z, int rc, const char *what, int u) {
    rc = rf_fail_ctx(rc, "train: zero 3: %s of unit %d", what, u);
    if (!z->rc) z->rc = rc;
    return rc;
}

/* ---- parameter buffers ---- */

static int p_find(const rf_zero3 *z, int u) {
    for (int i = 0; i < 2; i++)
        if (z->ps[i].unit == u) return i;
    return -1;
}

/* Slot i free again (its buffer kept). */
static int p_drop(rf_zero3 *z, int i) {
    pslot *s = &z->ps[i];
    if (s->unit < 0) return RF_OK;
    int rc = rf_comm_wait(s->req); /* a pending gather must end before the slot is reused */
    slot_release(z, &s->buf, s->unit, true);
    s->unit = -1;
    s->req = NULL;
    return rc;
}

/* Starts the all-gather of unit u into a free slot; returns the slot. */
static int p_start(rf_zero3 *z, int u, int *slot) {
    int i = z->ps[0].unit < 0 ? 0 : 1;
    if (z->ps[i].unit >= 0) return fail(z, RF_ERR_INVALID, "no free buffer for the all-gather", u);
    const unit *k = &z->u[u];
    if (slot_take(z, &z->ps[i].buf, u, true))
        return fail(z, RF_ERR_NOMEM, "no memory to gather the parameters", u);
    rf_comm_req *req;
    /* also: the slot's last unit may still be read by queued kernels */
    int rc = be_wait(z);
    if (!rc) rc = rf_comm_iallgather(z->c, z->p + k->soff, z->ps[i].buf, k->b, RF_COMM_F32, &req);
    if (rc) return fail(z, rc, "all-gather of the parameters", u);
    z->bytes += (uint64_t)(z->world - 1) * k->b * sizeof(float);
    z->ps[i].unit = u;
    z->ps[i].req = req;
    *slot = i;
    return RF_OK;
}

/* Makes unit u's parameters resident and bound; drops the other unit's
 * buffer (done with) and prefetches unit `next` (-1: none). */
static int p_use(rf_zero3 *z, int u, int next) {
    int i = p_find(z, u), rc;
    for (int j = 0; j < 2; j++)
        if (j != i && z->ps[j].unit >= 0 && (rc = p_drop(z, j)))
            return fail(z, rc, "all-gather of the parameters", z->ps[j].unit);
    if (i < 0 && (rc = p_start(z, u, &i))) return rc;
    if (next >= 0 && p_find(z, next) < 0) {
        int j;
        if ((rc = p_start(z, next, &j))) return rc;
    }
    rc = rf_comm_wait(z->ps[i].req);
    z->ps[i].req = NULL;
    if (rc) return fail(z, rc, "all-gather of the parameters", u);
    int rc2 = rf_model_bind_unit(z->m, u, z->ps[i].buf, NULL);
    return rc2 ? fail(z, rc2, "binding the parameters", u) : RF_OK;
}

/* ---- gradient buffers ---- */

/* Waits for slot i's reduce-scatter and adds its block into the gradient
 * shard, then frees the slot (its buffer kept). */
static int g_finish(rf_zero3 *z, int i) {
    gslot *s = &z->gs[i];
    if (s->unit < 0) return RF_OK;
    const unit *k = &z->u[s->unit];
    int rc = RF_OK;
    if (s->req) {
        rc = rf_comm_wait(s->req);
        if (rc) {
            fail(z, rc, "reduce-scatter of the gradients", s->unit);
        } else { /* g += block through the backend (residual with p = 0 is a + b; out aliases a) */
            const rf_backend *be = z->be;
            float *g = z->g + k->soff;
            rc = be->residual_fwd(be, g, g, s->buf + (size_t)z->rank * k->b, k->b, 0.0f, 0);
            if (rc) fail(z, rc, "adding the reduced gradient block", s->unit);
        }
    }
    slot_release(z, &s->buf, s->unit, false);
    s->unit = -1;
    s->req = NULL;
    return rc;
}

static int g_begin(rf_zero3 *z, int u) {
    int i = z->gs[0].unit < 0 ? 0 : z->gs[1].unit < 0 ? 1 : z->gs[0].seq < z->gs[1].seq ? 0 : 1;
    int rc = g_finish(z, i);
    if (rc) return rc;
    const unit *k = &z->u[u];
    gslot *s = &z->gs[i];
    if (slot_take(z, &s->buf, u, false))
        return fail(z, RF_ERR_NOMEM, "no memory for the gradient", u);
    /* the backward accumulates into it: a kept buffer still holds the last
     * unit's gradient (zeroed after that unit's add, in queue order); a new
     * one comes zeroed */
    if (z->keep && (rc = z->be->zero(z->be, s->buf, k->b * (size_t)z->world * sizeof(float))))
        return fail(z, rc, "zeroing the gradient buffer", u);
    s->unit = u;
    s->req = NULL;
    s->seq = ++z->seq;
    rc = rf_model_bind_unit(z->m, u, NULL, s->buf);
    return rc ? fail(z, rc, "binding the gradients", u) : RF_OK;
}

static int g_done(rf_zero3 *z, int u) {
    for (int i = 0; i < 2; i++) {
        gslot *s = &z->gs[i];
        if (s->unit != u || s->req) continue;
        const unit *k = &z->u[u];
        int rc = be_wait(z); /* the unit's backward kernels have written s->buf */
        if (!rc)
            rc = rf_comm_ireduce_scatter(z->c, s->buf, s->buf + (size_t)z->rank * k->b, k->b,
                                         RF_COMM_F32, RF_COMM_SUM, &s->req);
        if (rc) return fail(z, rc, "reduce-scatter of the gradients", u);
        z->bytes += (uint64_t)(z->world - 1) * k->b * sizeof(float);
        return RF_OK;
    }
    return fail(z, RF_ERR_INVALID, "backward done without a gradient buffer", u);
}

/* next: the model's prefetch hint (model_iface.h). A tied head's part of
 * unit 0's gradient (RF_UNIT_BWD_PART) is reduce-scattered like a whole
 * unit's: the shard adds both parts. */
static int hook(void *user, int u, rf_unit_event ev, int next) {
    rf_zero3 *z = user;
    if (z->rc) return z->rc; /* after a failure nothing more is communicated */
    switch (ev) {
    case RF_UNIT_FWD:
        return z->shard_params ? p_use(z, u, next) : RF_OK;
    case RF_UNIT_BWD: {
        int rc = z->shard_params ? p_use(z, u, next) : RF_OK;
        return rc ? rc : g_begin(z, u);
    }
    case RF_UNIT_BWD_DONE:
    case RF_UNIT_BWD_PART:
        return g_done(z, u);
    }
    return RF_OK;
}

int rf_zero3_new(rf_comm *c, rf_model *m, bool shard_params, rf_zero3 **out) {
    *out = NULL;
    rf_model_blocks mb;
    int rc = rf_model_blocks_of(m, &mb);
    if (rc) return rc;
    if (!mb.params) return rf_fail(RF_ERR_INVALID, "train: zero 3 needs the model's parameters");
    rf_zero3 *z = calloc(1, sizeof *z);
    if (!z) return RF_ERR_NOMEM;
    z->c = c;
    z->m = m;
    z->be = mb.be;
    z->keep = mb.be->device_memory;
    z->shard_params = shard_params;
    z->world = rf_comm_world(c);
    z->rank = rf_comm_rank(c);
    z->nunits = rf_model_units(m);
    z->ps[0].unit = z->ps[1].unit = z->gs[0].unit = z->gs[1].unit = -1;
    z->u = calloc((size_t)z->nunits, sizeof *z->u);
    if (!z->u) {
        free(z);
        return RF_ERR_NOMEM;
    }
    for (int i = 0; i < z->nunits; i++) {
        unit *k = &z->u[i];
        if ((rc = rf_model_unit_range(m, i, &k->lo, &k->hi))) {
            free(z->u);
            free(z);
            return rc;
        }
        k->b = (k->hi - k->lo + (size_t)z->world - 1) / (size_t)z->world;
        k->soff = z->S;
        z->S += k->b;
        if (k->b > z->bmax) z->bmax = k->b;
    }
    z->own = malloc((z->nunits > 0 ? (size_t)z->nunits : 1) * sizeof *z->own);
    for (int i = 0; z->own && i < z->nunits; i++)
        z->own[i] = (rf_param_span){z->u[i].soff, real_len(z, &z->u[i]), false};
    size_t n = z->S;
    z->p = shard_params ? be_alloc(z, n) : NULL; /* zeroed: the moments start at 0 */
    z->g = be_alloc(z, n);
    z->m1 = be_alloc(z, n);
    z->m2 = be_alloc(z, n);
    void *sc = NULL;
    if (!z->be->alloc(z->be, &sc, sizeof(double))) z->scalar = sc;
    if ((shard_params && !z->p) || !z->g || !z->m1 || !z->m2 || !z->scalar || !z->own) {
        rf_zero3_free(z, false);
        return rf_fail(RF_ERR_NOMEM, "train: zero 3: no memory for the shards");
    }
    if ((rc = rf_zero3_scatter(z, mb.params, NULL, NULL)) ||
        (rc = rf_model_release_blocks(m, shard_params)) || (rc = rf_model_set_hook(m, hook, z))) {
        rf_zero3_free(z, false);
        return rc;
    }
    *out = z;
    return RF_OK;
}

static int drain(rf_zero3 *z) {
    int rc = RF_OK, r;
    for (int i = 0; i < 2; i++) {
        if ((r = g_finish(z, i)) && !rc) rc = r;
        if ((r = p_drop(z, i)) && !rc) rc = r;
    }
    return rc;
}

int rf_zero3_free(rf_zero3 *z, bool restore) {
    if (!z) return RF_OK;
    int rc = drain(z);
    rf_model *m = z->m;
    if (restore && !rc && z->shard_params) { /* rf_model_adopt_params takes host memory */
        size_t n = z->u[z->nunits - 1].hi;
        float *full = malloc(n * sizeof(float));
        if (!full) rc = rf_fail(RF_ERR_NOMEM, "train: zero 3: no memory to gather the weights");
        if (!rc) rc = rf_zero3_gather(z, 0, full);
        if (!rc) rc = rf_model_adopt_params(m, full);
        free(full);
    }
    if (m->hook == hook && m->hook_user == z) {
        int r = rf_model_set_hook(m, NULL, NULL);
        if (!r) r = rf_model_bind_all(m);
        if (!rc) rc = r;
    }
    free(z->u);
    free(z->own);
    const rf_backend *be = z->be; /* free(NULL) is a no-op on every backend */
    (void)be->free(be, z->p);
    (void)be->free(be, z->g);
    (void)be->free(be, z->m1);
    (void)be->free(be, z->m2);
    (void)be->free(be, z->scalar);
    for (int i = 0; i < 2; i++) {
        (void)be->free(be, z->ps[i].buf);
        (void)be->free(be, z->gs[i].buf);
    }
    (void)be->free(be, z->tmp);
    free(z);
    return rc;
}

int rf_zero3_zero_grad(rf_zero3 *z) {
    int rc = z->be->zero(z->be, z->g, z->S * sizeof *z->g);
    return rc ? rf_fail_ctx(rc, "train: zero 3: zeroing the gradient shard") : RF_OK;
}

int rf_zero3_idle(rf_zero3 *z, bool backward) {
    /* the model's own event sequence (a tied head's extra events included) */
    int rc = rf_model_replay(z->m, 0, z->nunits, backward);
    return z->rc ? z->rc : rc;
}

int rf_zero3_end_backward(rf_zero3 *z) {
    int rc = drain(z);
    return z->rc ? z->rc : rc;
}

static int gather(rf_zero3 *z, int which, float *full, bool on_host);

int rf_zero3_step(rf_zero3 *z, const rf_adamw *o, long step, float lr, float *norm) {
    if (z->rc) return z->rc;
    /* The norm and the clipping stay on the backend, as rf_optim_clipped_adamw:
     * this rank's sum of squares over its real pieces (not the padding) into
     * the scalar, one all-reduce of it there, then AdamW clips with it
     * (rf_adamw_hp.sumsq); the norm comes back for the log once the update
     * is queued. */
    const rf_backend *be = z->be;
    int rc = be->sumsq_into(be, z->scalar, z->g, z->own, (size_t)z->nunits);
    if (!rc) rc = be_wait(z); /* before the all-reduce reads it */
    if (rc) return fail(z, rc, "sum of squares of the gradient", -1);
    z->bytes += 2 * (uint64_t)(z->world - 1) * sizeof(double) / (uint64_t)z->world;
    if ((rc = rf_comm_allreduce(z->c, z->scalar, z->scalar, 1, RF_COMM_F64, RF_COMM_SUM)))
        return fail(z, rc, "all-reduce of the gradient norm", -1);
    const double *ss = o->clip_norm > 0 ? z->scalar : NULL;
    rf_model_blocks mb;
    if ((rc = rf_model_blocks_of(z->m, &mb))) return fail(z, rc, "the model's blocks", -1);
    for (int i = 0; i < z->nunits; i++) {
        const unit *k = &z->u[i];
        size_t n = real_len(z, k), lo = k->lo + (size_t)z->rank * k->b;
        float *p = z->shard_params ? z->p + k->soff : mb.params + lo;
        int rc = n ? rf_optim_adamw_pieces(&mb, o, step, lr, lo, lo + n, p, z->g + k->soff,
                                           z->m1 + k->soff, z->m2 + k->soff, ss)
                   : RF_OK;
        if (rc) return rf_fail_ctx(rc, "train: AdamW on unit %d", i);
    }
    double sum;
    if ((rc = be->to_host(be, &sum, z->scalar, sizeof sum)))
        return fail(z, rc, "reading the gradient norm", -1);
    *norm = (float)sqrt(sum);
    return z->shard_params ? RF_OK : gather(z, 0, mb.params, false);
}

/* The full block `which` (see rf_zero3_gather) into full: host memory with
 * on_host, else backend memory (zero 2's step: m->params). The all-gathers
 * run on a backend buffer of one unit. */
static int gather(rf_zero3 *z, int which, float *full, bool on_host) {
    const rf_backend *be = z->be;
    const float *src = which == 0 ? z->p : which == 1 ? z->m1 : z->m2;
    bool z2 = which == 0 && !z->shard_params; /* zero 2: every rank's pieces of m->params */
    rf_model_blocks mb = {0};
    int rc = z2 ? rf_model_blocks_of(z->m, &mb) : RF_OK;
    /* zero 2 gathers every step: on a device its buffer is kept; otherwise
     * (and zero 3's: checkpoints, the export) it lives for the call */
    bool keep = z2 && z->keep;
    float *tmp = keep && z->tmp ? z->tmp : rc ? NULL : be_alloc(z, z->bmax * (size_t)z->world);
    if (!rc && !tmp) rc = rf_fail(RF_ERR_NOMEM, "train: zero %d: no memory to gather", z2 ? 2 : 3);
    if (keep) z->tmp = tmp;
    if (!rc) rc = be_wait(z); /* AdamW has written the shards */
    for (int i = 0; i < z->nunits && !rc; i++) {
        const unit *k = &z->u[i];
        size_t at = (size_t)z->rank * k->b, s = k->hi - k->lo;
        const float *send = src ? src + k->soff : NULL;
        if (z2) { /* this rank's piece, zero-padded to b, at its place in tmp */
            size_t n = real_len(z, k);
            if ((rc = be->zero(be, tmp + at, k->b * sizeof *tmp)) ||
                (rc = be->copy(be, tmp + at, mb.params + k->lo + at, n * sizeof *tmp)) ||
                (rc = be_wait(z)))
                break;
            send = tmp + at;
        }
        z->bytes += (uint64_t)(z->world - 1) * k->b * sizeof(float);
        if ((rc = rf_comm_allgather(z->c, send, tmp, k->b, RF_COMM_F32))) {
            rc = rf_fail_ctx(rc, "train: zero %d: all-gather of unit %d", z2 ? 2 : 3, i);
        } else if (full) {
            rc = on_host ? be->to_host(be, full + k->lo, tmp, s * sizeof *tmp)
                         : be->copy(be, full + k->lo, tmp, s * sizeof *tmp);
            /* the next unit's all-gather overwrites tmp: the copy must be done */
            if (!rc && !on_host) rc = be_wait(z);
        }
    }
    if (!keep) (void)be->free(be, tmp);
    return rc;
}

int rf_zero3_gather(rf_zero3 *z, int which, float *full) {
    return gather(z, which, full, true);
}

int rf_zero3_scatter(rf_zero3 *z, const float *params, const float *mom1, const float *mom2) {
    const rf_backend *be = z->be;
    const float *src[3] = {params, mom1, mom2};
    float *dst[3] = {z->p, z->m1, z->m2};
    int rc = RF_OK;
    for (int w = 0; w < 3 && !rc; w++) {
        if (!src[w] || !dst[w]) continue;
        for (int i = 0; i < z->nunits && !rc; i++) {
            const unit *k = &z->u[i];
            size_t n = real_len(z, k);
            if (!(rc = be->zero(be, dst[w] + k->soff, k->b * sizeof(float))))
                rc = be->copy(be, dst[w] + k->soff, src[w] + k->lo + (size_t)z->rank * k->b,
                              n * sizeof(float));
        }
    }
    return rc ? rf_fail_ctx(rc, "train: zero 3: copying into the shards") : RF_OK;
}

size_t rf_zero3_piece(const rf_zero3 *z, int u, size_t *lo, size_t *hi, size_t *shard_off) {
    const unit *k = &z->u[u];
    *lo = k->lo + (size_t)z->rank * k->b;
    if (*lo > k->hi) *lo = k->hi;
    *hi = *lo + real_len(z, k);
    *shard_off = k->soff;
    return k->b;
}

void rf_zero3_shards(rf_zero3 *z, float **p, float **m1, float **m2) {
    *p = z->p;
    *m1 = z->m1;
    *m2 = z->m2;
}

int rf_zero3_units(const rf_zero3 *z) {
    return z->nunits;
}

rf_zero3_memory rf_zero3_memory_of(const rf_zero3 *z) {
    return (rf_zero3_memory){z->S, z->peak, z->peak_p};
}

uint64_t rf_zero3_bytes(const rf_zero3 *z) {
    return z->bytes;
}
