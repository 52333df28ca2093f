#include "trainer/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/sys.h"
#include "common/obs.h"
#include "trainer/checkpoint.h"
#include "trainer/lm_data.h"
#include "trainer/parallel.h"
#include "trainer/train_int.h"
#include "trainer/zero3.h"
#include "comm/comm.h"

void rf_set_threads(int n) {
    rf_backend_cpu_set_threads(n);
}

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void epoch_order(size_t *order, size_t n, bool shuffle, uint64_t seed, uint64_t epoch) {
    rf_rng r;
    rf_rng_seed(&r, mix(seed ^ mix(epoch + 1)));
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    if (!shuffle) return;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rf_rng_below(&r, i);
        size_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
}

/* The balanced sampler's classes: member indices grouped by label in data
 * order (idx), class c at idx[start[c] .. start[c+1]), and the labels present. */
typedef struct class_index {
    size_t *idx, *start;
    int *present, npresent;
} class_index;

static int class_index_build(class_index *ci, const rf_dataset *d, int K) {
    ci->idx = malloc((d->n ? d->n : 1) * sizeof *ci->idx);
    ci->start = calloc((size_t)K + 1, sizeof *ci->start);
    ci->present = malloc((size_t)K * sizeof *ci->present);
    ci->npresent = 0;
    if (!ci->idx || !ci->start || !ci->present) return RF_ERR_NOMEM;
    for (size_t i = 0; i < d->n; i++)
        ci->start[d->label[i] + 1]++;
    for (int c = 0; c < K; c++) {
        if (ci->start[c + 1]) ci->present[ci->npresent++] = c;
        ci->start[c + 1] += ci->start[c];
    }
    size_t *fill = calloc((size_t)K, sizeof *fill);
    if (!fill) return RF_ERR_NOMEM;
    for (size_t i = 0; i < d->n; i++)
        ci->idx[ci->start[d->label[i]] + fill[d->label[i]]++] = i;
    free(fill);
    return RF_OK;
}

static void class_index_free(class_index *ci) {
    free(ci->idx);
    free(ci->start);
    free(ci->present);
}

/* sampler: balanced. n draws with replacement: a class uniformly among those
 * present, then a uniform member of it, so every class fills about the same
 * share of each epoch (PyTorch's WeightedRandomSampler with weights
 * 1/count[label], replacement=True). Seeded by (seed, epoch) like the shuffle. */
static void balanced_order(size_t *order, size_t n, const class_index *ci, uint64_t seed,
                           uint64_t epoch) {
    rf_rng r;
    rf_rng_seed(&r, mix(seed ^ mix(epoch + 1) ^ 0x62616c616e6365ull));
    for (size_t i = 0; i < n; i++) {
        int c = ci->present[rf_rng_below(&r, (uint64_t)ci->npresent)];
        size_t cnt = ci->start[c + 1] - ci->start[c];
        order[i] = ci->idx[ci->start[c] + (size_t)rf_rng_below(&r, cnt)];
    }
}

int rf_train_epoch_order(const rf_train_opts *o, const rf_dataset *d, int K, uint64_t epoch,
                         size_t *order) {
    if (!o->balanced_sampler) {
        epoch_order(order, d->n, o->shuffle, o->seed, epoch);
        return RF_OK;
    }
    class_index ci = {0};
    int rc = class_index_build(&ci, d, K);
    if (!rc) balanced_order(order, d->n, &ci, o->seed, epoch);
    class_index_free(&ci);
    return rc;
}

/* The checkpoint identity of a run (see rf_train_ident): every sequence's
 * tokens and label in order, and the options that shape the trajectory with
 * the schedule as resolved (total and warmup steps) and the class weights as
 * resolved (cw, K floats; NULL leaves the identity as it was before weights
 * existed, so unweighted checkpoints still resume). Thread count, logging and
 * checkpoint cadence are left out: they do not change what is computed. */
static rf_train_ident run_ident(const rf_dataset *d, const rf_train_opts *o, const rf_adamw *a,
                                const float *cw, int K) {
    rf_train_ident id = {rf_hash64(&d->n, sizeof d->n, 0), 0};
    for (size_t i = 0; i < d->n; i++) {
        id.data = rf_hash64(d->tokens + d->start[i], d->len[i] * sizeof *d->tokens, id.data);
        id.data = rf_hash64(&d->label[i], sizeof d->label[i], id.data);
        if (d->tflags) id.data = rf_hash64(d->tflags + d->start[i], d->len[i], id.data);
    }
    float f[] = {a->lr, a->beta1, a->beta2, a->eps, a->weight_decay, a->clip_norm};
    uint64_t u[] = {(uint64_t)a->total_steps,
                    (uint64_t)a->warmup_steps,
                    (uint64_t)o->batch_size,
                    (uint64_t)o->grad_accum,
                    o->seed,
                    o->shuffle,
                    o->dropout};
    id.opts = rf_hash64(u, sizeof u, rf_hash64(f, sizeof f, 0));
    if (cw) id.opts = rf_hash64(cw, (size_t)K * sizeof *cw, id.opts ^ 0x636c617373ull);
    if (o->balanced_sampler) id.opts = rf_hash64("balanced", 8, id.opts);
    return id;
}

int rf_train_class_weights(const rf_train_opts *o, const rf_dataset *d, int K, float *w,
                           bool *weighted) {
    *weighted = o->class_weighting != RF_CW_NONE;
    if (o->class_weighting == RF_CW_LIST) {
        if (o->n_class_weights != K || K > RF_TRAIN_MAX_CLASS_WEIGHTS)
            return rf_fail(RF_ERR_INVALID,
                           "train: class_weights has %d weight(s) but the model has %d labels",
                           o->n_class_weights, K);
        memcpy(w, o->class_weights, (size_t)K * sizeof *w);
    } else if (o->class_weighting == RF_CW_BALANCED) {
        size_t count[K];
        memset(count, 0, sizeof count);
        for (size_t i = 0; i < d->n; i++)
            count[d->label[i]]++;
        for (int c = 0; c < K; c++)
            w[c] = count[c] ? (float)((double)d->n / ((double)K * (double)count[c])) : 0.0f;
    }
    if (!*weighted) return RF_OK;
    char line[1024];
    int at = 0;
    for (int c = 0; c < K && at < (int)sizeof line - 32; c++)
        at += snprintf(line + at, sizeof line - (size_t)at, "%s%.4g", c ? ", " : "", w[c]);
    rf_info("trainer", "class weights (%s): [%s]",
            o->class_weighting == RF_CW_BALANCED ? "balanced" : "list", line);
    return RF_OK;
}

static int write_summary(const char *dir, const rf_train_result *r, const rf_train_opts *o,
                         int world, int zero, const size_t mem[3], size_t work_peak) {
    char path[4096];
    rf_buf b = RF_BUF_INIT;
    snprintf(path, sizeof path, "%s/train.json", dir);
    int rc = rf_buf_printf(&b,
                           "{\"steps\":%ld,\"finished\":%s,\"resumed\":%s,\"last_loss\":%.6f,"
                           "\"seconds\":%.3f,\"tokens\":%llu,\"tokens_per_s\":%.1f,"
                           "\"epochs\":%d,\"batch_size\":%d,\"grad_accum\":%d,\"lr\":%g,"
                           "\"seed\":%llu,\"peak_rss_kb\":%lld,\"world\":%d,\"zero\":%d,"
                           "\"memory\":{\"params_bytes\":%zu,\"grads_bytes\":%zu,"
                           "\"moments_bytes\":%zu,\"working_peak_bytes\":%zu}}\n",
                           r->steps, r->finished ? "true" : "false", r->resumed ? "true" : "false",
                           r->last_loss, r->seconds, (unsigned long long)r->tokens, r->tokens_per_s,
                           o->epochs, o->batch_size, o->grad_accum, o->optim.lr,
                           (unsigned long long)o->seed, (long long)rf_peak_rss_kb(), world, zero,
                           mem[0], mem[1], mem[2], work_peak);
    if (!rc) rc = rf_write_file_atomic(path, b.data, b.len);
    rf_buf_free(&b);
    return rc;
}

