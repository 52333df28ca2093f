/* The trainer on a dp x tp x pp mesh: see parallel.h. */
#include "trainer/parallel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "trainer/checkpoint.h"
#include "trainer/model_tp.h"
#include "trainer/optim.h"
#include "trainer/pipeline.h"
#include "trainer/tp.h"
#include "trainer/train_int.h"

/* A pipeline stage: units [u0, u1), the range [lo, hi) of the (tp-local) flat
 * block they occupy. */
typedef struct stage_units {
    int u0, u1;
    size_t lo, hi;
} stage_units;

/* One micro-batch of the step (a dp rank's slice of a batch, cut into the
 * `microbatches` pieces): sequences idx[0..n), padded to T. */
typedef struct piece {
    const size_t *idx;
    int n, T;
    uint64_t seed; /* the batch's dropout seed */
    double w;      /* loss denominator of its rows (class weights, or predicted tokens) */
    double share;  /* the weight of its mean loss in the step's loss sum */
    float scale;   /* loss scale of its backward */
} piece;

/* Per-step time of this rank (seconds). */
typedef struct step_times {
    double step, compute, comm, bubble, wait, bubble_frac;
} step_times;

/* A boundary buffer of the pool (cb_alloc). */
typedef struct bbuf {
    float *p;
    size_t cap; /* floats */
    bool used;
} bbuf;

typedef struct mesh {
    const rf_train_opts *o;
    const rf_dataset *data;
    rf_model *m; /* the caller's model: instance 0 */
    rf_model_info info;
    bool causal, tied, bert;
    rf_comm *world; /* NULL: one process */
    rf_comm_mesh cm;
    bool cm_made;
    int rank, nworld, dp, tp, pp, zero, M;
    int dp_i, tp_i, pp_i;
    const float *cw; /* class weights of the loss, NULL: none */
    int units;
    stage_units *st; /* every stage's, pp entries */
    int u0, u1;      /* this rank's stage */
    /* the stage's blocks: P and G hold [plo, phi) of the local flat block
     * (S floats; padded to dp * blk at zero 1/2 for the collectives), the
     * moments [plo, phi) at zero 0 and the rank's dp shard [slo, shi) of it
     * (stage coordinates) at zero 1/2 */
    size_t nlocal, plo, phi, S, blk, slo, shi, nmom;
    float *P, *G, *M1, *M2;
    /* a tied LM head on a last stage without unit 0: unit 0's parameters
     * [elo, ehi) (E) and the head's gradient of them (EG); stage 0 receives
     * that gradient into tmp */
    float *E, *EG, *tmp;
    size_t elo, ehi;
    bool has_copy;
    rf_model **inst; /* one instance per micro-batch in flight */
    rf_batch_buf *bb;
    int ninst;
    /* where the local block lies in the whole model (tp spans, or one) */
    const rf_tp_span *spans;
    size_t nspans;
    rf_tp_span one;
    /* what of G this rank counts in the gradient norm: its shard [slo, shi)
     * of the stage, a tp span replicated on every tp rank only on tp rank 0;
     * stage coordinates (own_pieces) */
    rf_param_span *own;
    size_t nown;
    const rf_tensor_info *gtab; /* the whole model's table */
    size_t ngtab, gnp;
    rf_model_blocks lb; /* the local table and the backend (the optimizer's spans) */
    /* The stage's blocks (P, G, M1, M2, E, EG, tmp) are memory of the
     * model's backend be, which the host reads and writes only through its
     * slots. On a device (staged: any backend but the CPU) checkpoints and
     * the final gather go through host copies; dp_dev and pp_dev carry the
     * collectives on the blocks (the NCCL twins of cm's dp and pp groups when
     * be->device_memory, else cm's own groups). A staged stage's pipeline
     * boundaries are backend memory too (pool, cb_alloc), moved over pp_dev
     * by the paired executor (pipeline.h: NCCL runs a rank's sends and
     * receives in the order issued, which the overlapped executor's early
     * receives would deadlock); the CPU's are host memory on the overlapped
     * one. tp_dev carries the tp ops' all-reduces (model_tp.h: the model's
     * split borrows it). */
    const rf_backend *be;
    bool staged;
    void *sync;   /* staged: a few bytes of backend memory that dev_wait reads */
    bool ordered; /* the device groups wait for the backend's queue on the device */
    rf_comm *dp_dev, *pp_dev, *tp_dev;
    /* the gradient norm's all-reduce over every rank: the world's NCCL twin
     * on device memory, else the world (NULL: one process); its sum of
     * squares lies in ss, one double of backend memory, where AdamW's
     * clipping reads it (rf_optim_adamw_pieces) */
    rf_comm *world_dev;
    double *ss;
    bbuf *pool; /* staged: the boundary buffers, free when not used */
    int npool, cappool;
    /* the step in progress */
    piece *pc;
    int npc, cappc;
    double loss_sum, tokens;
    uint64_t bytes; /* ring-model bytes this rank sent (collectives and pipeline sends) */
    /* measuring the units' costs (partition) */
    bool probing, probe_bwd, seen;
    int cur;
    double t_last, *acc;
} mesh;

static int fail_comm(int rc, const char *what) {
    return rf_fail_ctx(rc, "train: %s", what);
}

static uint64_t ring_allreduce(int n, size_t bytes) {
    return n > 1 ? 2 * (uint64_t)(n - 1) * bytes / (uint64_t)n : 0;
}

static int world_allreduce(mesh *x, void *buf, size_t n, rf_comm_dtype t, rf_comm_op op) {
    if (!x->world) return RF_OK;
    x->bytes += ring_allreduce(x->nworld, n * rf_comm_dtype_size(t));
    int rc = rf_comm_allreduce(x->world, buf, buf, n, t, op);
    return rc ? fail_comm(rc, "all-reduce over the group") : RF_OK;
}

/* n floats of backend memory (zeroed), or NULL. */
static float *dev_alloc(const mesh *x, size_t n) {
    return rf_backend_alloc(x->be, (n ? n : 1) * sizeof(float));
}

/* Waits for the work queued on a device backend (to_host waits for it,
 * backend.h): before a collective reads what its kernels wrote, and between
 * the probe's timings. */
static int dev_wait(const mesh *x) {
    if (!x->staged) return RF_OK;
    uint8_t b;
    int rc = x->be->to_host(x->be, &b, x->sync, 1);
    return rc ? rf_fail_ctx(rc, "train: waiting for the device") : RF_OK;
}

/* Before a collective or a pipeline transfer reads what the backend's
 * kernels wrote (or writes what they read): nothing when the device groups
 * are ordered after the backend's queue (device_groups: the transfer's
 * stream waits for it on the device), else dev_wait. */
static int coll_wait(const mesh *x) {
    return x->ordered ? RF_OK : dev_wait(x);
}

/* The unit hook of every instance: it lets the causal models run backward
 * into gradient views bound from outside (their check for a hook), and while
 * probing it charges the time between two events to the unit of the first
 * (a tied head's events for unit 0 count as the head's). */
static int mesh_hook(void *user, int u, rf_unit_event ev, int next) {
    (void)ev, (void)next;
    mesh *x = user;
    if (!x->probing) return RF_OK;
    int rc = dev_wait(x); /* a device's kernels run asynchronously: charge them */
    if (rc) return rc;
    double t = rf_now();
    if (x->tied && u == 0 && (x->probe_bwd ? !x->seen : x->seen)) u = x->units - 1;
    if (u > 0) x->seen = true;
    if (x->cur >= 0) x->acc[x->cur] += t - x->t_last;
    x->cur = u;
    x->t_last = t;
    return RF_OK;
}

static void probe_mark_end(mesh *x) {
    (void)dev_wait(x); /* (a failure shows at the next call) */
    if (x->cur >= 0) x->acc[x->cur] += rf_now() - x->t_last;
    x->cur = -1;
    x->seen = false;
}

static rf_model_batch batch_of(const mesh *x, const rf_batch_buf *bb) {
    rf_model_batch b = {.B = bb->B,
                        .T = bb->T,
                        .ids = bb->ids,
                        .valid = bb->valid,
                        .labels = bb->labels,
                        .types = bb->types};
    if (x->causal) {
        b.pos = bb->pos;
        b.seg = bb->seg;
    }
    return b;
}

