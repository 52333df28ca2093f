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
 * unit -1: free. */
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

/* Arithmetic on the shards (zeroing, accumulating the reduced blocks, the
 * norm, clipping, AdamW) goes through the model's backend. The memcpy/memset
 * in gather/scatter and the buffers handed to rf_comm are transport staging:
 * the comm layer moves bytes, it does not compute on model memory. The shard
 * and working buffers are host allocations, so stages 2 and 3 run on host
 * backends (MPI); a device build would allocate them with be->alloc and hand
 * device pointers to NCCL. */
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
    uint64_t seq;
    int rc; /* first error of a hook event */
    uint64_t bytes;
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

static int p_drop(rf_zero3 *z, int i) {
    pslot *s = &z->ps[i];
    if (s->unit < 0) return RF_OK;
    int rc = rf_comm_wait(s->req); /* a pending gather must end before its buffer goes */
    account(z, -(long)(z->u[s->unit].b * (size_t)z->world), 0);
    free(s->buf);
    *s = (pslot){.unit = -1};
    return rc;
}

/* Starts the all-gather of unit u into a free slot; returns the slot. */
static int p_start(rf_zero3 *z, int u, int *slot) {
    int i = z->ps[0].unit < 0 ? 0 : 1;
    if (z->ps[i].unit >= 0) return fail(z, RF_ERR_INVALID, "no free buffer for the all-gather", u);
    const unit *k = &z->u[u];
    size_t n = k->b * (size_t)z->world;
    float *buf = malloc(n * sizeof *buf);
    if (!buf) return fail(z, RF_ERR_NOMEM, "no memory to gather the parameters", u);
    rf_comm_req *req;
    int rc = rf_comm_iallgather(z->c, z->p + k->soff, buf, k->b, RF_COMM_F32, &req);
    if (rc) {
        free(buf);
        return fail(z, rc, "all-gather of the parameters", u);
    }
    z->bytes += (uint64_t)(z->world - 1) * k->b * sizeof(float);
    z->ps[i] = (pslot){u, buf, req};
    account(z, (long)n, 0);
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
 * shard, then frees the slot. */
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
    account(z, 0, -(long)(k->b * (size_t)z->world));
    free(s->buf);
    *s = (gslot){.unit = -1};
    return rc;
}

static int g_begin(rf_zero3 *z, int u) {
    int i = z->gs[0].unit < 0 ? 0 : z->gs[1].unit < 0 ? 1 : z->gs[0].seq < z->gs[1].seq ? 0 : 1;
    int rc = g_finish(z, i);
    if (rc) return rc;
    const unit *k = &z->u[u];
    float *buf = calloc(k->b * (size_t)z->world, sizeof *buf);
    if (!buf) return fail(z, RF_ERR_NOMEM, "no memory for the gradient", u);
    z->gs[i] = (gslot){u, buf, NULL, ++z->seq};
    account(z, 0, (long)(k->b * (size_t)z->world));
    rc = rf_model_bind_unit(z->m, u, NULL, buf);
    return rc ? fail(z, rc, "binding the gradients", u) : RF_OK;
}

