/* Tensor parallelism of the three models (model.h: rf_bert_tp_split; gpt2.h,
 * llama.h): the shard of a whole model for one rank of a tp group, and where
 * it sits in the whole model. The forward and backward that use it are
 * model.c's, gpt2.c's and llama.c's. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/model_iface.h"
#include "trainer/model_tp.h"
#include "trainer/tp.h"

/* How a tensor of the whole table is split over the tp ranks. */
typedef enum split_kind {
    SPLIT_NONE,  /* replicated */
    SPLIT_ROWS,  /* dim 0 (nn.Linear: column-parallel weight, its bias; Conv1D: row-parallel) */
    SPLIT_COLS,  /* dim 1 (nn.Linear: row-parallel weight; Conv1D: column-parallel) */
    SPLIT_COLS3, /* the last dim in three blocks q | k | v (GPT-2's c_attn weight and bias) */
    SPLIT_VOCAB, /* word embeddings, LM head: rf_tp_vocab_split's rows */
} split_kind;

static split_kind bert_split_of(const rf_bert *m, size_t i) {
    size_t L = (size_t)m->cfg.num_layers;
    if (i == 0) return SPLIT_VOCAB;
    if (i < 5 || i >= 5 + 16 * L) return SPLIT_NONE; /* embeddings' rest, pooler, classifier */
    switch ((i - 5) % 16) {                          /* the order of build_table */
    case 0:
    case 1:
    case 2: /* query, key, value weights */
    case 3:
    case 4:
    case 5: /* and biases */
    case 10:
    case 11: /* intermediate.dense weight, bias */
        return SPLIT_ROWS;
    case 6:  /* attention.output.dense.weight */
    case 12: /* output.dense.weight */
        return SPLIT_COLS;
    default: /* the row-parallel biases, LayerNorms */
        return SPLIT_NONE;
    }
}

/* GPT-2 (gpt2.c's table: wte, wpe, 12 per layer, ln_f): Conv1D weights are
 * [in, out], so the column-parallel ones split dim 1 and the row-parallel
 * ones dim 0. */
static split_kind gpt2_split_of(const rf_gpt2 *m, size_t i) {
    size_t L = (size_t)m->cfg.n_layer;
    if (i == 0) return SPLIT_VOCAB;
    if (i < 2 || i >= 2 + 12 * L) return SPLIT_NONE; /* wpe, ln_f */
    switch ((i - 2) % 12) {
    case 2: /* attn.c_attn.weight [C, 3C] */
    case 3: /* and its bias [3C] */
        return SPLIT_COLS3;
    case 4:  /* attn.c_proj.weight [C, C]: row-parallel */
    case 10: /* mlp.c_proj.weight [F, C]: row-parallel */
    case 9:  /* mlp.c_fc.bias [F] */
        return SPLIT_ROWS;
    case 8: /* mlp.c_fc.weight [C, F]: column-parallel */
        return SPLIT_COLS;
    default: /* LayerNorms, the row-parallel biases */
        return SPLIT_NONE;
    }
}

/* Llama (llama.c's table: embed_tokens, 9 per layer, norm, lm_head when
 * untied). q, k, v and gate, up split by rows stay adjacent in the local
 * table: the fused projections run on the shard unchanged. */
static split_kind llama_split_of(const rf_llama *m, size_t i) {
    size_t L = (size_t)m->cfg.num_hidden_layers;
    if (i == 0 || i == 2 + 9 * L) return SPLIT_VOCAB; /* embed_tokens, lm_head */
    if (i >= 1 + 9 * L) return SPLIT_NONE;            /* model.norm */
    switch ((i - 1) % 9) {
    case 1:
    case 2:
    case 3: /* q, k, v */
    case 6:
    case 7: /* gate, up */
        return SPLIT_ROWS;
    case 4: /* o_proj */
    case 8: /* down_proj */
        return SPLIT_COLS;
    default: /* the RMSNorms */
        return SPLIT_NONE;
    }
}

typedef struct span_list {
    rf_tp_span *v;
    size_t n, cap;
} span_list;