/* Every unit's forward + backward seconds (cost[units]) on one piece of the
 * first sequences, the least of 2 runs on each rank, summed over the world
 * so that every rank has the same numbers. Runs on the (tp-split) model's
 * own blocks, before the stages are set up. */
static int probe_costs(mesh *x, double *cost) {
    int U = x->units, rc;
    size_t k = (size_t)x->o->batch_size / ((size_t)x->dp * (size_t)x->M);
    k = k < 1 ? 1 : k > x->data->n ? x->data->n : k;
    size_t *idx = malloc(k * sizeof *idx);
    x->acc = calloc((size_t)U, sizeof *x->acc);
    rf_batch_buf bb = {0};
    if (!idx || !x->acc) {
        free(idx);
        return RF_ERR_NOMEM;
    }
    for (size_t i = 0; i < k; i++)
        idx[i] = i;
    rc = rf_model_enable_training(x->m, x->nlocal, 1);
    if (!rc) rc = rf_batch_collate(&bb, x->data, idx, (int)k);
    for (int round = 0; round < 2 && !rc; round++) {
        rf_model_batch b = batch_of(x, &bb);
        memset(x->acc, 0, (size_t)U * sizeof *x->acc);
        x->cur = -1;
        x->seen = false;
        x->probe_bwd = false;
        x->probing = true;
        rc = rf_model_forward(x->m, &b, false, 0);
        probe_mark_end(x);
        x->probe_bwd = true;
        if (!rc) rc = rf_model_backward(x->m, 1.0f);
        probe_mark_end(x);
        x->probing = false;
        for (int u = 0; u < U; u++)
            cost[u] = round == 0 || x->acc[u] < cost[u] ? x->acc[u] : cost[u];
    }
    rf_batch_buf_free(&bb);
    free(idx);
    free(x->acc);
    x->acc = NULL;
    int r = rf_model_release_blocks(x->m, false);
    if (!rc) rc = r;
    if (!rc) rc = world_allreduce(x, cost, (size_t)U, RF_COMM_F64, RF_COMM_SUM);
    return rc;
}

/* The contiguous split of L layers into p stages (each >= 1 layer; the
 * embeddings' cost c[0] on the first, the head's c[L+1] on the last) whose
 * slowest stage is fastest. */
static int balance(const double *c, int L, int p, int *layers) {
    double *best = malloc((size_t)(p + 1) * (L + 1) * sizeof *best);
    int *arg = malloc((size_t)(p + 1) * (L + 1) * sizeof *arg);
    double *pre = malloc((size_t)(L + 1) * sizeof *pre);
    if (!best || !arg || !pre) {
        free(best), free(arg), free(pre);
        return RF_ERR_NOMEM;
    }
    pre[0] = 0;
    for (int l = 0; l < L; l++)
        pre[l + 1] = pre[l] + c[1 + l];
#define BEST(s, b) best[(size_t)(s) * (L + 1) + (b)]
#define ARG(s, b)  arg[(size_t)(s) * (L + 1) + (b)]
    for (int s = 0; s <= p; s++)
        for (int b = 0; b <= L; b++)
            BEST(s, b) = INFINITY;
    BEST(0, 0) = 0;
    for (int s = 1; s <= p; s++)
        for (int b = s; b <= L; b++)
            for (int a = s - 1; a < b; a++) {
                if (!isfinite(BEST(s - 1, a))) continue;
                double cost = pre[b] - pre[a] + (a == 0 ? c[0] : 0) + (b == L ? c[L + 1] : 0);
                double v = BEST(s - 1, a) > cost ? BEST(s - 1, a) : cost;
                if (v < BEST(s, b)) {
                    BEST(s, b) = v;
                    ARG(s, b) = a;
                }
            }
    for (int s = p, b = L; s >= 1; s--) {
        int a = ARG(s, b);
        layers[s - 1] = b - a;
        b = a;
    }
#undef BEST
#undef ARG
    free(best), free(arg), free(pre);
    return RF_OK;
}

/* The stage table from the layers of each stage. */
static int make_stages(mesh *x, const int *layers) {
    int L = x->info.layers, a = 0, rc = RF_OK;
    if (!(x->st = calloc((size_t)x->pp, sizeof *x->st))) return RF_ERR_NOMEM;
    for (int s = 0; s < x->pp && !rc; s++) {
        stage_units *t = &x->st[s];
        t->u0 = s == 0 ? 0 : 1 + a;
        t->u1 = s == x->pp - 1 ? L + 2 : 1 + a + layers[s];
        a += layers[s];
        size_t lo, hi, prev = 0;
        for (int u = t->u0; u < t->u1 && !rc; u++) {
            if ((rc = rf_model_unit_range(x->m, u, &lo, &hi))) break;
            if (u == t->u0)
                t->lo = lo;
            else if (lo != prev)
                rc = rf_fail(RF_ERR_INVALID, "train: the units of a %s model are not contiguous",
                             x->info.arch);
            prev = hi;
        }
        t->hi = prev;
    }
    return rc;
}

/* ---- the pipeline's callbacks ---- */

static size_t cb_boundary(void *user, int edge, int micro) {
    mesh *x = user;
    const piece *p = &x->pc[micro];
    return rf_model_boundary(x->m, p->n, p->T, x->st[edge + 1].u0);
}

/* The paired executor's boundary buffers on a staged stage (pipeline.h):
 * backend memory from a pool, so that a step reuses the last step's buffers
 * instead of allocating (cudaFree waits for the whole device). */
static float *cb_alloc(void *user, size_t n) {
    mesh *x = user;
    int best = -1;
    for (int i = 0; i < x->npool; i++)
        if (!x->pool[i].used && x->pool[i].cap >= n &&
            (best < 0 || x->pool[i].cap < x->pool[best].cap))
            best = i;
    if (best < 0) {
        if (x->npool == x->cappool) {
            int nc = x->cappool ? 2 * x->cappool : 8;
            bbuf *pl = realloc(x->pool, (size_t)nc * sizeof *pl);
            if (!pl) {
                rf_fail(RF_ERR_NOMEM, "train: no memory for the boundary pool");
                return NULL;
            }
            x->pool = pl;
            x->cappool = nc;
        }
        float *p = dev_alloc(x, n);
        if (!p) {
            rf_fail(RF_ERR_NOMEM, "train: no %s memory for a boundary of %zu floats", x->be->name,
                    n);
            return NULL;
        }
        x->pool[best = x->npool++] = (bbuf){p, n, false};
    }
    x->pool[best].used = true;
    return x->pool[best].p;
}

static void cb_release(void *user, float *p) {
    mesh *x = user;
    for (int i = 0; i < x->npool; i++)
        if (x->pool[i].p == p) x->pool[i].used = false;
}

static int cb_forward(void *user, int micro, const float *in, float *out) {
    mesh *x = user;
    const piece *p = &x->pc[micro];
    int k = micro % x->ninst;
    rf_batch_buf *bb = &x->bb[k];
    int rc = rf_batch_collate(bb, x->data, p->idx, p->n);
    if (rc) return rc;
    rf_model_batch b = batch_of(x, bb);
    /* in and out: host memory on the CPU, the backend's on a staged stage
     * (cb_alloc), where out must be complete before the executor sends it */
    if ((rc =
             rf_model_forward_range(x->inst[k], &b, x->u0, x->u1, in, out, x->o->dropout, p->seed)))
        return rc;
    if ((rc = coll_wait(x))) return rc;
    if (x->pp_i == 0 && x->tp_i == 0)
        for (size_t i = 0; i < (size_t)bb->B * bb->T; i++)
            x->tokens += bb->valid[i];
    if (x->u1 < x->units) return RF_OK;
    float loss;
    long counted;
    if ((rc = rf_model_loss(x->inst[k], &loss, &counted))) return rc;
    if (x->causal && counted != (long)p->w)
        return rf_fail(RF_ERR_INVALID,
                       "train: the model counted %ld predicted tokens, the data %.0f", counted,
                       p->w);
    if (x->tp_i == 0) x->loss_sum += (double)loss * p->share;
    return RF_OK;
}

static int cb_backward(void *user, int micro, const float *in, const float *dout, float *din) {
    (void)in;
    mesh *x = user;
    int rc = rf_model_backward_range(x->inst[micro % x->ninst], x->u0, x->u1, dout, din,
                                     x->pc[micro].scale);
    /* din complete, and dout no longer read: the executor hands them to a
     * transfer or back to the pool (pipeline.h) */
    return rc ? rc : coll_wait(x);
}