/* Data parallel. The ranks of o->comm each run this loop on the same data and
 * options. Every micro-batch that one process would take is cut into `world`
 * contiguous slices (rank r: sequences [nb*r/world, nb*(r+1)/world)), so the
 * data order is unchanged. The loss of a micro-batch is the (class-weighted)
 * mean over its labelled rows, so rank r scales its local gradient by its
 * share w_r / w (w_r its rows' weight sum, w the whole micro-batch's, which
 * every rank computes from the data it holds: no collective needed) and the
 * gradients are SUM-reduced: N ranks compute the gradient of one rank up to
 * float summation order. Loss, token counts, the gradient norm and clipping
 * are global.
 *
 * ZeRO, rank r owning [lo, hi) = rf_comm_shard(n) of the flat blocks (zero
 * 0/1) or its piece of every model unit (zero 2/3, zero3.h):
 *   zero 0: all-reduce the gradient block (in buckets, one per unit, started
 *           during the last micro-batch's backward: bucket_hook); every rank
 *           runs full AdamW.
 *   zero 1: the same all-reduce; AdamW on [lo, hi) with moments allocated for
 *           the shard only; all-gather the parameters.
 *   zero 2: each unit's gradient reduce-scattered after its backward (every
 *           micro-batch) into the rank's gradient piece; the norm is the
 *           all-reduced sum of the pieces' squares; AdamW on the pieces;
 *           all-gather of the parameters per unit (rf_zero3_*).
 *   zero 3: zero 2, with the parameters sharded too and all-gathered per unit
 *           before its forward and its backward (rf_zero3_*).
 * comm_bytes counts what a ring implementation sends per rank for each call
 * (all-reduce 2(N-1)/N x bytes, reduce-scatter and all-gather (N-1)/N x the
 * full vector, broadcast the buffer once), so it compares with the ZeRO
 * paper's 2 psi / 3 psi; MPI may pick another algorithm.
 *
 * Memory: every buffer handed to the group is the model backend's (be->alloc;
 * the scalars go through `scratch`), so a device backend's group is an NCCL
 * one (rf_train_model makes it RF_COMM_DEVICE when be->device_memory); the
 * host reads and writes model memory only through to_host/to_device
 * (checkpoint pieces). Backend work may run asynchronously and the comm
 * layer's stream is not ordered with it: dp_wait before each collective on a
 * buffer the backend wrote. */
typedef struct dp_group {
    rf_comm *c; /* NULL at world size 1: no collective is called */
    const rf_backend *be;
    bool staged;   /* be is not the CPU: host access through to_host/to_device */
    void *scratch; /* staged: backend memory for the scalars' collectives */
    int world, rank, zero;
    size_t lo, hi, block; /* rank's shard of the nparams floats; block = ceil(n/world) */
    uint64_t bytes;       /* ring-model bytes sent so far */
    rf_zero3 *z3;         /* zero 2 and 3: the unit shards and the unit hook */
    uint64_t z3_bytes;    /* rf_zero3_bytes already counted in bytes */
    /* zero 0/1: the gradient all-reduce in buckets, one per model unit (see
     * bucket_hook); bucket[u] is unit u's pending request */
    rf_model *m;
    rf_comm_req **bucket;
    bool *started;
    int nbuckets;
    bool armed;   /* the step's last micro-batch: its backward starts the buckets */
    bool reduced; /* this step's gradients are all-reduced already */
    int bucket_rc;
} dp_group;

/* Adds what the ZeRO-3 hook sent since the last call to g->bytes. */
static void dp_count_z3(dp_group *g) {
    if (!g->z3) return;
    uint64_t b = rf_zero3_bytes(g->z3);
    g->bytes += b - g->z3_bytes;
    g->z3_bytes = b;
}

static int dp_fail(int rc, const char *what) {
    return rf_fail_ctx(rc, "train: %s", what);
}

/* Before a collective reads what the backend's kernels wrote: waits for the
 * work queued on the backend (to_host waits for it, backend.h), unless the
 * group is ordered after the backend's queue (rf_train_model: the
 * collective's stream waits for it on the device, so backward goes on
 * queueing kernels while a bucket's all-reduce waits). */
static int dp_wait(dp_group *g) {
    if (!g->staged || rf_comm_ordered(g->c)) return RF_OK;
    uint8_t x;
    int rc = g->be->to_host(g->be, &x, g->scratch, 1);
    return rc ? dp_fail(rc, "waiting for the device") : RF_OK;
}

/* In-place all-reduce of model memory. */
static int dp_allreduce(dp_group *g, void *buf, size_t n, rf_comm_dtype t, rf_comm_op op) {
    g->bytes += 2 * (uint64_t)(g->world - 1) * n * rf_comm_dtype_size(t) / (uint64_t)g->world;
    int rc = dp_wait(g);
    if (!rc) rc = rf_comm_allreduce(g->c, buf, buf, n, t, op);
    return rc ? dp_fail(rc, "all-reduce") : RF_OK;
}

/* The scratch bytes for `world` ranks: dp_save's exchange is the largest. */
static size_t scratch_bytes(int world) {
    return 3 * sizeof(uint64_t) * (size_t)world + 64;
}

/* Collectives of a few host values (flags, sums, sizes): staged through the
 * backend's scratch, so that a device group gets device memory. */
static int dp_host_allreduce(dp_group *g, void *host, size_t n, rf_comm_dtype t, rf_comm_op op) {
    if (!g->staged) return dp_allreduce(g, host, n, t, op);
    size_t b = n * rf_comm_dtype_size(t);
    g->bytes += 2 * (uint64_t)(g->world - 1) * b / (uint64_t)g->world;
    int rc = g->be->to_device(g->be, g->scratch, host, b);
    if (!rc) rc = rf_comm_allreduce(g->c, g->scratch, g->scratch, n, t, op);
    if (!rc) rc = g->be->to_host(g->be, host, g->scratch, b);
    return rc ? dp_fail(rc, "all-reduce") : RF_OK;
}

static int dp_host_allgather(dp_group *g, const void *mine, void *all, size_t n, rf_comm_dtype t) {
    size_t b = n * rf_comm_dtype_size(t);
    g->bytes += (uint64_t)(g->world - 1) * b;
    if (!g->staged) return rf_comm_allgather(g->c, mine, all, n, t);
    char *sc = g->scratch;
    int rc = g->be->to_device(g->be, sc + (size_t)g->rank * b, mine, b);
    if (!rc) rc = rf_comm_allgather(g->c, sc + (size_t)g->rank * b, sc, n, t);
    if (!rc) rc = g->be->to_host(g->be, all, sc, b * (size_t)g->world);
    return rc;
}