static int add_span(span_list *l, size_t global, size_t local, size_t n, bool replicated) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 256;
        rf_tp_span *sp = realloc(l->v, nc * sizeof *sp);
        if (!sp) return RF_ERR_NOMEM;
        l->v = sp;
        l->cap = nc;
    }
    l->v[l->n++] = (rf_tp_span){global, local, n, replicated};
    return RF_OK;
}

/* The local table (loc, NULL: not wanted), the spans and the local float
 * count of tp rank r of n, from the whole model's table (full, nt tensors,
 * split as kinds[i]; V the vocabulary). */
static int build(const unsigned char *kinds, int V, const rf_tensor_info *full, size_t nt, int n,
                 int r, rf_tensor_info *loc, span_list *sp, size_t *total) {
    rf_tp_vocab v;
    int rc = rf_tp_vocab_split(V, n, r, &v);
    size_t off = 0;
    for (size_t i = 0; !rc && i < nt; i++) {
        const rf_tensor_info *t = &full[i];
        rf_tensor_info l = *t;
        l.offset = off;
        size_t rows = (size_t)t->shape[0], cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
        switch ((split_kind)kinds[i]) {
        case SPLIT_NONE:
            rc = add_span(sp, t->offset, off, t->numel, true);
            break;
        case SPLIT_ROWS: {
            size_t part = rows / (size_t)n;
            l.shape[0] = (int)part;
            l.numel = part * cols;
            rc = add_span(sp, t->offset + (size_t)r * part * cols, off, l.numel, false);
            break;
        }
        case SPLIT_COLS: {
            size_t part = cols / (size_t)n;
            l.shape[1] = (int)part;
            l.numel = rows * part;
            for (size_t k = 0; k < rows && !rc; k++)
                rc = add_span(sp, t->offset + k * cols + (size_t)r * part, off + k * part, part,
                              false);
            break;
        }
        case SPLIT_COLS3: { /* a 1-D tensor is one row */
            if (t->ndim == 1) rows = 1, cols = (size_t)t->shape[0];
            size_t third = cols / 3, part = third / (size_t)n;
            l.shape[t->ndim - 1] = (int)(3 * part);
            l.numel = rows * 3 * part;
            for (size_t k = 0; k < rows && !rc; k++)
                for (size_t j = 0; j < 3 && !rc; j++)
                    rc = add_span(sp, t->offset + k * cols + j * third + (size_t)r * part,
                                  off + (k * 3 + j) * part, part, false);
            break;
        }
        case SPLIT_VOCAB:
            l.shape[0] = v.block;
            l.numel = (size_t)v.block * cols;
            if (v.hi > v.lo)
                rc = add_span(sp, t->offset + (size_t)v.lo * cols, off,
                              (size_t)(v.hi - v.lo) * cols, false);
            break;
        }
        if (loc) loc[i] = l;
        off += l.numel;
    }
    *total = off;
    return rc;
}

void rf_tp_ctx_free(struct rf_bert_tp *tp) {
    if (!tp) return;
    if (tp->g.sync) rf_backend_free(tp->g.be, tp->g.sync);
    free(tp->full);
    free(tp->spans);
    free(tp->kinds);
    free(tp);
}

/* A context for a group c (dev: its twin for be's memory, or NULL: c) on
 * backend be into *out, its kinds array allocated (nt entries, zero);
 * RF_ERR_NOMEM, or rf_tp_vocab_split's error. */
static int ctx_new(rf_comm *c, rf_comm *dev, const rf_backend *be, size_t nt, int V,
                   struct rf_bert_tp **out) {
    struct rf_bert_tp *tp = calloc(1, sizeof *tp);
    *out = NULL;
    if (!tp || !(tp->kinds = calloc(nt ? nt : 1, 1))) {
        free(tp);
        return rf_fail(RF_ERR_NOMEM, "model: no memory for the tp context");
    }
    tp->c = c, tp->n = rf_comm_world(c), tp->r = rf_comm_rank(c);
    tp->dev = dev;
    tp->g = (rf_tp_group){dev ? dev : c, be, NULL};
    if (be != rf_backend_cpu() && !(tp->g.sync = rf_backend_alloc(be, 64))) {
        rf_tp_ctx_free(tp);
        return rf_fail(RF_ERR_NOMEM, "model: no %s memory for the tp context", be->name);
    }
    tp->embed_fwd = rf_tp_embed_fwd, tp->embed_bwd = rf_tp_embed_bwd;
    tp->qkv_fwd = rf_tp_qkv_fwd, tp->qkv_bwd = rf_tp_qkv_bwd;
    tp->colpar_fwd = rf_tp_colpar_fwd, tp->colpar_bwd = rf_tp_colpar_bwd;
    tp->rowpar_fwd = rf_tp_rowpar_fwd, tp->rowpar_bwd = rf_tp_rowpar_bwd;
    tp->sum = rf_tp_sum, tp->xent_fwd = rf_tp_xent_fwd, tp->xent_bwd = rf_tp_xent_bwd;
    int rc = rf_tp_vocab_split(V, tp->n, tp->r, &tp->vocab);
    if (rc) {
        rf_tp_ctx_free(tp);
        return rc;
    }
    *out = tp;
    return RF_OK;
}