/* The step's pieces: batches [pos, ...) of `order`, `group` of them. One
 * dropout seed per batch is drawn from rng whether or not this rank has rows
 * of it, as every rank and one process draw them. */
static int build_pieces(mesh *x, const size_t *order, size_t n, size_t pos, size_t group, size_t B,
                        rf_rng *rng) {
    double w_step = 0;
    for (size_t k = 0, at = pos; x->causal && k < group; k++) {
        size_t nb = n - at < B ? n - at : B;
        w_step += rf_train_batch_weight(x->data, order + at, nb, NULL);
        at += nb;
    }
    x->npc = 0;
    for (size_t k = 0, at = pos; k < group; k++) {
        size_t nb = n - at < B ? n - at : B;
        uint64_t seed = rf_rng_next(rng);
        size_t a = nb * (size_t)x->dp_i / (size_t)x->dp;
        size_t e = nb * (size_t)(x->dp_i + 1) / (size_t)x->dp;
        double wg = x->causal ? w_step : rf_train_batch_weight(x->data, order + at, nb, x->cw);
        for (int j = 0; j < x->M; j++) {
            size_t pa = a + (e - a) * (size_t)j / (size_t)x->M;
            size_t pe = a + (e - a) * (size_t)(j + 1) / (size_t)x->M;
            if (pe == pa) continue;
            const size_t *idx = order + at + pa;
            double wp = rf_train_batch_weight(x->data, idx, pe - pa, x->causal ? NULL : x->cw);
            if (!(wp > 0) || !(wg > 0)) continue; /* adds nothing (train.c skips it too) */
            if (x->npc == x->cappc) {
                int nc = x->cappc ? 2 * x->cappc : 16;
                piece *pc = realloc(x->pc, (size_t)nc * sizeof *pc);
                if (!pc) return RF_ERR_NOMEM;
                x->pc = pc;
                x->cappc = nc;
            }
            int T = 1;
            for (size_t i = 0; i < pe - pa; i++)
                if ((int)x->data->len[idx[i]] > T) T = (int)x->data->len[idx[i]];
            piece *p = &x->pc[x->npc++];
            p->idx = idx;
            p->n = (int)(pe - pa);
            p->T = T;
            p->seed = seed;
            p->w = wp;
            p->share = wp / wg;
            p->scale = x->causal ? (float)(wp / w_step) : (float)(wp / wg / (double)group);
        }
        at += nb;
    }
    return RF_OK;
}

/* ---- after the pipeline: gradient sync, norm, AdamW ---- */

/* The pieces of G whose squares this rank counts in the norm (see own):
 * fixed once the stage and the shard are, so built once, by setup_stage. */
static int own_pieces(mesh *x) {
    size_t lo = x->plo + x->slo, hi = x->plo + x->shi;
    x->nown = 0;
    if (!(x->own = malloc((x->nspans ? x->nspans : 1) * sizeof *x->own)))
        return rf_fail(RF_ERR_NOMEM, "train: no memory for the gradient norm's spans");
    for (size_t k = 0; k < x->nspans; k++) {
        const rf_tp_span *sp = &x->spans[k];
        if (sp->replicated && x->tp_i != 0) continue;
        size_t a = sp->local > lo ? sp->local : lo;
        size_t b = sp->local + sp->n < hi ? sp->local + sp->n : hi;
        if (a < b) x->own[x->nown++] = (rf_param_span){a - x->plo, b - a, false};
    }
    return RF_OK;
}

static int sync_and_update(mesh *x, const rf_adamw *opt, long step, float lr, float *norm,
                           double *t_comm, double *t_opt) {
    int rc = RF_OK;
    double t0 = rf_now();
    size_t ne = x->ehi - x->elo;
    /* the tied head's part of the word embedding's gradient, to stage 0 */
    const rf_backend *be = x->be;
    if ((rc = coll_wait(x))) return rc; /* the backward's gradients, before they travel */
    if (x->tied && x->pp > 1) {
        if (x->pp_i == x->pp - 1) {
            x->bytes += ne * sizeof(float);
            if ((rc = rf_comm_send(x->pp_dev, x->EG, ne, RF_COMM_F32, 0)))
                return fail_comm(rc, "send of the tied embedding's gradient");
        } else if (x->pp_i == 0) {
            if ((rc = rf_comm_recv(x->pp_dev, x->tmp, ne, RF_COMM_F32, x->pp - 1)))
                return fail_comm(rc, "receive of the tied embedding's gradient");
            if ((rc = be->residual_bwd(be, x->G + (x->elo - x->plo), NULL, x->tmp, ne, 0.0f, 0)) ||
                (rc = coll_wait(x)))
                return rc;
        }
    }
    /* the data-parallel sync, once per step */
    if (x->dp > 1) {
        if (x->zero < 2) {
            x->bytes += ring_allreduce(x->dp, x->S * sizeof(float));
            rc = rf_comm_allreduce(x->dp_dev, x->G, x->G, x->S, RF_COMM_F32, RF_COMM_SUM);
        } else {
            x->bytes += (uint64_t)(x->dp - 1) * x->blk * sizeof(float);
            rc = rf_comm_reduce_scatter(x->dp_dev, x->G, x->G + (size_t)x->dp_i * x->blk, x->blk,
                                        RF_COMM_F32, RF_COMM_SUM);
        }
        if (rc) return fail_comm(rc, "data-parallel gradient sync");
    }
    /* The norm and the clipping stay where the gradients are: the sum of
     * squares of what this rank counts (its dp shard of its stage's block,
     * replicated tp spans on tp rank 0 only) into ss, summed over every rank
     * there, and AdamW clips with it as rf_optim_clip would, on what this
     * rank updates; the norm comes back for the log once the update is
     * queued. */
    if ((rc = be->sumsq_into(be, x->ss, x->G, x->own, x->nown))) return rc;
    if (x->world_dev) {
        if ((rc = coll_wait(x))) return rc; /* the sum, before the all-reduce reads it */
        x->bytes += ring_allreduce(x->nworld, sizeof(double));
        if ((rc = rf_comm_allreduce(x->world_dev, x->ss, x->ss, 1, RF_COMM_F64, RF_COMM_SUM)))
            return fail_comm(rc, "all-reduce of the gradient norm");
    }
    double t1 = rf_now();
    size_t alo = x->zero ? x->slo : 0, ahi = x->zero ? x->shi : x->S;
    if (ahi > alo &&
        (rc = rf_optim_adamw_pieces(&x->lb, opt, step, lr, x->plo + alo, x->plo + ahi, x->P + alo,
                                    x->G + alo, x->M1, x->M2, opt->clip_norm > 0 ? x->ss : NULL)))
        return rc;
    double s;
    if ((rc = be->to_host(be, &s, x->ss, sizeof s))) return rc;
    *norm = (float)sqrt(s);
    double t2 = rf_now();
    if ((rc = coll_wait(x))) return rc; /* AdamW's parameters, before they travel */
    if (x->zero && x->dp > 1) {
        x->bytes += (uint64_t)(x->dp - 1) * x->blk * sizeof(float);
        rc = rf_comm_allgather(x->dp_dev, x->P + (size_t)x->dp_i * x->blk, x->P, x->blk,
                               RF_COMM_F32);
        if (rc) return fail_comm(rc, "all-gather of the parameters");
    }
    /* the updated word embedding, to the tied head's stage */
    if (x->tied && x->pp > 1) {
        if (x->pp_i == 0) {
            x->bytes += ne * sizeof(float);
            rc = rf_comm_send(x->pp_dev, x->P + (x->elo - x->plo), ne, RF_COMM_F32, x->pp - 1);
        } else if (x->pp_i == x->pp - 1) {
            rc = rf_comm_recv(x->pp_dev, x->E, ne, RF_COMM_F32, 0);
        }
        if (rc) return fail_comm(rc, "exchange of the tied embedding");
    }
    *t_comm += (t1 - t0) + (rf_now() - t2);
    *t_opt += t2 - t1;
    return RF_OK;
}

/* ---- checkpoints in the whole model's coordinates ---- */

/* Pieces of the spans inside local [lo, hi) (skipping replicated spans when
 * `own` and tp rank > 0), params at P (element plo) and moments at M1/M2
 * (element mo) when asked. */