/* The parameters after each rank updated its shard: all-gather in place. */
static int dp_gather_params(dp_group *g, const rf_model_blocks *m) {
    g->bytes += (uint64_t)(g->world - 1) * g->block * sizeof(float);
    int rc = dp_wait(g);
    if (!rc)
        rc = rf_comm_allgather(g->c, m->params + (size_t)g->rank * g->block, m->params, g->block,
                               RF_COMM_F32);
    return rc ? dp_fail(rc, "all-gather of the parameters") : RF_OK;
}

/* Gradient buckets (zero 0 and 1). The all-reduce of the whole gradient block
 * is cut at the model's units (embeddings, each layer, head: the same ranges
 * as zero 3's) and overlapped with backward: during the step's last
 * micro-batch the unit hook starts unit u's in-place all-reduce as soon as
 * its backward is done (the earlier micro-batches have added into the same
 * block already), and calls rf_comm_test on the pending ones at each unit's
 * start so that MPI progresses them; buckets_finish issues whatever backward
 * did not (a rank without rows, a micro-batch without weight: in the same
 * order, head first) and waits for all. An all-reduce sums every element on
 * its own, so the buckets give the elements of one whole-block all-reduce
 * whenever MPI adds the N contributions in the same order (always at N = 2;
 * at larger N its algorithm may depend on the message size). */
static void bucket_start(dp_group *g, int u) {
    size_t lo, hi;
    rf_model_blocks mb;
    int rc = rf_model_unit_range(g->m, u, &lo, &hi);
    if (!rc) rc = rf_model_blocks_of(g->m, &mb);
    if (rc) {
        if (!g->bucket_rc) g->bucket_rc = rc;
        return;
    }
    g->bytes += 2 * (uint64_t)(g->world - 1) * (hi - lo) * sizeof(float) / (uint64_t)g->world;
    g->started[u] = true;
    rc = dp_wait(g); /* the unit's backward kernels have written its gradient */
    if (!rc)
        rc = rf_comm_iallreduce(g->c, mb.grads + lo, mb.grads + lo, hi - lo, RF_COMM_F32,
                                RF_COMM_SUM, &g->bucket[u]);
    if (rc && !g->bucket_rc) g->bucket_rc = dp_fail(rc, "all-reduce of a gradient bucket");
}

/* A tied head's part of unit 0's gradient (RF_UNIT_BWD_PART) starts nothing:
 * the bucket goes when the unit's gradient is complete. */
static int bucket_hook(void *user, int u, rf_unit_event ev, int next) {
    (void)next;
    dp_group *g = user;
    if (!g->armed || g->bucket_rc) return RF_OK;
    if (ev == RF_UNIT_BWD)
        for (int i = 0; i < g->nbuckets; i++) {
            int done;
            if (g->bucket[i] && rf_comm_test(g->bucket[i], &done) && !g->bucket_rc)
                g->bucket_rc = dp_fail(RF_ERR_IO, "all-reduce of a gradient bucket");
        }
    if (ev == RF_UNIT_BWD_DONE) bucket_start(g, u);
    return RF_OK;
}

static int buckets_finish(dp_group *g) {
    g->armed = false;
    for (int u = g->nbuckets - 1; u >= 0 && !g->bucket_rc; u--)
        if (!g->started[u]) bucket_start(g, u);
    int rc = g->bucket_rc;
    for (int u = 0; u < g->nbuckets; u++) {
        int r = rf_comm_wait(g->bucket[u]); /* NULL: no-op */
        if (r && !rc) rc = dp_fail(r, "all-reduce of a gradient bucket");
        g->bucket[u] = NULL;
        g->started[u] = false;
    }
    g->bucket_rc = RF_OK;
    g->reduced = !rc;
    return rc;
}

/* Installs the bucket hook (zero 0/1 with a group; nothing otherwise). */
static int buckets_init(dp_group *g, rf_model *m) {
    if (!g->c || g->zero >= 2) return RF_OK;
    g->m = m;
    g->nbuckets = rf_model_units(m);
    g->bucket = calloc((size_t)g->nbuckets, sizeof *g->bucket);
    g->started = calloc((size_t)g->nbuckets, sizeof *g->started);
    if (!g->bucket || !g->started) return RF_ERR_NOMEM;
    return rf_model_set_hook(m, bucket_hook, g);
}

static void buckets_free(dp_group *g) {
    if (!g->bucket) return;
    g->armed = false;
    for (int u = 0; u < g->nbuckets; u++)
        rf_comm_wait(g->bucket[u]); /* after an error: nothing may stay pending */
    if (g->m->hook == bucket_hook) (void)rf_model_set_hook(g->m, NULL, NULL);
    free(g->bucket);
    free(g->started);
    g->bucket = NULL;
}

/* The weight of sequences idx[0..n): the loss's denominator (see rf_op_xent_fwd);
 * for causal-LM rows the tokens they make the model predict (lm_data.h). */
static double batch_weight(const rf_dataset *d, const size_t *idx, size_t n, const float *cw) {
    double w = 0;
    if (d->tflags) {
        for (size_t i = 0; i < n; i++)
            w += rf_lm_row_targets(d, idx[i]);
        return w;
    }
    for (size_t i = 0; i < n; i++)
        w += cw ? (double)cw[d->label[idx[i]]] : 1.0;
    return w;
}

/* Clipping and AdamW on [lo, hi) of the full gradient every rank holds:
 * the norm stays in backend memory (the scratch) for AdamW's clipping, and
 * comes back once the update is queued (rf_optim_clipped_adamw). */
static int dp_clipped_adamw(dp_group *g, const rf_model_blocks *m, const rf_adamw *opt, long step,
                            float lr, size_t lo, size_t hi, float *norm) {
    double host, *ss = g->scratch ? (double *)g->scratch : &host; /* none: the CPU's memory */
    if (!g->scratch && m->be != rf_backend_cpu())
        return rf_fail(RF_ERR_INTERNAL, "train: no scratch memory for the gradient norm");
    return rf_optim_clipped_adamw(m, opt, step, lr, lo, hi, ss, norm);
}

/* Gradient sync, clipping and the AdamW step of one optimizer step; returns
 * the global gradient norm before clipping in *norm. */
static int dp_step(dp_group *g, rf_model *model, const rf_adamw *opt, long step, float lr,
                   float *norm) {
    int rc;
    if (g->z3) {
        rc = rf_zero3_step(g->z3, opt, step, lr, norm);
        dp_count_z3(g);
        return rc;
    }
    rf_model_blocks mb, *m = &mb;
    if ((rc = rf_model_blocks_of(model, &mb))) return rc;
    if (!g->c) /* one process: no collective */
        return dp_clipped_adamw(g, m, opt, step, lr, 0, m->nparams, norm);
    /* zero 0 and 1 (2 and 3 went to rf_zero3_step) */
    bool done = g->reduced; /* by the buckets */
    g->reduced = false;
    if (!done && (rc = dp_allreduce(g, m->grads, m->nparams, RF_COMM_F32, RF_COMM_SUM))) return rc;
    /* every rank: the same full gradient */
    if (g->zero == 0) return dp_clipped_adamw(g, m, opt, step, lr, 0, m->nparams, norm);
    if ((rc = dp_clipped_adamw(g, m, opt, step, lr, g->lo, g->hi, norm))) return rc;
    return dp_gather_params(g, m);
}

/* What a zero-2/3 rank holds, as checkpoint pieces (one per unit, plus an
 * empty last slot with `extra`; freed by the caller) over the shard blocks
 * zp (NULL at zero 2: the parameters of a piece are in params, the full
 * block), zm1, zm2: the rank's own (rf_zero3_shards) or host copies of them. */