/* Whether be can run a tp shard (tp.h's slots; the vocabulary-parallel
 * cross-entropy's for a causal model) and, on a GPU's memory, dev is the tp
 * group's device twin: RF_ERR_UNSUPPORTED naming the missing slot, or
 * RF_ERR_INVALID. */
static int tp_backend_check(const rf_backend *be, const char *who, bool causal, rf_comm *dev) {
    const rf_backend_slot need[] = {
        {"linear_ld_fwd", !be->linear_ld_fwd},         {"linear_ld_bwd", !be->linear_ld_bwd},
        {"embed_rows_fwd", !be->embed_rows_fwd},       {"embed_add_fwd", !be->embed_add_fwd},
        {"embed_rows_bwd", !be->embed_rows_bwd},       {"vxent_stats", causal && !be->vxent_stats},
        {"vxent_sumexp", causal && !be->vxent_sumexp}, {"vxent_loss", causal && !be->vxent_loss},
        {"vxent_bwd", causal && !be->vxent_bwd}};
    int rc = rf_backend_check_slots(be, who, need, sizeof need / sizeof *need);
    if (!rc && be->device_memory && (!dev || rf_comm_mem_of(dev) != RF_COMM_DEVICE))
        rc = rf_fail(RF_ERR_INVALID,
                     "%s on %s memory needs the tp group's device twin (rf_comm_dup_mem)", who,
                     be->name);
    return rc;
}