static int span_pieces_at(const mesh *x, size_t lo, size_t hi, bool own, float *pbase, size_t plo,
                          bool moments, size_t mo, rf_ckpt_piece **pc, size_t *n, size_t *cap) {
    for (size_t k = 0; k < x->nspans; k++) {
        const rf_tp_span *sp = &x->spans[k];
        if (own && sp->replicated && x->tp_i != 0) continue;
        size_t a = sp->local > lo ? sp->local : lo;
        size_t b = sp->local + sp->n < hi ? sp->local + sp->n : hi;
        if (a >= b) continue;
        if (*n == *cap) {
            size_t nc = *cap ? 2 * *cap : 64;
            rf_ckpt_piece *p = realloc(*pc, nc * sizeof *p);
            if (!p) return RF_ERR_NOMEM;
            *pc = p;
            *cap = nc;
        }
        size_t g = sp->global + (a - sp->local);
        (*pc)[(*n)++] =
            (rf_ckpt_piece){g, g + (b - a), pbase ? pbase + (a - plo) : NULL,
                            moments ? x->M1 + (a - mo) : NULL, moments ? x->M2 + (a - mo) : NULL};
    }
    return RF_OK;
}

/* As span_pieces_at with the stage's parameters P (element plo). */
static int span_pieces(const mesh *x, size_t lo, size_t hi, bool own, bool params, bool moments,
                       size_t mo, rf_ckpt_piece **pc, size_t *n, size_t *cap) {
    return span_pieces_at(x, lo, hi, own, params ? x->P : NULL, x->plo, moments, mo, pc, n, cap);
}

static size_t moment_base(const mesh *x) {
    return x->zero ? x->plo + x->slo : x->plo;
}

/* On a device, checkpoints read and write host copies of the stage's
 * parameters, moments and tied copy: mirror_open swaps them into x (the
 * device pointers kept in dev), read from the device when `read`;
 * mirror_close writes them back to the device when `write`, swaps the device
 * pointers back and frees the copies. On the CPU backend both do nothing. */
typedef struct mirror {
    float *P, *M1, *M2, *E;
} mirror;

static int mirror_close(mesh *x, mirror *dev, bool write) {
    if (!x->staged) return RF_OK;
    const rf_backend *be = x->be;
    size_t ne = x->has_copy ? x->ehi - x->elo : 0;
    int rc = RF_OK;
    if (write) {
        rc = be->to_device(be, dev->P, x->P, x->S * sizeof(float));
        if (!rc) rc = be->to_device(be, dev->M1, x->M1, x->nmom * sizeof(float));
        if (!rc) rc = be->to_device(be, dev->M2, x->M2, x->nmom * sizeof(float));
        if (!rc && ne) rc = be->to_device(be, dev->E, x->E, ne * sizeof(float));
    }
    free(x->P), free(x->M1), free(x->M2), free(x->E);
    x->P = dev->P, x->M1 = dev->M1, x->M2 = dev->M2, x->E = dev->E;
    return rc ? rf_fail_ctx(rc, "train: the stage's blocks back to the device") : RF_OK;
}

static int mirror_open(mesh *x, mirror *dev, bool read) {
    if (!x->staged) return RF_OK;
    const rf_backend *be = x->be;
    size_t ne = x->has_copy ? x->ehi - x->elo : 0;
    *dev = (mirror){x->P, x->M1, x->M2, x->E};
    x->P = calloc(x->S ? x->S : 1, sizeof(float));
    x->M1 = calloc(x->nmom ? x->nmom : 1, sizeof(float));
    x->M2 = calloc(x->nmom ? x->nmom : 1, sizeof(float));
    x->E = ne ? calloc(ne, sizeof(float)) : NULL;
    int rc = !x->P || !x->M1 || !x->M2 || (ne && !x->E) ? RF_ERR_NOMEM : RF_OK;
    if (!rc && read) {
        rc = be->to_host(be, x->P, dev->P, x->S * sizeof(float));
        if (!rc) rc = be->to_host(be, x->M1, dev->M1, x->nmom * sizeof(float));
        if (!rc) rc = be->to_host(be, x->M2, dev->M2, x->nmom * sizeof(float));
        if (!rc && ne) rc = be->to_host(be, x->E, dev->E, ne * sizeof(float));
    }
    if (rc) {
        (void)mirror_close(x, dev, false);
        return rf_fail_ctx(rc, "train: host copies of the stage's blocks");
    }
    return RF_OK;
}

/* Every rank writes its shard of what x holds (host memory); rank 0 commits
 * once all are written. */
static int mesh_save_pieces(mesh *x, const rf_train_state *st) {
    rf_ckpt_piece *pc = NULL;
    size_t npc = 0, cap = 0;
    size_t mo = moment_base(x);
    int rc =
        span_pieces(x, x->plo + x->slo, x->plo + x->shi, true, true, true, mo, &pc, &npc, &cap);
    rf_model_blocks gb = {.be = x->lb.be,
                          .tensors = x->gtab,
                          .ntensors = x->ngtab,
                          .nparams = x->gnp,
                          .npadded = x->gnp,
                          .nmoments = x->gnp};
    uint64_t mine[3] = {0, 0, 0};
    if (!rc)
        rc = rf_ckpt_write_shard(x->o->out_dir, &gb, st, x->rank, x->nworld, pc, npc, &mine[1],
                                 &mine[2]);
    free(pc);
    if (!x->world)
        return rc ? rc : rf_ckpt_commit(x->o->out_dir, x->gnp, st, 1, x->zero, &mine[1], &mine[2]);
    mine[0] = rc != RF_OK;
    uint64_t *all = malloc(3 * (size_t)x->nworld * sizeof *all);
    if (!all) return RF_ERR_NOMEM;
    x->bytes += (uint64_t)(x->nworld - 1) * sizeof mine;
    int crc = rf_comm_allgather(x->world, mine, all, 3, RF_COMM_I64);
    if (crc) {
        free(all);
        return fail_comm(crc, "exchange of the checkpoint shards");
    }
    for (int w = 0; w < x->nworld && !rc; w++)
        if (all[3 * w])
            rc = rf_fail(RF_ERR_IO, "train: rank %d could not write its checkpoint shard", w);
    if (!rc && x->rank == 0) {
        uint64_t *sizes = malloc(2 * (size_t)x->nworld * sizeof *sizes);
        if (!sizes) rc = RF_ERR_NOMEM;
        for (int w = 0; w < x->nworld && !rc; w++) {
            sizes[w] = all[3 * w + 1];
            sizes[x->nworld + w] = all[3 * w + 2];
        }
        if (!rc)
            rc = rf_ckpt_commit(x->o->out_dir, x->gnp, st, x->nworld, x->zero, sizes,
                                sizes + x->nworld);
        free(sizes);
    }
    free(all);
    return rc;
}

/* The checkpoint of this step (mesh_save_pieces), through host copies on a
 * device. */
static int mesh_save(mesh *x, const rf_train_state *st) {
    mirror dev;
    int rc = mirror_open(x, &dev, true);
    if (rc) return rc;
    rc = mesh_save_pieces(x, st);
    int mrc = mirror_close(x, &dev, false);
    return rc ? rc : mrc;
}

/* Reads a checkpoint of any layout into what this rank holds (host memory). */
static int mesh_load_pieces(mesh *x, const char *path, rf_train_state *st) {
    rf_ckpt_piece *pc = NULL;
    size_t npc = 0, cap = 0;
    size_t mo = moment_base(x), mhi = x->zero ? x->plo + x->shi : x->phi;
    int rc = span_pieces(x, x->plo, x->phi, false, true, false, 0, &pc, &npc, &cap);
    if (!rc) rc = span_pieces(x, mo, mhi, false, false, true, mo, &pc, &npc, &cap);
    if (!rc && x->has_copy) /* the tied head's copy of unit 0 (local [elo, ehi)) */
        rc = span_pieces_at(x, x->elo, x->ehi, false, x->E, x->elo, false, 0, &pc, &npc, &cap);
    if (!rc) rc = rf_checkpoint_load_pieces(path, x->gnp, st, pc, npc);
    free(pc);
    return rc;
}