static rf_ckpt_piece *z3_pieces(rf_zero3 *z, float *params, float *zp, float *zm1, float *zm2,
                                bool extra, size_t *npc) {
    size_t units = (size_t)rf_zero3_units(z);
    *npc = units + extra;
    rf_ckpt_piece *pc = calloc(*npc, sizeof *pc);
    for (size_t u = 0; pc && u < units; u++) {
        size_t lo, hi, off;
        rf_zero3_piece(z, (int)u, &lo, &hi, &off);
        pc[u] = (rf_ckpt_piece){lo, hi, zp ? zp + off : params + lo, zm1 + off, zm2 + off};
    }
    return pc;
}

/* Host copies of what a staged zero-2/3 rank holds: its shard blocks (zp at
 * zero 3 only) and at zero 2 the full parameters; read from the backend with
 * `read`, else zeroed (for a checkpoint load). z3_host_free frees them. */
typedef struct z3_host {
    float *params, *zp, *zm1, *zm2;
} z3_host;

static void z3_host_free(z3_host *h) {
    free(h->params);
    free(h->zp);
    free(h->zm1);
    free(h->zm2);
    *h = (z3_host){0};
}

static int z3_host_make(dp_group *g, const rf_model_blocks *m, bool read, z3_host *h) {
    *h = (z3_host){0};
    const rf_backend *be = g->be;
    float *zp, *zm1, *zm2;
    rf_zero3_shards(g->z3, &zp, &zm1, &zm2);
    size_t S = rf_zero3_memory_of(g->z3).shard_floats, np = m->nparams;
    h->zm1 = calloc(S ? S : 1, sizeof(float));
    h->zm2 = calloc(S ? S : 1, sizeof(float));
    if (zp)
        h->zp = calloc(S ? S : 1, sizeof(float));
    else
        h->params = calloc(np ? np : 1, sizeof(float));
    if (!h->zm1 || !h->zm2 || (zp ? !h->zp : !h->params)) {
        z3_host_free(h);
        return rf_fail(RF_ERR_NOMEM, "train: no memory to stage the shards");
    }
    int rc = RF_OK;
    if (read) {
        rc = be->to_host(be, h->zm1, zm1, S * sizeof(float));
        if (!rc) rc = be->to_host(be, h->zm2, zm2, S * sizeof(float));
        if (!rc)
            rc = zp ? be->to_host(be, h->zp, zp, S * sizeof(float))
                    : be->to_host(be, h->params, m->params, np * sizeof(float));
    }
    if (rc) {
        z3_host_free(h);
        return rf_fail_ctx(rc, "train: reading the shards");
    }
    return RF_OK;
}

/* Writes host copies back into the rank's shards (and zero 2's parameters). */
static int z3_host_put(dp_group *g, const rf_model_blocks *m, const z3_host *h) {
    const rf_backend *be = g->be;
    float *zp, *zm1, *zm2;
    rf_zero3_shards(g->z3, &zp, &zm1, &zm2);
    size_t S = rf_zero3_memory_of(g->z3).shard_floats;
    int rc = be->to_device(be, zm1, h->zm1, S * sizeof(float));
    if (!rc) rc = be->to_device(be, zm2, h->zm2, S * sizeof(float));
    if (!rc)
        rc = zp ? be->to_device(be, zp, h->zp, S * sizeof(float))
                : be->to_device(be, m->params, h->params, m->nparams * sizeof(float));
    return rc ? rf_fail_ctx(rc, "train: writing the shards") : RF_OK;
}

/* Writes the sharded checkpoint of step st->step (see checkpoint.h): every
 * rank writes the pieces it owns, the ranks exchange their shards' sizes and
 * checksums (which is also the barrier), and rank 0 commits the manifest, the
 * COMPLETE marker and checkpoint.bin. What a rank owns: everything (one
 * process); its rf_comm_shard range of params and moments (zero 0, where
 * every rank holds the same full state, and zero 1); its piece of every
 * unit (zero 2 and 3). */
static int dp_save(dp_group *g, const char *out_dir, rf_model *model, const rf_train_state *st) {
    rf_model_blocks mb, *m = &mb;
    int brc = rf_model_blocks_of(model, &mb);
    if (brc) return brc;
    rf_ckpt_piece one, *pc = &one;
    size_t npc = 1;
    /* device memory: the blocks (or the rank's pieces) copied to the host */
    float *staged = NULL, *staged2 = NULL, *staged3 = NULL;
    if (!g->c && m->be != rf_backend_cpu()) {
        size_t n = m->nparams;
        if (!(staged = malloc(3 * n * sizeof *staged)))
            return rf_fail(RF_ERR_NOMEM, "train: no memory to stage the checkpoint");
        int src = m->be->to_host(m->be, staged, m->params, n * sizeof *staged);
        if (!src) src = m->be->to_host(m->be, staged + n, m->m, n * sizeof *staged);
        if (!src) src = m->be->to_host(m->be, staged + 2 * n, m->v, n * sizeof *staged);
        if (src) {
            free(staged);
            return rf_fail_ctx(src, "train: reading the model for the checkpoint");
        }
        one = (rf_ckpt_piece){0, n, staged, staged + n, staged + 2 * n};
    } else if (!g->c) {
        one = (rf_ckpt_piece){0, m->nparams, m->params, m->m, m->v};
    } else if (g->z3) {
        float *zp, *zm1, *zm2;
        rf_zero3_shards(g->z3, &zp, &zm1, &zm2);
        z3_host h = {0};
        if (g->staged) { /* device memory: the shards copied to the host */
            if ((brc = z3_host_make(g, m, true, &h))) return brc;
            pc = z3_pieces(g->z3, h.params, h.zp, h.zm1, h.zm2, false, &npc);
            staged = h.params ? h.params : h.zp; /* one of them; freed below */
            staged2 = h.zm1;
            staged3 = h.zm2;
        } else {
            pc = z3_pieces(g->z3, m->params, zp, zm1, zm2, false, &npc);
        }
        if (!pc) {
            free(staged);
            free(staged2);
            free(staged3);
            return RF_ERR_NOMEM;
        }
    } else {
        size_t mo = g->zero ? 0 : g->lo; /* zero 1: the moments hold the shard only */
        one = (rf_ckpt_piece){g->lo, g->hi, m->params + g->lo, m->m + mo, m->v + mo};
        if (g->staged) { /* device memory: the rank's range copied to the host */
            size_t n = g->hi - g->lo;
            if (!(staged = malloc((3 * n + 1) * sizeof *staged)))
                return rf_fail(RF_ERR_NOMEM, "train: no memory to stage the checkpoint");
            const rf_backend *be = g->be;
            int src = be->to_host(be, staged, one.p, n * sizeof *staged);
            if (!src) src = be->to_host(be, staged + n, one.m1, n * sizeof *staged);
            if (!src) src = be->to_host(be, staged + 2 * n, one.m2, n * sizeof *staged);
            if (src) {
                free(staged);
                return rf_fail_ctx(src, "train: reading the model for the checkpoint");
            }
            one = (rf_ckpt_piece){g->lo, g->hi, staged, staged + n, staged + 2 * n};
        }
    }
    /* Rank 0 prunes the older step directories after its commit; no rank can
     * start writing the next checkpoint before then, because every step
     * between two checkpoints has collectives with rank 0. */
    uint64_t mine[3] = {0, 0, 0}; /* failed, size, hash */
    int rc = rf_ckpt_write_shard(out_dir, m, st, g->rank, g->world, pc, npc, &mine[1], &mine[2]);
    if (pc != &one) free(pc);
    free(staged);
    free(staged2);
    free(staged3);
    if (!g->c) return rc ? rc : rf_ckpt_commit(out_dir, m->nparams, st, 1, 0, &mine[1], &mine[2]);
    mine[0] = rc != RF_OK;
    uint64_t *all = malloc(3 * (size_t)g->world * sizeof *all);
    if (!all) return RF_ERR_NOMEM;
    int crc = dp_host_allgather(g, mine, all, 3, RF_COMM_I64);
    if (crc) {
        free(all);
        return dp_fail(crc, "exchange of the checkpoint shards");
    }
    for (int w = 0; w < g->world && !rc; w++)
        if (all[3 * w])
            rc = rf_fail(RF_ERR_IO, "train: rank %d could not write its checkpoint shard", w);
    if (!rc && g->rank == 0) {
        uint64_t *sizes = malloc(2 * (size_t)g->world * sizeof *sizes);
        if (!sizes) rc = RF_ERR_NOMEM;
        for (int w = 0; w < g->world && !rc; w++) {
            sizes[w] = all[3 * w + 1];
            sizes[g->world + w] = all[3 * w + 2];
        }
        if (!rc)
            rc =
                rf_ckpt_commit(out_dir, m->nparams, st, g->world, g->zero, sizes, sizes + g->world);
        free(sizes);
    }
    free(all);
    return rc;
}