static int g_done(rf_zero3 *z, int u) {
    for (int i = 0; i < 2; i++) {
        gslot *s = &z->gs[i];
        if (s->unit != u || s->req) continue;
        const unit *k = &z->u[u];
        int rc = rf_comm_ireduce_scatter(z->c, s->buf, s->buf + (size_t)z->rank * k->b, k->b,
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
    }
    size_t n = z->S ? z->S : 1;
    z->p = shard_params ? calloc(n, sizeof(float)) : NULL;
    z->g = calloc(n, sizeof(float));
    z->m1 = calloc(n, sizeof(float));
    z->m2 = calloc(n, sizeof(float));
    if ((shard_params && !z->p) || !z->g || !z->m1 || !z->m2) {
        rf_zero3_free(z, false);
        return rf_fail(RF_ERR_NOMEM, "train: zero 3: no memory for the shards");
    }
    rf_zero3_scatter(z, mb.params, NULL, NULL); /* host backends; the moments start at 0 */
    if ((rc = rf_model_release_blocks(m, shard_params)) || (rc = rf_model_set_hook(m, hook, z))) {
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
    if (restore && !rc && z->shard_params) {
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
    free(z->p);
    free(z->g);
    free(z->m1);
    free(z->m2);
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

int rf_zero3_step(rf_zero3 *z, const rf_adamw *o, long step, float lr, float *norm) {
    if (z->rc) return z->rc;
    /* The norm and the clipping run on the backend, like rf_clip_grads_ex:
     * this rank's sum of squares over its real pieces (not the padding), then
     * one all-reduce of the scalar. */
    const rf_backend *be = z->be;
    double ss = 0;
    for (int i = 0; i < z->nunits; i++) {
        const unit *k = &z->u[i];
        size_t n = real_len(z, k);
        double part = 0;
        int rc = n ? be->sumsq(be, &part, z->g + k->soff, n) : RF_OK;
        if (rc) return fail(z, rc, "sum of squares of the gradient", i);
        ss += part;
    }
    z->bytes += 2 * (uint64_t)(z->world - 1) * sizeof ss / (uint64_t)z->world;
    int rc = rf_comm_allreduce(z->c, &ss, &ss, 1, RF_COMM_F64, RF_COMM_SUM);
    if (rc) return fail(z, rc, "all-reduce of the gradient norm", -1);
    *norm = (float)sqrt(ss);
    float coef = o->clip_norm / (*norm + 1e-6f); /* as rf_clip_grads */
    if (o->clip_norm > 0 && coef < 1.0f && (rc = be->scale(be, z->g, z->S, coef)))
        return fail(z, rc, "clipping of the gradient", -1);
    rf_model_blocks mb;
    if ((rc = rf_model_blocks_of(z->m, &mb))) return fail(z, rc, "the model's blocks", -1);
    for (int i = 0; i < z->nunits; i++) {
        const unit *k = &z->u[i];
        size_t n = real_len(z, k), lo = k->lo + (size_t)z->rank * k->b;
        float *p = z->shard_params ? z->p + k->soff : mb.params + lo;
        int rc = n ? rf_optim_adamw_pieces(&mb, o, step, lr, lo, lo + n, p, z->g + k->soff,
                                           z->m1 + k->soff, z->m2 + k->soff)
                   : RF_OK;
        if (rc) return rf_fail_ctx(rc, "train: AdamW on unit %d", i);
    }
    return z->shard_params ? RF_OK : rf_zero3_gather(z, 0, mb.params);
}

int rf_zero3_gather(rf_zero3 *z, int which, float *full) {
    const float *src = which == 0 ? z->p : which == 1 ? z->m1 : z->m2;
    if (which == 0 && !z->shard_params) { /* zero 2: every rank's updated pieces of m->params */
        rf_model_blocks mb;
        int rc = rf_model_blocks_of(z->m, &mb);
        for (int i = 0; i < z->nunits && !rc; i++) {
            const unit *k = &z->u[i];
            size_t n = real_len(z, k), at = (size_t)z->rank * k->b, s = k->hi - k->lo;
            float *tmp = calloc(k->b * (size_t)z->world, sizeof *tmp);
            if (!tmp) return rf_fail(RF_ERR_NOMEM, "train: zero 2: no memory to gather");
            memcpy(tmp + at, mb.params + k->lo + at, n * sizeof *tmp);
            z->bytes += (uint64_t)(z->world - 1) * k->b * sizeof(float);
            rc = rf_comm_allgather(z->c, tmp + at, tmp, k->b, RF_COMM_F32);
            if (rc)
                rc = rf_fail_ctx(rc, "train: zero 2: all-gather of unit %d", i);
            else if (full)
                memcpy(full + k->lo, tmp, s * sizeof *tmp);
            free(tmp);
        }
        return rc;
    }
    size_t maxb = 0;
    for (int i = 0; i < z->nunits; i++)
        maxb = z->u[i].b > maxb ? z->u[i].b : maxb;
    float *tmp = malloc((maxb ? maxb : 1) * (size_t)z->world * sizeof *tmp);
    if (!tmp) return rf_fail(RF_ERR_NOMEM, "train: zero 3: no memory to gather");
    int rc = RF_OK;
    for (int i = 0; i < z->nunits && !rc; i++) {
        const unit *k = &z->u[i];
        z->bytes += (uint64_t)(z->world - 1) * k->b * sizeof(float);
        if ((rc = rf_comm_allgather(z->c, src + k->soff, tmp, k->b, RF_COMM_F32)))
            rc = rf_fail_ctx(rc, "train: zero 3: all-gather of unit %d", i);
        else if (full)
            memcpy(full + k->lo, tmp, (k->hi - k->lo) * sizeof *tmp);
    }
    free(tmp);
    return rc;
}

void rf_zero3_scatter(rf_zero3 *z, const float *params, const float *mom1, const float *mom2) {
    const float *src[3] = {params, mom1, mom2};
    float *dst[3] = {z->p, z->m1, z->m2};
    for (int w = 0; w < 3; w++) {
        if (!src[w] || !dst[w]) continue;
        for (int i = 0; i < z->nunits; i++) {
            const unit *k = &z->u[i];
            size_t n = real_len(z, k);
            memset(dst[w] + k->soff, 0, k->b * sizeof(float));
            memcpy(dst[w] + k->soff, src[w] + k->lo + (size_t)z->rank * k->b, n * sizeof(float));
        }
    }
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