int rf_bert_tp_split(rf_bert *m, rf_comm *c, rf_comm *dev) {
    const rf_bert_config *cf = &m->cfg;
    const rf_backend *be = m->be;
    int n = rf_comm_world(c), r = rf_comm_rank(c);
    if (m->tp) return rf_fail(RF_ERR_INVALID, "model: already split for tensor parallelism");
    int rc = tp_backend_check(be, "model: tensor parallelism", false, dev);
    if (rc) return rc;
    if (m->grads)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "model: split for tensor parallelism before enabling training");
    if (cf->num_heads % n || cf->intermediate_size % n || cf->hidden_size % cf->num_heads)
        return rf_fail(RF_ERR_INVALID,
                       "model: tp %d must divide the %d attention heads and the intermediate size "
                       "%d",
                       n, cf->num_heads, cf->intermediate_size);
    struct rf_bert_tp *tp;
    if ((rc = ctx_new(c, dev, be, m->ntensors, cf->vocab_size, &tp))) return rc;
    rf_tensor_info *loc = malloc(m->ntensors * sizeof *loc);
    span_list sp = {0};
    size_t off = 0;
    if (!loc) rc = RF_ERR_NOMEM;
    if (!rc) {
        tp->Cl = cf->hidden_size / n, tp->Il = cf->intermediate_size / n;
        tp->NHl = tp->NKVl = cf->num_heads / n, tp->h0 = r * tp->NHl;
        for (size_t i = 0; i < m->ntensors; i++)
            tp->kinds[i] = (unsigned char)bert_split_of(m, i);
    }
    if (!rc) rc = build(tp->kinds, cf->vocab_size, m->tensors, m->ntensors, n, r, loc, &sp, &off);
    /* the shard is cut on the host: the whole block comes over, the shard
     * goes back (the CPU's memory is the host's) */
    bool host = be == rf_backend_cpu();
    float *whole = host ? m->params : NULL, *shard = NULL;
    void *pv = NULL; /* zeroed by the backend */
    if (!rc && !host &&
        (!(whole = malloc(m->nparams * sizeof *whole)) ||
         !(shard = calloc(off ? off : 1, sizeof *shard))))
        rc = RF_ERR_NOMEM;
    if (!rc && !host) rc = be->to_host(be, whole, m->params, m->nparams * sizeof *whole);
    if (!rc) rc = be->alloc(be, &pv, (off ? off : 1) * sizeof(float));
    float *p = pv, *dst = host ? p : shard;
    for (size_t k = 0; !rc && k < sp.n; k++)
        memcpy(dst + sp.v[k].local, whole + sp.v[k].global, sp.v[k].n * sizeof(float));
    if (!rc && !host) rc = be->to_device(be, p, shard, off * sizeof(float));
    if (!host) {
        free(whole);
        free(shard);
    }
    if (rc) {
        rf_backend_free(be, pv);
        free(sp.v);
        rf_tp_ctx_free(tp);
        free(loc);
        return rc == RF_ERR_NOMEM ? rf_fail(rc, "model: out of memory for the tp shard") : rc;
    }
    tp->spans = sp.v;
    tp->nspans = sp.n;
    (void)be->free(be, m->params); /* never fails on a valid pointer */
    tp->full = m->tensors;
    tp->nfull = m->ntensors;
    tp->nparams_full = m->nparams;
    m->tensors = loc;
    m->params = p;
    m->nparams = m->npadded = off;
    m->tp = tp;
    rf_bert_bind_all(m);
    /* the activation arena is laid out for the local sizes from now on */
    (void)m->be->free(m->be, m->acts);
    (void)m->be->free(m->be, m->dacts);
    m->acts = m->dacts = NULL;
    m->capB = m->capT = 0;
    return RF_OK;
}

int rf_bert_tp_spans_of(const rf_bert *m, int r, rf_tp_span **spans, size_t *n) {
    *spans = NULL;
    *n = 0;
    if (!m->tp) return rf_fail(RF_ERR_INVALID, "model: not split for tensor parallelism");
    if (r < 0 || r >= m->tp->n)
        return rf_fail(RF_ERR_RANGE, "model: tp rank %d outside [0, %d)", r, m->tp->n);
    span_list sp = {0};
    size_t total;
    int rc = build(m->tp->kinds, m->cfg.vocab_size, m->tp->full, m->tp->nfull, m->tp->n, r, NULL,
                   &sp, &total);
    if (!rc && total != m->nparams)
        rc = rf_fail(RF_ERR_INVALID, "model: tp rank %d holds %zu floats, this rank %zu", r, total,
                     m->nparams);
    if (rc) {
        free(sp.v);
        return rc;
    }
    *spans = sp.v;
    *n = sp.n;
    return RF_OK;
}

int rf_bert_tp_merge(rf_bert *m, const float *full) {
    struct rf_bert_tp *tp = m->tp;
    if (!tp) return rf_fail(RF_ERR_INVALID, "model: not split for tensor parallelism");
    if (m->grads)
        return rf_fail(RF_ERR_INVALID, "model: release the training blocks before merging");
    void *pv = NULL;
    int rc = m->be->alloc(m->be, &pv, tp->nparams_full * sizeof(float));
    if (rc) return rf_fail_ctx(rc, "model: no memory for %zu parameters", tp->nparams_full);
    if ((rc = m->be->to_device(m->be, pv, full, tp->nparams_full * sizeof(float)))) {
        rf_backend_free(m->be, pv);
        return rc;
    }
    if (m->params) (void)m->be->free(m->be, m->params);
    free(m->tensors);
    m->tensors = tp->full;
    m->ntensors = tp->nfull;
    m->params = pv;
    m->nparams = m->npadded = tp->nparams_full;
    tp->full = NULL; /* m's table again */
    rf_tp_ctx_free(tp);
    m->tp = NULL;
    rf_bert_bind_all(m);
    (void)m->be->free(m->be, m->acts);
    (void)m->be->free(m->be, m->dacts);
    m->acts = m->dacts = NULL;
    m->capB = m->capT = 0;
    return RF_OK;
}