/* The caller's checkpoint callback: the model one, or the BERT one on a BERT. */
static bool has_checkpoint_cb(const rf_train_opts *o) {
    return o->on_checkpoint_model || o->on_checkpoint;
}

static int call_checkpoint(const rf_train_opts *o, const rf_model *m,
                           const rf_train_checkpoint *c) {
    if (o->on_checkpoint_model) return o->on_checkpoint_model(o->user, m, c);
    if (!o->on_checkpoint) return RF_OK;
    if (strcmp(m->ops->name, "bert") != 0)
        return rf_fail(RF_ERR_INVALID,
                       "train: on_checkpoint takes a BERT model; a %s model needs "
                       "on_checkpoint_model",
                       m->ops->name);
    return o->on_checkpoint(o->user, (const rf_bert *)m->impl, c);
}

/* o's checkpoint callback with the full weights in m: under zero 3 every rank
 * gathers them (collective; the ranks agreed at the start that some rank has
 * a callback) and rank 0 calls its own, if it has one. */
static int with_full_params(dp_group *g, rf_model *m, size_t nparams, const rf_train_opts *o,
                            const rf_train_checkpoint *c) {
    if (!g->z3 || g->zero == 2) /* the full weights are in m: rank 0 alone */
        return g->rank == 0 ? call_checkpoint(o, m, c) : RF_OK;
    float *full = malloc(nparams * sizeof *full);
    if (!full) return rf_fail(RF_ERR_NOMEM, "train: no memory to gather the weights");
    int rc = rf_zero3_gather(g->z3, 0, full);
    dp_count_z3(g);
    if (!rc && g->rank == 0 && has_checkpoint_cb(o)) { /* a transient full copy in m */
        if (!(rc = rf_model_adopt_params(m, full))) rc = call_checkpoint(o, m, c);
        int r = rf_model_release_blocks(m, true);
        if (!rc) rc = r;
    }
    free(full);
    return rc;
}

/* Opens <out_dir>/metrics.jsonl for this run: truncated for a fresh start; on
 * resume at step `step` the lines of later steps (written after the last
 * checkpoint by the run that stopped) are dropped, so every step appears once. */
static FILE *open_metrics(const char *dir, bool resumed, uint64_t step) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (!resumed) return fopen(path, "w");
    char *old = NULL;
    size_t len = 0;
    rf_buf keep = RF_BUF_INIT;
    if (rf_read_file(path, (size_t)1 << 30, &old, &len) == RF_OK) {
        for (size_t at = 0; at < len;) {
            char *nl = memchr(old + at, '\n', len - at);
            size_t end = nl ? (size_t)(nl - old) + 1 : len;
            unsigned long long s;
            if (sscanf(old + at, "{\"step\":%llu", &s) == 1 && s <= step && nl)
                rf_buf_append(&keep, old + at, end - at);
            at = end;
        }
        free(old);
    }
    int rc = rf_write_file_atomic(path, keep.data ? keep.data : "", keep.len);
    rf_buf_free(&keep);
    return rc ? NULL : fopen(path, "a");
}

/* One line per optimizer step in <out_dir>/metrics.jsonl (rank 0). */
static void write_metrics(FILE *f, uint64_t step, double loss, float lr, float norm,
                          uint64_t tokens, double seconds, uint64_t bytes) {
    if (!f) return;
    fprintf(f,
            "{\"step\":%llu,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens\":%llu,"
            "\"tokens_per_s\":%.1f,\"comm_bytes\":%llu}\n",
            (unsigned long long)step, loss, (double)lr, (double)norm, (unsigned long long)tokens,
            seconds > 0 ? (double)tokens / seconds : 0, (unsigned long long)bytes);
    fflush(f);
}

int rf_train(const rf_train_opts *o, const rf_dataset *data, rf_bert *b, rf_train_result *res) {
    rf_model m;
    rf_model_init_bert(&m, b);
    int rc = rf_train_model(o, data, &m, res);
    rf_model_free(&m); /* the caller keeps b */
    return rc;
}

static int train_dp(const rf_train_opts *o, const rf_dataset *data, rf_model *m,
                    rf_train_result *res, void *scratch);

/* A device model's group: a host group (mpirun) gets an NCCL twin for the
 * training's collectives (rf_comm_dup_mem), and a staged model (any backend
 * but the CPU, in a group or alone) a scratch buffer for the scalars (the
 * gradient norm's sum of squares, and a group's flags and sums); then
 * train_dp. */
int rf_train_model(const rf_train_opts *o, const rf_dataset *data, rf_model *m,
                   rf_train_result *res) {
    memset(res, 0, sizeof *res);
    rf_model_blocks mb;
    int rc = rf_model_blocks_of(m, &mb);
    if (rc) return rc;
    bool mesh = o->tp > 1 || o->pp > 1 || o->microbatches > 1; /* parallel.c: host memory */
    if (mesh || mb.be == rf_backend_cpu()) return train_dp(o, data, m, res, NULL);
    bool group = o->comm && rf_comm_world(o->comm) >= 2;
    int world = group ? rf_comm_world(o->comm) : 1;
    rf_train_opts od = *o;
    rf_comm *dev = NULL;
    if (group && mb.be->device_memory && rf_comm_mem_of(o->comm) == RF_COMM_HOST) {
        if ((rc = rf_comm_dup_mem(o->comm, RF_COMM_DEVICE, &dev)))
            return rf_fail_ctx(rc, "train: the device group for %s", mb.be->name);
        od.comm = dev;
        if (mb.be->queue && (rc = rf_comm_order_after(dev, mb.be->queue))) {
            (void)rf_comm_destroy(dev);
            return rf_fail_ctx(rc, "train: ordering the device group after %s", mb.be->name);
        }
        rf_info("trainer", "rank %d of %d: collectives on %s memory by %s%s", rf_comm_rank(dev),
                world, mb.be->name, rf_comm_backend_name(dev),
                rf_comm_ordered(dev) ? ", ordered after its stream" : "");
    }
    void *scratch = NULL;
    if ((rc = mb.be->alloc(mb.be, &scratch, scratch_bytes(world))))
        rc = rf_fail_ctx(rc, "train: scratch memory on %s", mb.be->name);
    if (!rc) rc = train_dp(&od, data, m, res, scratch);
    (void)mb.be->free(mb.be, scratch);
    int drc = rf_comm_destroy(dev);
    return rc ? rc : drc;
}