/* Reads a checkpoint (mesh_load_pieces), through host copies on a device. */
static int mesh_load(mesh *x, const char *path, rf_train_state *st) {
    mirror dev;
    int rc = mirror_open(x, &dev, false);
    if (rc) return rc;
    rc = mesh_load_pieces(x, path, st);
    int mrc = mirror_close(x, &dev, !rc);
    return rc ? rc : mrc;
}

/* ---- the whole model back into m (collective) ---- */

static int gather_whole(mesh *x) {
    float *full = calloc(x->nlocal ? x->nlocal : 1, sizeof *full);
    if (!full) return RF_ERR_NOMEM;
    int rc = x->be->to_host(x->be, full + x->plo, x->P, x->S * sizeof(float));
    for (int s = 0; s < x->pp && x->pp > 1 && !rc; s++)
        if ((rc = rf_comm_broadcast(x->cm.pp_comm, full + x->st[s].lo, x->st[s].hi - x->st[s].lo,
                                    RF_COMM_F32, s)))
            rc = fail_comm(rc, "broadcast of a pipeline stage's parameters");
    if (!rc && x->tp > 1) {
        float *all = malloc((size_t)x->tp * x->nlocal * sizeof *all);
        float *whole = calloc(x->gnp, sizeof *whole);
        rc = all && whole ? RF_OK : RF_ERR_NOMEM;
        if (!rc && (rc = rf_comm_allgather(x->cm.tp_comm, full, all, x->nlocal, RF_COMM_F32)))
            rc = fail_comm(rc, "all-gather of the tensor-parallel shards");
        for (int r = 0; r < x->tp && !rc; r++) {
            rf_tp_span *sp;
            size_t ns;
            if ((rc = rf_model_tp_spans_of(x->m, r, &sp, &ns))) break;
            for (size_t k = 0; k < ns; k++)
                memcpy(whole + sp[k].global, all + (size_t)r * x->nlocal + sp[k].local,
                       sp[k].n * sizeof(float));
            free(sp);
        }
        if (!rc) rc = rf_model_tp_merge(x->m, whole);
        free(all);
        free(whole);
    } else if (!rc) {
        rc = rf_model_adopt_params(x->m, full);
    }
    free(full);
    return rc;
}

/* ---- set-up ---- */

/* The checks that need no communication: every rank makes the same ones on
 * the same arguments, so all fail together before any work. */
static int check_mesh(mesh *x, const rf_model_blocks *mb) {
    const rf_train_opts *o = x->o;
    rf_tr_parallel par = {.dp = 1,
                          .tp = x->tp,
                          .pp = x->pp,
                          .zero = o->zero,
                          .microbatches = x->M,
                          .nstages = o->nstages};
    memcpy(par.stages, o->stages, sizeof par.stages);
    if (x->nworld % (x->tp * x->pp))
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel: tp %d x pp %d does not divide the group's %d rank(s)",
                       x->tp, x->pp, x->nworld);
    par.dp = x->nworld / (x->tp * x->pp);
    int rc = rf_tr_parallel_check_world(&par, x->nworld);
    if (rc) return rc;
    if (x->tp > 1 && (rc = rf_model_tp_check(x->m, x->tp)))
        return rf_fail_ctx(rc, "trainer.parallel.tp %d", x->tp);
    if (x->bert)
        rc = rf_tr_parallel_check_model(&par, &((const rf_bert *)x->m->impl)->cfg, o->batch_size);
    else
        rc = rf_tr_parallel_check_layers(&par, x->info.layers, o->batch_size);
    if (rc) return rc;
    if (o->zero == 3)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "trainer.parallel: zero 3 runs on whole batches of the data-parallel "
                       "path; microbatches %d needs zero 0, 1 or 2",
                       x->M);
    if (o->on_checkpoint || o->on_checkpoint_model)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "train: per-checkpoint callbacks (the trainer service's) need the whole "
                       "model on rank 0, which a tp/pp mesh does not keep; train with dp only");
    x->dp = par.dp;
    return RF_OK;
}

/* The instances, the stage blocks and their binding; m's own blocks are
 * released (the stage's replace them). */
static int setup_stage(mesh *x, size_t accum) {
    rf_model_blocks mb;
    int rc = rf_model_blocks_of(x->m, &mb);
    if (rc) return rc;
    const stage_units *t = &x->st[x->pp_i];
    x->u0 = t->u0;
    x->u1 = t->u1;
    x->plo = t->lo;
    x->phi = t->hi;
    x->S = t->hi - t->lo;
    /* the rank's dp shard: what it updates at zero 1/2, and at every stage
     * what it counts in the norm and writes to checkpoints (once per element) */
    x->blk = (x->S + (size_t)x->dp - 1) / (size_t)x->dp;
    x->slo = (size_t)x->dp_i * x->blk;
    x->shi = x->slo + x->blk;
    if (x->slo > x->S) x->slo = x->S;
    if (x->shi > x->S) x->shi = x->S;
    size_t alloc = x->zero ? x->blk * (size_t)x->dp : x->S;
    x->nmom = x->zero ? x->blk : x->S;
    x->P = dev_alloc(x, alloc);
    x->G = dev_alloc(x, alloc);
    x->M1 = dev_alloc(x, x->nmom);
    x->M2 = dev_alloc(x, x->nmom);
    if (!x->P || !x->G || !x->M1 || !x->M2)
        return rf_fail(RF_ERR_NOMEM, "train: no %s memory for the stage's blocks", x->be->name);
    if ((rc = x->be->copy(x->be, x->P, mb.params + x->plo, x->S * sizeof(float)))) return rc;
    if (x->tied && x->pp > 1 && (x->pp_i == 0 || x->pp_i == x->pp - 1)) {
        if ((rc = rf_model_unit_range(x->m, 0, &x->elo, &x->ehi))) return rc;
        size_t ne = x->ehi - x->elo;
        if (x->pp_i == 0) {
            if (!(x->tmp = dev_alloc(x, ne))) return RF_ERR_NOMEM;
        } else {
            x->E = dev_alloc(x, ne);
            x->EG = dev_alloc(x, ne);
            if (!x->E || !x->EG) return RF_ERR_NOMEM;
            if ((rc = x->be->copy(x->be, x->E, mb.params + x->elo, ne * sizeof(float)))) return rc;
            x->has_copy = true;
        }
    }
    /* at most pp - stage micro-batches in flight (pipeline.h) */
    size_t most = accum * (size_t)x->M;
    x->ninst =
        x->pp > 1 ? (int)((size_t)(x->pp - x->pp_i) < most ? (size_t)(x->pp - x->pp_i) : most) : 1;
    x->inst = calloc((size_t)x->ninst, sizeof *x->inst);
    x->bb = calloc((size_t)x->ninst, sizeof *x->bb);
    if (!x->inst || !x->bb) return RF_ERR_NOMEM;
    x->inst[0] = x->m;
    for (int k = 1; k < x->ninst && !rc; k++) {
        if ((rc = rf_model_sibling(x->m, &x->inst[k]))) break;
        if (!(rc = rf_model_release_blocks(x->inst[k], true)))
            rc = rf_model_set_hook(x->inst[k], mesh_hook, x);
        if (!rc) rc = rf_model_set_class_weights(x->inst[k], x->cw);
    }
    if (!rc) rc = rf_model_release_blocks(x->m, true);
    for (int k = 0; k < x->ninst && !rc; k++) {
        for (int u = x->u0; u < x->u1 && !rc; u++) {
            size_t lo, hi;
            if (!(rc = rf_model_unit_range(x->m, u, &lo, &hi)))
                rc = rf_model_bind_unit(x->inst[k], u, x->P + (lo - x->plo), x->G + (lo - x->plo));
        }
        if (!rc && x->has_copy) rc = rf_model_bind_unit(x->inst[k], 0, x->E, x->EG);
    }
    if (!rc) rc = rf_model_blocks_of(x->m, &x->lb); /* the local table stays */
    if (!rc) rc = own_pieces(x);
    return rc;
}