size_t rf_bert_tp_spans(const rf_bert *m, const rf_tp_span **spans) {
    *spans = m->tp ? m->tp->spans : NULL;
    return m->tp ? m->tp->nspans : 0;
}

size_t rf_bert_tp_global_nparams(const rf_bert *m) {
    return m->tp ? m->tp->nparams_full : m->nparams;
}

const rf_tensor_info *rf_bert_tp_global_tensors(const rf_bert *m, size_t *n) {
    *n = m->tp ? m->tp->nfull : m->ntensors;
    return m->tp ? m->tp->full : m->tensors;
}

/* ---- GPT-2 and Llama ---- */

/* The config checks of a causal model's split over n ranks. */
static int gpt2_check(const rf_gpt2 *m, int n) {
    const rf_gpt2_config *c = &m->cfg;
    if (m->lora)
        return rf_fail(RF_ERR_UNSUPPORTED, "gpt2: LoRA adapters train without tensor parallelism");
    if (n < 1 || c->n_head % n || c->n_inner % n)
        return rf_fail(RF_ERR_INVALID,
                       "gpt2: tp %d must divide the %d attention heads (n_head) and the MLP size "
                       "%d (n_inner)",
                       n, c->n_head, c->n_inner);
    return RF_OK;
}

static int llama_check(const rf_llama *m, int n) {
    const rf_llama_config *c = &m->cfg;
    if (m->lora)
        return rf_fail(RF_ERR_UNSUPPORTED, "llama: LoRA adapters train without tensor parallelism");
    if (n < 1 || c->num_key_value_heads % n)
        return rf_fail(RF_ERR_INVALID,
                       "llama: tp %d must divide num_key_value_heads %d (the key/value heads are "
                       "split across the tp ranks, as the query heads)",
                       n, c->num_key_value_heads);
    if (c->num_attention_heads % n || c->intermediate_size % n)
        return rf_fail(RF_ERR_INVALID,
                       "llama: tp %d must divide num_attention_heads %d and intermediate_size %d",
                       n, c->num_attention_heads, c->intermediate_size);
    return RF_OK;
}

/* The shard of a causal model's flat block (be's memory, cut on the host as
 * rf_bert_tp_split's): replaces *tensors and *params (freed) with the local
 * ones and moves the whole table into tp. */
static int split_causal(struct rf_bert_tp *tp, const rf_backend *be, rf_tensor_info **tensors,
                        size_t nt, size_t *nparams, float **params) {
    rf_tensor_info *loc = malloc((nt ? nt : 1) * sizeof *loc);
    span_list sp = {0};
    size_t off = 0;
    float *whole = NULL, *shard = NULL, *p = NULL;
    int rc = loc ? build(tp->kinds, tp->vocab.V, *tensors, nt, tp->n, tp->r, loc, &sp, &off)
                 : RF_ERR_NOMEM;
    if (!rc && (!(whole = malloc((*nparams ? *nparams : 1) * sizeof *whole)) ||
                !(shard = calloc(off ? off : 1, sizeof *shard)) ||
                !(p = rf_backend_alloc(be, (off ? off : 1) * sizeof *p))))
        rc = RF_ERR_NOMEM;
    if (!rc) rc = be->to_host(be, whole, *params, *nparams * sizeof *whole);
    for (size_t k = 0; !rc && k < sp.n; k++)
        memcpy(shard + sp.v[k].local, whole + sp.v[k].global, sp.v[k].n * sizeof(float));
    if (!rc) rc = be->to_device(be, p, shard, off * sizeof *shard);
    free(whole);
    free(shard);
    if (rc) {
        free(sp.v);
        free(loc);
        rf_backend_free(be, p);
        return rc == RF_ERR_NOMEM ? rf_fail(rc, "model: out of memory for the tp shard") : rc;
    }
    tp->spans = sp.v;
    tp->nspans = sp.n;
    rf_backend_free(be, *params);
    tp->full = *tensors;
    tp->nfull = nt;
    tp->nparams_full = *nparams;
    *tensors = loc;
    *params = p;
    *nparams = off;
    return RF_OK;
}

/* The whole model again from full (host memory) into be's: the inverse of
 * split_causal. */
