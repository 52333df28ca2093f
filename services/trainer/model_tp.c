/* Tensor parallelism of the BERT classifier (model.h: rf_bert_tp_split): the
 * shard of a whole model for one rank of a tp group, and where it sits in the
 * whole model. The forward and backward that use it are model.c's. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "trainer/model_tp.h"
#include "trainer/tp.h"

/* How tensor i of the whole table is split over the tp ranks. */
typedef enum split_kind {
    SPLIT_NONE,  /* replicated */
    SPLIT_ROWS,  /* output rows (column-parallel weight, its bias) */
    SPLIT_COLS,  /* input columns (row-parallel weight) */
    SPLIT_VOCAB, /* word embeddings: rf_tp_vocab_split's rows */
} split_kind;

static split_kind split_of(const rf_bert *m, size_t i) {
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
 * count of tp rank r of n, from the whole model's table (full, nt tensors). */
static int build(const rf_bert *m, const rf_tensor_info *full, size_t nt, int n, int r,
                 rf_tensor_info *loc, span_list *sp, size_t *total) {
    rf_tp_vocab v;
    int rc = rf_tp_vocab_split(m->cfg.vocab_size, n, r, &v);
    size_t off = 0;
    for (size_t i = 0; !rc && i < nt; i++) {
        const rf_tensor_info *t = &full[i];
        rf_tensor_info l = *t;
        l.offset = off;
        size_t rows = (size_t)t->shape[0], cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
        switch (split_of(m, i)) {
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

int rf_bert_tp_split(rf_bert *m, rf_comm *c) {
    const rf_bert_config *cf = &m->cfg;
    int n = rf_comm_world(c), r = rf_comm_rank(c);
    if (m->tp) return rf_fail(RF_ERR_INVALID, "model: already split for tensor parallelism");
    if (m->be != rf_backend_cpu())
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "model: tensor parallelism runs on the CPU backend only, not '%s'",
                       m->be->name);
    if (m->grads)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "model: split for tensor parallelism before enabling training");
    if (cf->num_heads % n || cf->intermediate_size % n || cf->hidden_size % cf->num_heads)
        return rf_fail(RF_ERR_INVALID,
                       "model: tp %d must divide the %d attention heads and the intermediate size "
                       "%d",
                       n, cf->num_heads, cf->intermediate_size);
    struct rf_bert_tp *tp = calloc(1, sizeof *tp);
    rf_tensor_info *loc = malloc(m->ntensors * sizeof *loc);
    span_list sp = {0};
    size_t off = 0;
    int rc = tp && loc ? RF_OK : RF_ERR_NOMEM;
    if (!rc) {
        tp->c = c, tp->n = n, tp->r = r;
        tp->Cl = cf->hidden_size / n, tp->Il = cf->intermediate_size / n;
        tp->NHl = cf->num_heads / n, tp->h0 = r * tp->NHl;
        tp->embed_fwd = rf_tp_embed_fwd, tp->embed_bwd = rf_tp_embed_bwd;
        tp->qkv_fwd = rf_tp_qkv_fwd, tp->qkv_bwd = rf_tp_qkv_bwd;
        tp->colpar_fwd = rf_tp_colpar_fwd, tp->colpar_bwd = rf_tp_colpar_bwd;
        tp->rowpar_fwd = rf_tp_rowpar_fwd, tp->rowpar_bwd = rf_tp_rowpar_bwd;
        rc = rf_tp_vocab_split(cf->vocab_size, n, r, &tp->vocab);
    }
    if (!rc) rc = build(m, m->tensors, m->ntensors, n, r, loc, &sp, &off);
    void *pv = NULL; /* zeroed by the backend */
    if (!rc) rc = m->be->alloc(m->be, &pv, (off ? off : 1) * sizeof(float));
    float *p = pv;
    if (rc) {
        free(sp.v);
        free(tp);
        free(loc);
        return rc == RF_ERR_NOMEM ? rf_fail(rc, "model: out of memory for the tp shard") : rc;
    }
    tp->spans = sp.v;
    tp->nspans = sp.n;
    for (size_t k = 0; k < tp->nspans; k++) /* host memory: the CPU backend */
        memcpy(p + tp->spans[k].local, m->params + tp->spans[k].global,
               tp->spans[k].n * sizeof(float));
    (void)m->be->free(m->be, m->params); /* never fails on a valid pointer */
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
    int rc = build(m, m->tp->full, m->tp->nfull, m->tp->n, r, NULL, &sp, &total);
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
    memcpy(pv, full, tp->nparams_full * sizeof(float)); /* host memory: the CPU backend */
    if (m->params) (void)m->be->free(m->be, m->params);
    free(m->tensors);
    m->tensors = tp->full;
    m->ntensors = tp->nfull;
    m->params = pv;
    m->nparams = m->npadded = tp->nparams_full;
    free(tp->spans);
    free(tp);
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