static void free_mesh(mesh *x) {
    for (int k = 1; x->inst && k < x->ninst; k++)
        rf_model_free(x->inst[k]);
    for (int k = 0; x->bb && k < x->ninst; k++)
        rf_batch_buf_free(&x->bb[k]);
    if (x->m && x->m->hook == mesh_hook) (void)rf_model_set_hook(x->m, NULL, NULL);
    free(x->inst), free(x->bb);
    const rf_backend *be = x->be;
    float *blocks[] = {x->P, x->G, x->M1, x->M2, x->E, x->EG, x->tmp};
    for (size_t i = 0; be && i < sizeof blocks / sizeof blocks[0]; i++)
        rf_backend_free(be, blocks[i]);
    for (int i = 0; be && i < x->npool; i++)
        rf_backend_free(be, x->pool[i].p);
    free(x->pool);
    if (be) {
        rf_backend_free(be, x->sync);
        rf_backend_free(be, x->ss);
    }
    free(x->pc), free(x->st), free(x->own);
    if (x->dp_dev != x->cm.dp_comm) (void)rf_comm_destroy(x->dp_dev);
    if (x->pp_dev != x->cm.pp_comm) (void)rf_comm_destroy(x->pp_dev);
    if (x->tp_dev != x->cm.tp_comm) (void)rf_comm_destroy(x->tp_dev);
    if (x->world_dev != x->world) (void)rf_comm_destroy(x->world_dev);
    if (x->cm_made) (void)rf_comm_mesh_destroy(&x->cm);
}

/* One line per optimizer step in metrics.jsonl (rank 0). */
static void write_metrics(FILE *f, uint64_t step, double loss, float lr, float norm, double tokens,
                          uint64_t bytes, const step_times *mean, double bubble_max,
                          double theory) {
    if (!f) return;
    fprintf(f,
            "{\"step\":%llu,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens\":%llu,"
            "\"tokens_per_s\":%.1f,\"comm_bytes\":%llu,\"step_s\":%.6f,\"compute_s\":%.6f,"
            "\"comm_s\":%.6f,\"bubble_s\":%.6f,\"wait_s\":%.6f,\"bubble\":%.4f,"
            "\"bubble_max\":%.4f,\"bubble_theory\":%.4f}\n",
            (unsigned long long)step, loss, (double)lr, (double)norm, (unsigned long long)tokens,
            mean->step > 0 ? tokens / mean->step : 0, (unsigned long long)bytes, mean->step,
            mean->compute, mean->comm, mean->bubble, mean->wait, mean->bubble_frac, bubble_max,
            theory);
    fflush(f);
}

static int write_summary(const mesh *x, const rf_train_result *r, const size_t mem[3],
                         const step_times *tot, long steps_timed, double bubble_max,
                         double theory_mean, const int *layers) {
    const rf_train_opts *o = x->o;
    char path[4096];
    rf_buf b = RF_BUF_INIT;
    double n = steps_timed > 0 ? (double)steps_timed : 1;
    snprintf(path, sizeof path, "%s/train.json", o->out_dir);
    int rc = rf_buf_printf(
        &b,
        "{\"steps\":%ld,\"finished\":%s,\"resumed\":%s,\"last_loss\":%.6f,"
        "\"seconds\":%.3f,\"tokens\":%llu,\"tokens_per_s\":%.1f,"
        "\"epochs\":%d,\"batch_size\":%d,\"grad_accum\":%d,\"lr\":%g,"
        "\"seed\":%llu,\"peak_rss_kb\":%lld,\"world\":%d,\"zero\":%d,"
        "\"mesh\":{\"dp\":%d,\"tp\":%d,\"pp\":%d,\"microbatches\":%d,\"stages\":[",
        r->steps, r->finished ? "true" : "false", r->resumed ? "true" : "false", r->last_loss,
        r->seconds, (unsigned long long)r->tokens, r->tokens_per_s, o->epochs, o->batch_size,
        o->grad_accum, o->optim.lr, (unsigned long long)o->seed, (long long)rf_peak_rss_kb(),
        x->nworld, x->zero, x->dp, x->tp, x->pp, x->M);
    for (int s = 0; s < x->pp && !rc; s++)
        rc = rf_buf_printf(&b, "%s{\"layers\":%d,\"units\":[%d,%d]}", s ? "," : "", layers[s],
                           x->st[s].u0, x->st[s].u1);
    if (!rc)
        rc = rf_buf_printf(
            &b,
            "]},\"per_step\":{\"steps\":%ld,\"step_s\":%.6f,\"compute_s\":%.6f,"
            "\"comm_s\":%.6f,\"bubble_s\":%.6f,\"wait_s\":%.6f,\"bubble\":%.4f,"
            "\"bubble_max\":%.4f,"
            "\"bubble_theory\":%.4f,\"comm_bytes\":%.0f},"
            "\"memory\":{\"params_bytes\":%zu,\"grads_bytes\":%zu,"
            "\"moments_bytes\":%zu,\"working_peak_bytes\":0}}\n",
            steps_timed, tot->step / n, tot->compute / n, tot->comm / n, tot->bubble / n,
            tot->wait / n, tot->bubble_frac / n, bubble_max, theory_mean / n,
            (double)r->comm_bytes / (double)(r->steps ? r->steps : 1), mem[0], mem[1], mem[2]);
    if (!rc) rc = rf_write_file_atomic(path, b.data, b.len);
    rf_buf_free(&b);
    return rc;
}

/* Rank 0's weights to every rank over the host group: a device's through a
 * host copy (once, before training). */
static int share_weights(mesh *x, const rf_model_blocks *mb) {
    size_t n = mb->nparams;
    float *h = x->staged ? malloc((n ? n : 1) * sizeof *h) : mb->params;
    if (!h) return rf_fail(RF_ERR_NOMEM, "train: no memory to stage the initial weights");
    int rc = x->staged ? x->be->to_host(x->be, h, mb->params, n * sizeof *h) : RF_OK;
    if (!rc && (rc = rf_comm_broadcast(x->world, h, n, RF_COMM_F32, 0)))
        rc = fail_comm(rc, "broadcast of the initial weights");
    if (!rc && x->staged) rc = x->be->to_device(x->be, mb->params, h, n * sizeof *h);
    if (x->staged) free(h);
    return rc;
}

/* The groups that carry the stage's blocks and the tp ops' activations: on
 * device memory, NCCL twins of the mesh's dp, pp and tp groups (those of more
 * than one rank); else the groups themselves. */
static int device_groups(mesh *x) {
    x->dp_dev = x->cm.dp_comm;
    x->pp_dev = x->cm.pp_comm;
    x->tp_dev = x->cm.tp_comm;
    x->world_dev = x->world;
    if (!x->be->device_memory) return RF_OK;
    int rc = RF_OK;
    if ((rc = rf_comm_dup_mem(x->world, RF_COMM_DEVICE, &x->world_dev))) {
        x->world_dev = x->world;
        return rf_fail_ctx(rc, "train: the gradient norm's group on %s memory", x->be->name);
    }
    if (x->dp > 1 && (rc = rf_comm_dup_mem(x->cm.dp_comm, RF_COMM_DEVICE, &x->dp_dev))) {
        x->dp_dev = x->cm.dp_comm;
        return rf_fail_ctx(rc, "train: the data-parallel group on %s memory", x->be->name);
    }
    if (x->pp > 1 && (rc = rf_comm_dup_mem(x->cm.pp_comm, RF_COMM_DEVICE, &x->pp_dev))) {
        x->pp_dev = x->cm.pp_comm;
        return rf_fail_ctx(rc, "train: the pipeline group on %s memory", x->be->name);
    }
    if (x->tp > 1 && (rc = rf_comm_dup_mem(x->cm.tp_comm, RF_COMM_DEVICE, &x->tp_dev))) {
        x->tp_dev = x->cm.tp_comm;
        return rf_fail_ctx(rc, "train: the tensor-parallel group on %s memory", x->be->name);
    }
    /* the NCCL twins' operations wait for the backend's queue on the device,
     * so the host does not wait for it before each one (coll_wait) */
    rf_comm *twins[] = {x->dp_dev, x->pp_dev, x->tp_dev, x->world_dev},
            *mine[] = {x->cm.dp_comm, x->cm.pp_comm, x->cm.tp_comm, x->world};
    for (int i = 0; x->be->queue && i < 4; i++)
        if (twins[i] != mine[i] && (rc = rf_comm_order_after(twins[i], x->be->queue)))
            return rf_fail_ctx(rc, "train: ordering the device groups after the %s queue",
                               x->be->name);
    x->ordered = x->be->queue != NULL;
    rf_info("trainer", "rank %d: dp, pp and tp collectives on %s memory by %s", x->rank,
            x->be->name,
            rf_comm_backend_name(x->pp > 1   ? x->pp_dev
                                 : x->tp > 1 ? x->tp_dev
                                             : x->dp_dev));
    return RF_OK;
}