static int merge_causal(struct rf_bert_tp *tp, const rf_backend *be, rf_tensor_info **tensors,
                        size_t *nparams, float **params, const float *full) {
    size_t n = tp->nparams_full;
    float *p = rf_backend_alloc(be, (n ? n : 1) * sizeof *p);
    if (!p) return rf_fail(RF_ERR_NOMEM, "model: no memory for %zu parameters", n);
    int rc = be->to_device(be, p, full, n * sizeof *p);
    if (rc) {
        rf_backend_free(be, p);
        return rc;
    }
    rf_backend_free(be, *params);
    free(*tensors);
    *params = p;
    *tensors = tp->full;
    *nparams = n;
    tp->full = NULL;
    rf_tp_ctx_free(tp);
    return RF_OK;
}

/* After a split or merge: views rebound, the arena laid out again. */
#define CAUSAL_RESET(m, bind_all)                                                                  \
    do {                                                                                           \
        (m)->npadded = (m)->nparams;                                                               \
        bind_all(m);                                                                               \
        rf_backend_free((m)->be, (m)->acts);                                                       \
        rf_backend_free((m)->be, (m)->dacts);                                                      \
        (m)->acts = (m)->dacts = NULL;                                                             \
        (m)->capB = (m)->capT = 0;                                                                 \
    } while (0)

static int causal_precheck(const void *tp, const float *grads, const char *arch) {
    if (tp) return rf_fail(RF_ERR_INVALID, "%s: already split for tensor parallelism", arch);
    if (grads)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "%s: split for tensor parallelism before enabling training", arch);
    return RF_OK;
}

int rf_gpt2_tp_split(rf_gpt2 *m, rf_comm *c, rf_comm *dev) {
    int n = rf_comm_world(c), rc = causal_precheck(m->tp, m->grads, "gpt2");
    if (!rc) rc = tp_backend_check(m->be, "gpt2: tensor parallelism", true, dev);
    if (!rc) rc = gpt2_check(m, n);
    if (rc) return rc;
    const rf_gpt2_config *cf = &m->cfg;
    struct rf_bert_tp *tp;
    if ((rc = ctx_new(c, dev, m->be, m->ntensors, cf->vocab_size, &tp))) return rc;
    tp->Cl = cf->n_embd / n, tp->Il = cf->n_inner / n;
    tp->NHl = tp->NKVl = cf->n_head / n, tp->h0 = tp->r * tp->NHl;
    for (size_t i = 0; i < m->ntensors; i++)
        tp->kinds[i] = (unsigned char)gpt2_split_of(m, i);
    if ((rc = split_causal(tp, m->be, &m->tensors, m->ntensors, &m->nparams, &m->params))) {
        rf_tp_ctx_free(tp);
        return rc;
    }
    m->tp = tp;
    CAUSAL_RESET(m, rf_gpt2_bind_all);
    return RF_OK;
}

int rf_llama_tp_split(rf_llama *m, rf_comm *c, rf_comm *dev) {
    int n = rf_comm_world(c), rc = causal_precheck(m->tp, m->grads, "llama");
    if (!rc) rc = tp_backend_check(m->be, "llama: tensor parallelism", true, dev);
    if (!rc) rc = llama_check(m, n);
    if (rc) return rc;
    const rf_llama_config *cf = &m->cfg;
    struct rf_bert_tp *tp;
    if ((rc = ctx_new(c, dev, m->be, m->ntensors, cf->vocab_size, &tp))) return rc;
    tp->Cl = cf->num_attention_heads / n * cf->head_dim, tp->Il = cf->intermediate_size / n;
    tp->NHl = cf->num_attention_heads / n, tp->NKVl = cf->num_key_value_heads / n;
    tp->h0 = tp->r * tp->NHl;
    for (size_t i = 0; i < m->ntensors; i++)
        tp->kinds[i] = (unsigned char)llama_split_of(m, i);
    if ((rc = split_causal(tp, m->be, &m->tensors, m->ntensors, &m->nparams, &m->params))) {
        rf_tp_ctx_free(tp);
        return rc;
    }
    m->tp = tp;
    CAUSAL_RESET(m, rf_llama_bind_all);
    return RF_OK;
}