static int train_dp(const rf_train_opts *o, const rf_dataset *data, rf_model *m,
                    rf_train_result *res, void *scratch) {
    if (data->n == 0) return rf_fail(RF_ERR_INVALID, "train: no training sequences");
    if (o->batch_size < 1 || o->grad_accum < 1 || o->epochs < 1)
        return rf_fail(RF_ERR_INVALID, "train: batch_size, grad_accum and epochs must be >= 1");
    rf_model_info info = rf_model_info_of(m);
    rf_model_blocks mb;
    int rc = rf_model_blocks_of(m, &mb);
    if (rc) return rc;
    const size_t NP = mb.nparams;
    const bool causal = info.task == RF_TASK_CAUSAL_LM;
    if (causal != (data->tflags != NULL))
        return rf_fail(RF_ERR_INVALID, "train: a %s model needs %s data", info.arch,
                       causal ? "causal-LM (lm_data.h)" : "labelled classification");
    if (causal && (o->class_weighting != RF_CW_NONE || o->balanced_sampler))
        return rf_fail(RF_ERR_INVALID, "train: class weights and the balanced sampler are for "
                                       "classifiers, not a causal LM");
    for (size_t i = 0; !causal && i < data->n; i++)
        if (data->label[i] < 0 || data->label[i] >= info.num_labels)
            return rf_fail(RF_ERR_INVALID, "train: sequence %zu has label %d outside [0, %d)", i,
                           data->label[i], info.num_labels);
    dp_group g = {.world = 1, .zero = 0, .lo = 0, .hi = NP, .block = NP};
    if (o->zero < 0 || o->zero > 3)
        return rf_fail(RF_ERR_INVALID, "train: zero stage %d is not a ZeRO stage (0 to 3)",
                       o->zero);
    if (o->tp > 1 || o->pp > 1 || o->microbatches > 1) /* a tp/pp mesh: parallel.c */
        return rf_train_mesh(o, data, m, res);
    g.be = mb.be;
    /* a group's host values go through the scratch (alone, it holds the norm only) */
    g.staged = mb.be != rf_backend_cpu() && scratch && o->comm && rf_comm_world(o->comm) > 1;
    g.scratch = scratch;
    if (o->comm && rf_comm_world(o->comm) > 1) {
        if (mb.be != rf_backend_cpu() && !scratch)
            return rf_fail(RF_ERR_INTERNAL, "train: a staged group without scratch memory");
        g.c = o->comm;
        g.world = rf_comm_world(o->comm);
        g.rank = rf_comm_rank(o->comm);
        g.zero = o->zero;
        g.block = rf_comm_shard(NP, g.world, g.rank, &g.lo, &g.hi);
    }
    /* zero 2 and 3 allocate their shards themselves (rf_zero3_new, below) */
    bool flat = g.zero == 1, z3 = g.zero >= 2;
    rc = flat ? rf_model_enable_training(m, g.block * (size_t)g.world, g.block)
         : z3 ? RF_OK
              : rf_model_enable_training(m, NP, NP);
    if (!rc) rc = rf_model_blocks_of(m, &mb);
    if (rc) return rc;
    if (!z3 &&
        ((flat && mb.npadded < g.block * (size_t)g.world) || mb.nmoments < (flat ? g.block : NP)))
        return rf_fail(RF_ERR_INVALID, "train: training buffers were allocated for another layout");
    if ((rc = rf_mkdir_p(o->out_dir)))
        return rf_fail_ctx(rc, "train: cannot create %s", o->out_dir);

    size_t n = data->n, B = (size_t)o->batch_size, accum = (size_t)o->grad_accum;
    size_t micro_per_epoch = (n + B - 1) / B;
    long steps_per_epoch = (long)((micro_per_epoch + accum - 1) / accum);
    long total = o->max_steps > 0 ? o->max_steps : steps_per_epoch * o->epochs;
    rf_adamw opt = o->optim;
    opt.total_steps = total;
    if (opt.warmup_steps < 0) opt.warmup_steps = (long)ceil(o->warmup_ratio * (double)total);

    int K = info.num_labels;
    float cw[K > 0 ? K : 1];
    bool weighted;
    if ((rc = rf_train_class_weights(o, data, K, cw, &weighted))) return rc;
    if ((rc = rf_model_set_class_weights(m, weighted ? cw : NULL))) return rc;

    rf_train_state st = {0};
    rf_rng_seed(&st.rng, o->seed);
    st.ident = run_ident(data, o, &opt, weighted ? cw : NULL, K);
    char ckpt[4096];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.bin", o->out_dir);
    struct stat sb;
    if (g.c) { /* every rank starts from rank 0's weights */
        g.bytes += NP * sizeof(float);
        if ((rc = dp_wait(&g)) || (rc = rf_comm_broadcast(g.c, mb.params, NP, RF_COMM_F32, 0)))
            return dp_fail(rc, "broadcast of the initial weights");
    }
    /* zero 2/3: from here on this rank holds its shards only (and at zero 2
     * the full parameters) */
    if (z3 && (rc = rf_zero3_new(g.c, m, g.zero == 3, &g.z3))) return rc;
    if (o->resume && stat(ckpt, &sb) == 0) {
        /* a checkpoint of any layout: every rank reads what it holds (all the
         * weights, and the moments of its shard at zero 1 or of its unit
         * pieces at zero 2; its pieces of every unit at zero 3) */
        rc = rf_model_blocks_of(m, &mb);
        if (!rc && g.z3) {
            size_t npc;
            float *zp, *zm1, *zm2;
            rf_zero3_shards(g.z3, &zp, &zm1, &zm2);
            z3_host h = {0}; /* staged: read into zeroed host copies, then to the backend */
            if (g.staged && (rc = z3_host_make(&g, &mb, false, &h))) {
                rf_zero3_free(g.z3, false);
                return rc;
            }
            float *full = g.staged ? h.params : mb.params;
            rf_ckpt_piece *pc =
                g.staged ? z3_pieces(g.z3, h.params, h.zp, h.zm1, h.zm2, g.zero == 2, &npc)
                         : z3_pieces(g.z3, mb.params, zp, zm1, zm2, g.zero == 2, &npc);
            if (pc && g.zero == 2) { /* the last slot (left by z3_pieces) takes all params */
                for (size_t i = 0; i + 1 < npc; i++)
                    pc[i].p = NULL;
                pc[npc - 1] = (rf_ckpt_piece){0, NP, full, NULL, NULL};
            }
            rc = pc ? rf_checkpoint_load_pieces(ckpt, NP, &st, pc, npc) : RF_ERR_NOMEM;
            free(pc);
            if (!rc && g.staged) rc = z3_host_put(&g, &mb, &h);
            z3_host_free(&h);
        } else if (!rc) {
            rc = flat ? rf_ckpt_load_range(ckpt, &mb, &st, g.lo, g.hi)
                      : rf_ckpt_load_range(ckpt, &mb, &st, 0, NP);
        }
        if (rc) {
            rf_zero3_free(g.z3, false);
            return rc;
        }
        res->resumed = true;
        rf_info("trainer", "resumed from %s at step %llu (epoch %llu, position %llu)", ckpt,
                (unsigned long long)st.step, (unsigned long long)st.epoch,
                (unsigned long long)st.pos);
    }
    if (g.c) { /* the ranks must resume from the same step (a shared output directory) */
        int64_t lohi[2] = {res->resumed ? (int64_t)st.step + 1 : 0, 0};
        lohi[1] = -lohi[0];
        if ((rc = dp_host_allreduce(&g, lohi, 2, RF_COMM_I64, RF_COMM_MAX))) {
            rf_zero3_free(g.z3, false);
            return rc;
        }
        if (lohi[0] != -lohi[1]) {
            rf_zero3_free(g.z3, false);
            return rf_fail(RF_ERR_INVALID,
                           "train: the ranks found different checkpoints in %s (steps %lld and "
                           "%lld; 0 = none): the output directory must be shared by all ranks",
                           o->out_dir, (long long)-lohi[1] - 1, (long long)lohi[0] - 1);
        }
        rf_info("trainer", "rank %d of %d (pid %d), zero %d: shard [%zu, %zu) of %zu parameters",
                g.rank, g.world, (int)getpid(), g.zero, g.lo, g.hi, NP);
    }
    if ((rc = rf_model_blocks_of(m, &mb))) {
        rf_zero3_free(g.z3, false);
        return rc;
    }
    size_t mem[3] = {mb.npadded * sizeof(float), mb.npadded * sizeof(float),
                     2 * mb.nmoments * sizeof(float)};
    if (g.z3) {
        size_t S = rf_zero3_memory_of(g.z3).shard_floats * sizeof(float);
        mem[0] = g.zero == 3 ? S : NP * sizeof(float);
        mem[1] = S;
        mem[2] = 2 * S;
    }
    { /* what this rank holds for the optimizer (see the README's ZeRO table) */
        size_t pb = mem[0], gb = mem[1], mbb = mem[2];
        rf_info("trainer",
                "rank %d memory: params %zu B, grads %zu B, moments %zu B (%.2f + %.2f + %.2f MiB; "
                "%zu parameters)",
                g.rank, pb, gb, mbb, (double)pb / 1048576.0, (double)gb / 1048576.0,
                (double)mbb / 1048576.0, NP);
    }
    FILE *metrics = NULL;
    if (g.rank == 0) {
        if (!(metrics = open_metrics(o->out_dir, res->resumed, st.step))) {
            rf_zero3_free(g.z3, false);
            return rf_fail(RF_ERR_IO, "train: cannot open %s/metrics.jsonl", o->out_dir);
        }
    }

    size_t *order = malloc(n * sizeof *order);
    rf_batch_buf bb = {0};
    class_index ci = {0};
    if (!order || (o->balanced_sampler && (rc = class_index_build(&ci, data, K)))) {
        free(order);
        class_index_free(&ci);
        if (metrics) fclose(metrics);
        rf_zero3_free(g.z3, false);
        return order ? rc : RF_ERR_NOMEM;
    }
    double t0 = rf_now(), win_loss = 0, ck_loss = 0;
    long win_n = 0, ck_n = 0, done_this_run = 0;
    uint64_t tokens = 0;
    rf_info("trainer",
            "training %zu sequences, %d epoch(s), batch %zu x %zu accum, %ld steps, warmup %ld, "
            "lr %g",
            n, o->epochs, B, accum, total, opt.warmup_steps, opt.lr);
    if (o->balanced_sampler)
        rf_info("trainer", "balanced sampler: %d classes drawn equally often, with replacement",
                ci.npresent);
    bool stop = false;
    rc = buckets_init(&g, m);
    uint8_t cb_any = has_checkpoint_cb(o); /* zero 3 gathers for it on every rank */
    if (!rc && g.c) rc = dp_host_allreduce(&g, &cb_any, 1, RF_COMM_U8, RF_COMM_MAX);
    uint64_t bytes_before = g.bytes;
    uint64_t max_epochs = o->max_steps > 0 ? UINT64_MAX : (uint64_t)o->epochs;
    while (!rc && !stop && (long)st.step < total && st.epoch < max_epochs) {
        if (o->balanced_sampler)
            balanced_order(order, n, &ci, o->seed, st.epoch);
        else
            epoch_order(order, n, o->shuffle, o->seed, st.epoch);
        while (!rc && !stop && st.pos < n && (long)st.step < total) {
            /* one optimizer step: up to accum micro-batches */
            if ((rc = g.z3 ? rf_zero3_zero_grad(g.z3) : rf_model_zero_grad(m))) break;
            size_t left = n - st.pos, group = (left + B - 1) / B;
            if (group > accum) group = accum;
            double t_step = rf_now(), step_sums[2] = {0, 0}; /* loss sum, tokens */
            /* causal LM: the loss is the mean over the step's predicted tokens
             * (every micro-batch and rank of it), so each micro-batch's mean
             * is weighted by its share of them */
            double w_step = 0;
            for (size_t k = 0, at = st.pos; causal && k < group; k++) {
                size_t nb = n - at < B ? n - at : B;
                w_step += batch_weight(data, order + at, nb, NULL);
                at += nb;
            }
            for (size_t k = 0; k < group && !rc; k++) {
                g.armed = g.bucket && k + 1 == group;
                size_t nb = n - st.pos < B ? n - st.pos : B;
                /* this rank's slice of the micro-batch one process would take */
                size_t a = nb * (size_t)g.rank / (size_t)g.world;
                size_t e = nb * (size_t)(g.rank + 1) / (size_t)g.world;
                const float *w = weighted ? cw : NULL;
                double wl = batch_weight(data, order + st.pos + a, e - a, w);
                double wg = g.c ? batch_weight(data, order + st.pos, nb, w) : wl;
                uint64_t dseed = rf_rng_next(&st.rng);
                if (e > a) {
                    if ((rc = rf_batch_collate(&bb, data, order + st.pos + a, (int)(e - a)))) break;
                    rf_model_batch b = {.B = bb.B,
                                        .T = bb.T,
                                        .ids = bb.ids,
                                        .valid = bb.valid,
                                        .labels = bb.labels,
                                        .types = bb.types};
                    if (causal) {
                        b.pos = bb.pos;
                        b.seg = bb.seg;
                    }
                    if ((rc = rf_model_forward(m, &b, o->dropout, dseed))) break;
                    if (causal) {
                        if (wg > 0) rc = rf_model_backward(m, (float)(wl / w_step));
                    } else if (!g.c) {
                        rc = rf_model_backward(m, 1.0f / (float)group);
                    } else if (wg > 0) {
                        rc = rf_model_backward(m, (float)(wl / wg / (double)group));
                    }
                    float loss = 0;
                    long counted;
                    if (!rc) rc = rf_model_loss(m, &loss, &counted);
                    if (!rc && causal && counted != (long)wl)
                        rc = rf_fail(RF_ERR_INVALID,
                                     "train: the model counted %ld predicted tokens, the data %.0f",
                                     counted, wl);
                    if (rc) break;
                    if (causal)
                        step_sums[0] += wg > 0 ? (double)loss * wl / w_step : 0;
                    else
                        step_sums[0] += g.c ? (wg > 0 ? (double)loss * wl / wg : 0) : loss;
                    for (size_t i = 0; i < (size_t)bb.B * bb.T; i++)
                        step_sums[1] += bb.valid[i];
                    if (g.z3 && wg > 0 && (rc = rf_zero3_end_backward(g.z3))) break;
                } else if (g.z3) { /* no rows here: the unit collectives all the same */
                    if ((rc = rf_zero3_idle(g.z3, wg > 0)) ||
                        (wg > 0 && (rc = rf_zero3_end_backward(g.z3))))
                        break;
                }
                st.pos += nb;
                st.micro++;
            }
            if (rc) break;
            if (g.bucket && (rc = buckets_finish(&g))) break;
            if (g.c && (rc = dp_host_allreduce(&g, step_sums, 2, RF_COMM_F64, RF_COMM_SUM))) break;
            /* the step's loss: classifiers the mean of the micro-batches', a
             * causal LM the token mean over the step */
            double step_loss = causal ? step_sums[0] : step_sums[0] / (double)group;
            win_loss += step_sums[0];
            win_n += causal ? 1 : (long)group;
            ck_loss += step_sums[0];
            ck_n += causal ? 1 : (long)group;
            tokens += (uint64_t)step_sums[1];
            float gn = 0, lr = rf_adamw_lr(&opt, (long)st.step);
            if ((rc = dp_step(&g, m, &opt, (long)st.step, lr, &gn))) break;
            if (!g.z3 && (rc = rf_model_blocks_of(m, &mb))) break;
            write_metrics(metrics, st.step + 1, step_loss, lr, gn, (uint64_t)step_sums[1],
                          rf_now() - t_step, g.bytes - bytes_before);
            rf_obs_train_step_done(&(rf_obs_train_step){
                step_loss, lr, gn, step_sums[1], rf_now() - t_step, (double)NP, info.layers,
                info.hidden, bb.T, 4.0 * (2.0 * (double)mb.npadded + 2.0 * (double)mb.nmoments)});
            bytes_before = g.bytes;
            st.step++;
            done_this_run++;
            if (st.pos >= n) {
                st.epoch++;
                st.pos = 0;
            }
            bool cancel = o->cancel && *o->cancel;
            if (g.c) { /* a signal may reach the ranks at different steps: stop together */
                uint8_t any = cancel;
                if ((rc = dp_host_allreduce(&g, &any, 1, RF_COMM_U8, RF_COMM_MAX))) break;
                cancel = any;
            }
            bool stop_now = (o->stop_after > 0 && done_this_run >= o->stop_after) || cancel;
            if (o->log_every > 0 && ((long)st.step % o->log_every == 0 || (long)st.step == total)) {
                double dt = rf_now() - t0;
                res->last_loss = win_loss / (double)(win_n ? win_n : 1);
                rf_info("trainer",
                        "step %llu/%ld epoch %llu loss %.4f lr %.3g grad_norm %.3f %.0f tokens/s",
                        (unsigned long long)st.step, total, (unsigned long long)st.epoch,
                        res->last_loss, lr, gn, dt > 0 ? (double)tokens / dt : 0);
                win_loss = 0;
                win_n = 0;
            }
            bool scheduled =
                (o->checkpoint_every > 0 && (long)st.step % o->checkpoint_every == 0) ||
                (long)st.step == total;
            if (scheduled && cb_any && (g.rank == 0 || g.z3)) {
                double dt = rf_now() - t0;
                rf_train_checkpoint c = {(long)st.step, total, ck_loss / (double)(ck_n ? ck_n : 1),
                                         lr, dt > 0 ? (double)tokens / dt : 0};
                rc = with_full_params(&g, m, NP, o, &c);
                ck_loss = 0;
                ck_n = 0;
            }
            if (!rc && (scheduled || stop_now)) rc = dp_save(&g, o->out_dir, m, &st);
            if (stop_now) stop = true;
            if (st.pos == 0) break; /* epoch finished: reshuffle */
        }
    }
    buckets_free(&g);
    if (win_n) res->last_loss = win_loss / (double)win_n;
    res->steps = (long)st.step;
    res->seconds = rf_now() - t0;
    res->tokens = tokens;
    res->tokens_per_s = res->seconds > 0 ? (double)tokens / res->seconds : 0;
    res->finished = !rc && (long)st.step >= total;
    dp_count_z3(&g);
    size_t work_peak = 0;
    if (g.z3) {
        rf_zero3_memory zm = rf_zero3_memory_of(g.z3);
        work_peak = zm.working_peak * sizeof(float);
        rf_info("trainer",
                "rank %d zero %d working buffers: peak %zu B (%.2f MiB; parameters %zu B of it)",
                g.rank, g.zero, work_peak, (double)work_peak / 1048576.0,
                zm.working_params * sizeof(float));
        /* the caller gets the full weights back (export); collective */
        int frc = rf_zero3_free(g.z3, !rc);
        if (!rc) rc = frc;
        g.z3 = NULL;
        dp_count_z3(&g);
    }
    res->comm_bytes = g.bytes;
    if (g.c)
        rf_info("trainer", "rank %d: %llu bytes sent in collectives, peak RSS %lld KiB", g.rank,
                (unsigned long long)g.bytes, (long long)rf_peak_rss_kb());
    if (metrics) fclose(metrics);
    free(order);
    class_index_free(&ci);
    rf_batch_buf_free(&bb);
    if (!rc && g.rank == 0) rc = write_summary(o->out_dir, res, o, g.world, g.zero, mem, work_peak);
    return rc;
}