int rf_train_mesh(const rf_train_opts *o, const rf_dataset *data, rf_model *m,
                  rf_train_result *res) {
    memset(res, 0, sizeof *res);
    mesh X = {0}, *x = &X;
    x->o = o;
    x->data = data;
    x->m = m;
    x->info = rf_model_info_of(m);
    x->units = x->info.units;
    x->causal = x->info.task == RF_TASK_CAUSAL_LM;
    x->bert = strcmp(x->info.arch ? x->info.arch : "", "bert") == 0;
    x->tp = o->tp > 1 ? o->tp : 1;
    x->pp = o->pp > 1 ? o->pp : 1;
    x->M = o->microbatches > 1 ? o->microbatches : 1;
    x->zero = o->zero;
    x->nworld = o->comm ? rf_comm_world(o->comm) : 1;
    x->world = x->nworld > 1 ? o->comm : NULL;
    x->cur = -1;
    rf_model_blocks mb;
    int rc = rf_model_blocks_of(m, &mb);
    if (rc) return rc;
    if ((rc = check_mesh(x, &mb))) return rc;
    x->be = mb.be;
    x->staged = mb.be != rf_backend_cpu();
    if (x->staged && !(x->sync = rf_backend_alloc(x->be, 64)))
        return rf_fail(RF_ERR_NOMEM, "train: no %s memory", x->be->name);
    /* the pipeline stage holding the head holds the tied embedding's copy */
    x->tied = x->info.tied;
    if ((rc = rf_mkdir_p(o->out_dir)))
        return rf_fail_ctx(rc, "train: cannot create %s", o->out_dir);

    size_t n = data->n, B = (size_t)o->batch_size, accum = (size_t)o->grad_accum;
    size_t micro_per_epoch = (n + B - 1) / B;
    long steps_per_epoch = (long)((micro_per_epoch + accum - 1) / accum);
    long total = o->max_steps > 0 ? o->max_steps : steps_per_epoch * o->epochs;
    rf_adamw opt = o->optim;
    opt.total_steps = total;
    if (opt.warmup_steps < 0) opt.warmup_steps = (long)ceil(o->warmup_ratio * (double)total);
    int K = x->info.num_labels;
    float cw[K > 0 ? K : 1];
    bool weighted;
    if ((rc = rf_train_class_weights(o, data, K, cw, &weighted))) return rc;
    x->cw = weighted ? cw : NULL;
    if ((rc = rf_model_set_class_weights(m, x->cw))) return rc;
    rf_train_state st = {0};
    rf_rng_seed(&st.rng, o->seed);
    st.ident = rf_train_run_ident(data, o, &opt, x->cw, K);

    /* the norm's sum of squares, the groups, rank 0's weights everywhere, the
     * tp split */
    if (!(x->ss = rf_backend_alloc(x->be, sizeof(double)))) {
        rc = rf_fail(RF_ERR_NOMEM, "train: no %s memory", x->be->name);
        free_mesh(x);
        return rc;
    }
    if (x->world) {
        rf_tr_parallel par = {x->dp, x->tp, x->pp, x->zero, x->M, 0, {0}};
        if ((rc = rf_tr_mesh_init(x->world, &par, &x->cm))) {
            free_mesh(x);
            return rc;
        }
        x->cm_made = true;
        x->rank = rf_comm_rank(x->world);
        x->dp_i = x->cm.dp_i, x->tp_i = x->cm.tp_i, x->pp_i = x->cm.pp_i;
        x->bytes += mb.nparams * sizeof(float);
        if ((rc = share_weights(x, &mb))) {
            free_mesh(x);
            return rc;
        }
        if ((rc = device_groups(x))) {
            free_mesh(x);
            return rc;
        }
    }
    if (mb.grads) rc = rf_model_release_blocks(m, false);
    if (!rc && x->tp > 1)
        rc = rf_model_tp_split(m, x->cm.tp_comm, x->tp_dev != x->cm.tp_comm ? x->tp_dev : NULL);
    if (!rc) rc = rf_model_blocks_of(m, &mb);
    if (!rc) rc = rf_model_set_hook(m, mesh_hook, x);
    if (rc) {
        free_mesh(x);
        return rc;
    }
    x->nlocal = mb.nparams;
    if (x->tp > 1) {
        const struct rf_bert_tp *t = rf_model_tp_ctx(m);
        x->spans = t->spans;
        x->nspans = t->nspans;
        x->gtab = t->full;
        x->ngtab = t->nfull;
        x->gnp = t->nparams_full;
    } else {
        x->one = (rf_tp_span){0, 0, x->nlocal, false};
        x->spans = &x->one;
        x->nspans = 1;
        x->gtab = mb.tensors;
        x->ngtab = mb.ntensors;
        x->gnp = x->nlocal;
    }

    /* the stages: given, or balanced by the measured cost of each unit */
    int L = x->info.layers;
    int *layers = calloc((size_t)x->pp, sizeof *layers);
    if (!layers) rc = RF_ERR_NOMEM;
    if (!rc && o->nstages) {
        memcpy(layers, o->stages, (size_t)x->pp * sizeof *layers);
    } else if (!rc && x->pp == 1) {
        layers[0] = L;
    } else if (!rc) {
        double *cost = calloc((size_t)x->units, sizeof *cost);
        rc = cost ? probe_costs(x, cost) : RF_ERR_NOMEM;
        if (!rc) rc = balance(cost, L, x->pp, layers);
        if (!rc && x->rank == 0) {
            char line[1024];
            int at = 0;
            for (int u = 0; u < x->units && at < (int)sizeof line - 32; u++)
                at += snprintf(line + at, sizeof line - (size_t)at, "%s%.2f", u ? " " : "",
                               1e3 * cost[u] / (double)x->nworld);
            rf_info("trainer", "unit costs (ms, forward + backward, mean over ranks): %s", line);
        }
        free(cost);
    }
    if (!rc) rc = make_stages(x, layers);
    if (!rc) rc = setup_stage(x, accum);
    if (rc) {
        free(layers);
        free_mesh(x);
        return rc;
    }
    if (x->rank == 0) {
        char line[1024];
        int at = 0;
        for (int s = 0; s < x->pp && at < (int)sizeof line - 48; s++)
            at += snprintf(line + at, sizeof line - (size_t)at, "%s%d layer(s) = units [%d, %d)",
                           s ? ", " : "", layers[s], x->st[s].u0, x->st[s].u1);
        rf_info("trainer",
                "mesh dp %d x tp %d x pp %d, zero %d, %d micro-batch(es) per batch; "
                "stages (%s): %s",
                x->dp, x->tp, x->pp, x->zero, x->M,
                o->nstages  ? "given"
                : x->pp > 1 ? "balanced by measured cost"
                            : "one",
                line);
    }

    char ckpt[4096];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.bin", o->out_dir);
    struct stat sb;
    if (o->resume && stat(ckpt, &sb) == 0) {
        if ((rc = mesh_load(x, ckpt, &st))) {
            free(layers);
            free_mesh(x);
            return rc;
        }
        res->resumed = true;
        rf_info("trainer", "resumed from %s at step %llu (epoch %llu, position %llu)", ckpt,
                (unsigned long long)st.step, (unsigned long long)st.epoch,
                (unsigned long long)st.pos);
    }
    if (x->world) { /* the ranks must resume from the same step (a shared output directory) */
        int64_t lohi[2] = {res->resumed ? (int64_t)st.step + 1 : 0, 0};
        lohi[1] = -lohi[0];
        rc = world_allreduce(x, lohi, 2, RF_COMM_I64, RF_COMM_MAX);
        if (!rc && lohi[0] != -lohi[1])
            rc = rf_fail(RF_ERR_INVALID,
                         "train: the ranks found different checkpoints in %s (steps %lld and "
                         "%lld; 0 = none): the output directory must be shared by all ranks",
                         o->out_dir, (long long)-lohi[1] - 1, (long long)lohi[0] - 1);
        if (rc) {
            free(layers);
            free_mesh(x);
            return rc;
        }
    }
    size_t alloc = x->zero ? x->blk * (size_t)x->dp : x->S, ne = x->has_copy ? x->ehi - x->elo : 0;
    size_t mem[3] = {(alloc + ne) * sizeof(float), (alloc + ne) * sizeof(float),
                     2 * x->nmom * sizeof(float)};
    rf_info("trainer",
            "rank %d of %d (pid %d): dp %d tp %d pp %d, stage units [%d, %d), floats [%zu, %zu) "
            "of %zu local, %zu whole; %d instance(s)",
            x->rank, x->nworld, (int)getpid(), x->dp_i, x->tp_i, x->pp_i, x->u0, x->u1, x->plo,
            x->phi, x->nlocal, x->gnp, x->ninst);
    rf_info("trainer",
            "rank %d memory: params %zu B, grads %zu B, moments %zu B (%.2f + %.2f + %.2f MiB; "
            "%zu parameters)",
            x->rank, mem[0], mem[1], mem[2], (double)mem[0] / 1048576.0, (double)mem[1] / 1048576.0,
            (double)mem[2] / 1048576.0, x->gnp);
    FILE *metrics = NULL;
    if (x->rank == 0 && !(metrics = rf_train_open_metrics(o->out_dir, res->resumed, st.step))) {
        free(layers);
        free_mesh(x);
        return rf_fail(RF_ERR_IO, "train: cannot open %s/metrics.jsonl", o->out_dir);
    }
    size_t *order = malloc(n * sizeof *order);
    if (!order) rc = RF_ERR_NOMEM;

    /* a staged stage: the paired executor on backend memory over pp_dev
     * (NCCL on a GPU: pipeline.h); the CPU: the overlapped one, host memory */
    rf_pp_stage stage = {.user = x,
                         .boundary = cb_boundary,
                         .forward = cb_forward,
                         .backward = cb_backward,
                         .paired = x->staged,
                         .alloc = x->staged ? cb_alloc : NULL,
                         .release = x->staged ? cb_release : NULL};
    double t0 = rf_now(), win_loss = 0;
    long win_n = 0, done_this_run = 0, timed = 0;
    uint64_t tokens = 0, bytes_before = x->bytes;
    step_times tot = {0};
    double bubble_max_all = 0, theory_sum = 0;
    bool stop = false;
    uint64_t max_epochs = o->max_steps > 0 ? UINT64_MAX : (uint64_t)o->epochs;
    while (!rc && !stop && (long)st.step < total && st.epoch < max_epochs) {
        if ((rc = rf_train_epoch_order(o, data, K, st.epoch, order))) break;
        while (!rc && !stop && st.pos < n && (long)st.step < total) {
            double ts = rf_now(), tp_s0;
            rf_tp_comm_stats(&tp_s0, NULL, NULL);
            size_t left = n - st.pos, group = (left + B - 1) / B;
            if (group > accum) group = accum;
            rc =
                x->be->zero(x->be, x->G, (x->zero ? x->blk * (size_t)x->dp : x->S) * sizeof(float));
            if (!rc && x->EG) rc = x->be->zero(x->be, x->EG, (x->ehi - x->elo) * sizeof(float));
            if (rc) break;
            x->loss_sum = x->tokens = 0;
            if ((rc = build_pieces(x, order, n, st.pos, group, B, &st.rng))) break;
            rf_pp_stats ps = {0};
            uint64_t tp_b0;
            rf_tp_comm_stats(NULL, &tp_b0, NULL);
            if (x->npc > 0 && (rc = rf_pp_run(x->pp > 1 ? x->pp_dev : NULL, x->npc, &stage, &ps)))
                break;
            double tp_s1;
            uint64_t tp_b1;
            rf_tp_comm_stats(&tp_s1, &tp_b1, NULL);
            x->bytes += ps.bytes_sent + (tp_b1 - tp_b0);
            for (size_t k = 0; k < group; k++) {
                size_t nb = n - st.pos < B ? n - st.pos : B;
                st.pos += nb;
                st.micro++;
            }
            float gn = 0, lr = rf_adamw_lr(&opt, (long)st.step);
            double t_comm = 0, t_opt = 0;
            if ((rc = sync_and_update(x, &opt, (long)st.step, lr, &gn, &t_comm, &t_opt))) break;
            step_times me = {.step = rf_now() - ts,
                             .compute = ps.compute_s - (tp_s1 - tp_s0) + t_opt,
                             .comm = (tp_s1 - tp_s0) + t_comm,
                             .bubble = ps.recv_s + ps.flush_s,
                             .wait = ps.align_s,
                             .bubble_frac = ps.bubble};
            st.step++;
            done_this_run++;
            if (st.pos >= n) {
                st.epoch++;
                st.pos = 0;
            }
            /* the step's loss and tokens, the ranks' times, the stop flag */
            double sums[8] = {x->loss_sum, x->tokens, me.step, me.compute,
                              me.comm,     me.bubble, me.wait, me.bubble_frac};
            double maxs[2] = {me.bubble_frac, o->cancel && *o->cancel ? 1.0 : 0.0};
            if ((rc = world_allreduce(x, sums, 8, RF_COMM_F64, RF_COMM_SUM)) ||
                (rc = world_allreduce(x, maxs, 2, RF_COMM_F64, RF_COMM_MAX)))
                break;
            double w = (double)x->nworld;
            step_times mean = {sums[2] / w, sums[3] / w, sums[4] / w,
                               sums[5] / w, sums[6] / w, sums[7] / w};
            double step_loss = x->causal ? sums[0] : sums[0] / (double)group;
            double theory = x->pp > 1 ? rf_pp_bubble_theory(x->pp, x->npc > 0 ? x->npc : 1) : 0;
            win_loss += x->causal ? step_loss : sums[0];
            win_n += x->causal ? 1 : (long)group;
            tokens += (uint64_t)sums[1];
            write_metrics(metrics, st.step, step_loss, lr, gn, sums[1], x->bytes - bytes_before,
                          &mean, maxs[0], theory);
            bytes_before = x->bytes;
            tot.step += mean.step, tot.compute += mean.compute, tot.comm += mean.comm;
            tot.bubble += mean.bubble, tot.wait += mean.wait, tot.bubble_frac += mean.bubble_frac;
            theory_sum += theory;
            if (maxs[0] > bubble_max_all) bubble_max_all = maxs[0];
            timed++;
            bool stop_now = (o->stop_after > 0 && done_this_run >= o->stop_after) || maxs[1] > 0;
            if (o->log_every > 0 && ((long)st.step % o->log_every == 0 || (long)st.step == total)) {
                double dt = rf_now() - t0;
                res->last_loss = win_loss / (double)(win_n ? win_n : 1);
                rf_info("trainer",
                        "step %llu/%ld epoch %llu loss %.4f lr %.3g grad_norm %.3f %.0f tokens/s "
                        "bubble %.3f (theory %.3f)",
                        (unsigned long long)st.step, total, (unsigned long long)st.epoch,
                        res->last_loss, lr, gn, dt > 0 ? (double)tokens / dt : 0, mean.bubble_frac,
                        theory);
                win_loss = 0;
                win_n = 0;
            }
            bool scheduled =
                (o->checkpoint_every > 0 && (long)st.step % o->checkpoint_every == 0) ||
                (long)st.step == total;
            if (scheduled || stop_now) rc = mesh_save(x, &st);
            if (stop_now) stop = true;
            if (st.pos == 0) break; /* epoch finished: reshuffle */
        }
    }
    if (win_n) res->last_loss = win_loss / (double)win_n;
    res->steps = (long)st.step;
    res->seconds = rf_now() - t0;
    res->tokens = tokens;
    res->tokens_per_s = res->seconds > 0 ? (double)tokens / res->seconds : 0;
    res->finished = !rc && (long)st.step >= total;
    res->comm_bytes = x->bytes;
    if (!rc) rc = gather_whole(x); /* m: the whole model again, on every rank */
    if (metrics) fclose(metrics);
    free(order);
    if (x->world)
        rf_info("trainer", "rank %d: %llu bytes sent (collectives and pipeline), peak RSS %lld KiB",
                x->rank, (unsigned long long)x->bytes, (long long)rf_peak_rss_kb());
    if (!rc && x->rank == 0)
        rc = write_summary(x, res, mem, &tot, timed, bubble_max_all, theory_sum, layers);
    free(layers);
    free_mesh(x);
    return rc;
}