/* ---- any model ---- */

static struct rf_bert_tp *ctx_of(const rf_model *m) {
    const char *k = m->ops->name;
    if (!strcmp(k, "bert")) return ((const rf_bert *)m->impl)->tp;
    if (!strcmp(k, "gpt2")) return ((const rf_gpt2 *)m->impl)->tp;
    if (!strcmp(k, "llama")) return ((const rf_llama *)m->impl)->tp;
    return NULL;
}

const struct rf_bert_tp *rf_model_tp_ctx(const rf_model *m) {
    return ctx_of(m);
}

int rf_model_tp_check(const rf_model *m, int n) {
    const char *k = m->ops->name;
    if (!strcmp(k, "gpt2")) return gpt2_check(m->impl, n);
    if (!strcmp(k, "llama")) return llama_check(m->impl, n);
    if (!strcmp(k, "bert")) return RF_OK; /* rf_tr_parallel_check_model */
    return rf_fail(RF_ERR_UNSUPPORTED, "model: no tensor parallelism for '%s'", k);
}

int rf_model_tp_split(rf_model *m, rf_comm *tp, rf_comm *dev) {
    const char *k = m->ops->name;
    if (!strcmp(k, "bert")) return rf_bert_tp_split(m->impl, tp, dev);
    if (!strcmp(k, "gpt2")) return rf_gpt2_tp_split(m->impl, tp, dev);
    if (!strcmp(k, "llama")) return rf_llama_tp_split(m->impl, tp, dev);
    return rf_fail(RF_ERR_UNSUPPORTED, "model: no tensor parallelism for '%s'", k);
}

int rf_model_tp_spans_of(const rf_model *m, int r, rf_tp_span **spans, size_t *n) {
    *spans = NULL;
    *n = 0;
    const struct rf_bert_tp *tp = ctx_of(m);
    if (!tp) return rf_fail(RF_ERR_INVALID, "model: not split for tensor parallelism");
    if (!strcmp(m->ops->name, "bert")) return rf_bert_tp_spans_of(m->impl, r, spans, n);
    if (r < 0 || r >= tp->n)
        return rf_fail(RF_ERR_RANGE, "model: tp rank %d outside [0, %d)", r, tp->n);
    span_list sp = {0};
    size_t total, here;
    rf_model_blocks b;
    int rc = build(tp->kinds, tp->vocab.V, tp->full, tp->nfull, tp->n, r, NULL, &sp, &total);
    if (!rc) rc = rf_model_blocks_of(m, &b);
    here = rc           ? 0
           : b.ntensors ? b.tensors[b.ntensors - 1].offset + b.tensors[b.ntensors - 1].numel
                        : 0;
    if (!rc && total != here)
        rc = rf_fail(RF_ERR_INVALID, "model: tp rank %d holds %zu floats, this rank %zu", r, total,
                     here);
    if (rc) {
        free(sp.v);
        return rc;
    }
    *spans = sp.v;
    *n = sp.n;
    return RF_OK;
}

int rf_model_tp_merge(rf_model *m, const float *full) {
    const char *k = m->ops->name;
    if (!strcmp(k, "bert")) return rf_bert_tp_merge(m->impl, full);
    struct rf_bert_tp *tp = ctx_of(m);
    if (!tp) return rf_fail(RF_ERR_INVALID, "model: not split for tensor parallelism");
    int rc;
    if (!strcmp(k, "gpt2")) {
        rf_gpt2 *g = m->impl;
        if (g->grads) return rf_fail(RF_ERR_INVALID, "gpt2: release the training blocks first");
        if ((rc = merge_causal(tp, g->be, &g->tensors, &g->nparams, &g->params, full))) return rc;
        g->tp = NULL;
        CAUSAL_RESET(g, rf_gpt2_bind_all);
    } else {
        rf_llama *l = m->impl;
        if (l->grads) return rf_fail(RF_ERR_INVALID, "llama: release the training blocks first");
        if ((rc = merge_causal(tp, l->be, &l->tensors, &l->nparams, &l->params, full))) return rc;
        l->tp = NULL;
        CAUSAL_RESET(l, rf_llama_bind_all);
    }
    return RF_OK;
}