static int copy_file(const char *src, const char *dst) {
    char *data;
    size_t len;
    int rc = rf_read_file(src, (size_t)1 << 30, &data, &len);
    if (rc) return rc;
    rc = rf_write_file_atomic(dst, data, len);
    free(data);
    return rc;
}

int rf_export_hf(const rf_bert *m, const char *src_dir, const char *dir) {
    rf_model w;
    rf_model_init_bert(&w, (rf_bert *)m); /* save only reads */
    return rf_export_model(&w, src_dir, dir);
}

int rf_export_model(const rf_model *m, const char *src_dir, const char *dir) {
    char path[4096], src[4096];
    int rc = rf_mkdir_p(dir);
    if (rc) return rf_fail_ctx(rc, "export: cannot create %s", dir);
    if ((rc = rf_model_save(m, dir))) return rc;
    static const char *const tok_files[] = {
        "tokenizer.json", "vocab.txt",  "tokenizer_config.json", "special_tokens_map.json",
        "vocab.json",     "merges.txt", "generation_config.json"};
    bool causal = rf_model_info_of(m).task == RF_TASK_CAUSAL_LM;
    for (size_t i = 0; src_dir && i < sizeof tok_files / sizeof tok_files[0]; i++) {
        struct stat sb;
        if (i >= 4 && !causal) break; /* a classifier's export: the files it always had */
        snprintf(src, sizeof src, "%s/%s", src_dir, tok_files[i]);
        if (stat(src, &sb) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, tok_files[i]);
        if ((rc = copy_file(src, path))) return rf_fail_ctx(rc, "export: cannot copy %s", src);
    }
    return RF_OK;
}

/* ---- shared with parallel.c (train_int.h) ---- */

rf_train_ident rf_train_run_ident(const rf_dataset *d, const rf_train_opts *o, const rf_adamw *a,
                                  const float *cw, int K) {
    return run_ident(d, o, a, cw, K);
}

double rf_train_batch_weight(const rf_dataset *d, const size_t *idx, size_t n, const float *cw) {
    return batch_weight(d, idx, n, cw);
}

FILE *rf_train_open_metrics(const char *dir, bool resumed, uint64_t step) {
    return open_metrics(dir, resumed, step);
}
