/* Parameter table, activation arena, forward and backward of the BERT classifier. */
#include "trainer/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/rng.h"
#include "trainer/model_tp.h"
#include "trainer/ops.h"
#include "trainer/safetensors.h"

/* A backend call that fails returns its error from the enclosing function. */
#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) return rc_;                                                                       \
    } while (0)

static int tp_size(const rf_bert *m) {
    return m->tp ? m->tp->n : 1;
}

/* Activation views for one batch capacity; the same layout serves gradients. */
typedef struct layer_acts {
    float *qkv, *att, *ctx, *res1, *ln1_mean, *ln1_rstd, *x1;
    float *fc_pre, *fc_act, *res2, *ln2_mean, *ln2_rstd, *x2;
} layer_acts;

typedef struct acts {
    float *emb_in, *emb_mean, *emb_rstd, *x0;
    float *att_scratch; /* [B,NH,T,T] working space of the attention ops, shared by layers */
    float *att_shared;  /* [B,NH,T,T] the attention probabilities: every layer's att */
    layer_acts *layers; /* caller-provided array of num_layers */
    float *cls;         /* the [CLS] rows of the last layer's input */
    float *pool_pre, *pooled, *pooled_drop, *logits, *probs, *losses;
} acts;

/* Lays out acts over base (NULL base: just counts) and returns the float
 * count. probs set: the activations, every layer its own region but for
 * the GELU output (layer 0's for all: the backward recomputes it from fc_pre,
 * one elementwise op), then one buffer of attention probabilities that every
 * layer's att points to (the backward recomputes a layer's before using them,
 * as Megatron's selective recomputation does: B NH T T floats per layer are
 * the largest activation, 1.2 GB of BERT-base's at 8 x 512 against one extra
 * attention forward per layer) and the attention scratch. probs clear: the
 * gradient arena, which needs neither (nothing takes their gradient) and
 * holds two layer regions only: the backward needs layer l's gradients and
 * the gradient of layer l's input (layer l - 1's x2) at once, never more, so
 * layer l's views are region l % 2 (rf_bert_backward_range zeroes a region
 * before it is reused). For BERT-base at 8 x 512 that is 0.4 GB instead of
 * 2.4 GB. With tp ranks (tpn > 1) the split activations (qkv, attention
 * context and probabilities, the MLP's intermediate) hold this rank's 1/tpn.
 * stats (rf_backend_attention_stats): the attention keeps a row's
 * statistics, not its probabilities, so both of its buffers are B NH T floats. */
static size_t layout(const rf_bert_config *c, int B, int T, float *base, acts *a, bool probs,
                     int tpn, bool stats) {
    size_t N = (size_t)B * T, C = c->hidden_size, I = c->intermediate_size, K = c->num_labels;
    size_t Cl = C / (size_t)tpn, Il = I / (size_t)tpn;
    size_t off = 0, P = (size_t)B * (c->num_heads / tpn) * T * (stats ? 1 : (size_t)T);
#define TAKE(ptr, n)                                                                               \
    do {                                                                                           \
        if (base) ptr = base + off;                                                                \
        off += ((size_t)(n) + 15) & ~(size_t)15;                                                   \
    } while (0)
    TAKE(a->emb_in, N * C);
    TAKE(a->emb_mean, N);
    TAKE(a->emb_rstd, N);
    TAKE(a->x0, N * C);
    for (int l = 0; l < c->num_layers; l++) {
        layer_acts *L = &a->layers[l];
        if (!probs && l >= 2) { /* the gradient arena's two regions */
            *L = a->layers[l % 2];
            continue;
        }
        TAKE(L->qkv, 3 * N * Cl);
        TAKE(L->ctx, N * Cl);
        TAKE(L->res1, N * C);
        TAKE(L->ln1_mean, N);
        TAKE(L->ln1_rstd, N);
        TAKE(L->x1, N * C);
        TAKE(L->fc_pre, N * Il);
        if (probs && l > 0) { /* one GELU output for every layer, as att */
            if (base) L->fc_act = a->layers[0].fc_act;
        } else {
            TAKE(L->fc_act, N * Il);
        }
        TAKE(L->res2, N * C);
        TAKE(L->ln2_mean, N);
        TAKE(L->ln2_rstd, N);
        TAKE(L->x2, N * C);
        L->att = NULL;
    }
    TAKE(a->cls, B * C);
    TAKE(a->pool_pre, B * C);
    TAKE(a->pooled, B * C);
    TAKE(a->pooled_drop, B * C);
    TAKE(a->logits, B * K);
    TAKE(a->probs, B * K);
    TAKE(a->losses, B);
    a->att_scratch = a->att_shared = NULL;
    if (probs) {
        TAKE(a->att_shared, P);
        for (int l = 0; base && l < c->num_layers; l++)
            a->layers[l].att = a->att_shared;
        TAKE(a->att_scratch, P);
    }
#undef TAKE
    return off;
}

static int add_tensor(rf_bert *m, size_t *cap, const char *name, int rows, int cols, bool decay) {
    if (m->ntensors == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        rf_tensor_info *t = realloc(m->tensors, nc * sizeof *t);
        if (!t) return RF_ERR_NOMEM;
        m->tensors = t;
        *cap = nc;
    }
    rf_tensor_info *t = &m->tensors[m->ntensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = m->nparams;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->numel = (size_t)rows * (cols ? cols : 1);
    t->decay = decay;
    m->nparams += t->numel;
    return RF_OK;
}

/* The parameter table, in buffer order. */
static int build_table(rf_bert *m) {
    const rf_bert_config *c = &m->cfg;
    int C = c->hidden_size, I = c->intermediate_size;
    size_t cap = 0;
    char n[96];
    int rc = 0;
#define T2(name, r, k) rc = rc ? rc : add_tensor(m, &cap, name, r, k, true)
#define T1(name, r)    rc = rc ? rc : add_tensor(m, &cap, name, r, 0, false)
    T2("bert.embeddings.word_embeddings.weight", c->vocab_size, C);
    T2("bert.embeddings.position_embeddings.weight", c->max_position, C);
    T2("bert.embeddings.token_type_embeddings.weight", c->type_vocab_size, C);
    T1("bert.embeddings.LayerNorm.weight", C);
    T1("bert.embeddings.LayerNorm.bias", C);
    for (int l = 0; l < c->num_layers; l++) {
        const char *qkv[3] = {"query", "key", "value"};
        for (int i = 0; i < 3; i++) {
            snprintf(n, sizeof n, "bert.encoder.layer.%d.attention.self.%s.weight", l, qkv[i]);
            T2(n, C, C);
        }
        for (int i = 0; i < 3; i++) {
            snprintf(n, sizeof n, "bert.encoder.layer.%d.attention.self.%s.bias", l, qkv[i]);
            T1(n, C);
        }
        static const struct {
            const char *suffix;
            int rows, cols; /* 0 = C, -1 = I */
            bool decay;
        } rest[] = {
            {"attention.output.dense.weight", 0, 0, true},
            {"attention.output.dense.bias", 0, -2, false},
            {"attention.output.LayerNorm.weight", 0, -2, false},
            {"attention.output.LayerNorm.bias", 0, -2, false},
            {"intermediate.dense.weight", -1, 0, true},
            {"intermediate.dense.bias", -1, -2, false},
            {"output.dense.weight", 0, -1, true},
            {"output.dense.bias", 0, -2, false},
            {"output.LayerNorm.weight", 0, -2, false},
            {"output.LayerNorm.bias", 0, -2, false},
        };
        for (size_t i = 0; i < sizeof rest / sizeof rest[0] && !rc; i++) {
            snprintf(n, sizeof n, "bert.encoder.layer.%d.%s", l, rest[i].suffix);
            int r = rest[i].rows == -1 ? I : C;
            int k = rest[i].cols == -2 ? 0 : rest[i].cols == -1 ? I : C;
            rc = add_tensor(m, &cap, n, r, k, rest[i].decay);
        }
    }
    T2("bert.pooler.dense.weight", C, C);
    T1("bert.pooler.dense.bias", C);
    T2("classifier.weight", c->num_labels, C);
    T1("classifier.bias", c->num_labels);
#undef T1
#undef T2
    return rc;
}

/* Fills unit u's views of a parameter-shaped block; base[0] is the unit's
 * first element (see rf_bert_unit_range). */
static void bind_unit(rf_bert *m, int u, float *base, rf_bert_params *v) {
    const rf_tensor_info *t = m->tensors;
    int L = m->cfg.num_layers;
    size_t lo, hi;
    rf_bert_unit_range(m, u, &lo, &hi);
#define AT(i) (base + (t[i].offset - lo))
    if (u == 0) {
        v->wte = AT(0);
        v->wpe = AT(1);
        v->wtt = AT(2);
        v->eln_w = AT(3);
        v->eln_b = AT(4);
    } else if (u <= L) {
        size_t f = 5 + 16 * (size_t)(u - 1);
        rf_bert_layer *o = &v->layers[u - 1];
        float **dst[] = {&o->qkv_w, NULL,     NULL,      &o->qkv_b, NULL,     NULL,
                         &o->ao_w,  &o->ao_b, &o->ln1_w, &o->ln1_b, &o->fc_w, &o->fc_b,
                         &o->fo_w,  &o->fo_b, &o->ln2_w, &o->ln2_b};
        for (int i = 0; i < 16; i++)
            if (dst[i]) *dst[i] = AT(f + (size_t)i);
    } else {
        size_t h = 5 + 16 * (size_t)L;
        v->pool_w = AT(h);
        v->pool_b = AT(h + 1);
        v->cls_w = AT(h + 2);
        v->cls_b = AT(h + 3);
    }
#undef AT
}

/* Fills views of a whole parameter-shaped block (params or grads). */
static void bind(rf_bert *m, float *base, rf_bert_params *v) {
    for (int u = 0; u < rf_bert_units(m); u++) {
        size_t lo, hi;
        rf_bert_unit_range(m, u, &lo, &hi);
        bind_unit(m, u, base + lo, v);
    }
}

int rf_bert_units(const rf_bert *m) {
    return m->cfg.num_layers + 2;
}

void rf_bert_unit_range(const rf_bert *m, int u, size_t *lo, size_t *hi) {
    int L = m->cfg.num_layers;
    size_t first = u == 0 ? 0 : u <= L ? 5 + 16 * (size_t)(u - 1) : 5 + 16 * (size_t)L;
    size_t last = u == 0 ? 4 : u <= L ? first + 15 : first + 3; /* inclusive */
    *lo = m->tensors[first].offset;
    *hi = m->tensors[last].offset + m->tensors[last].numel;
}

void rf_bert_bind_unit(rf_bert *m, int u, float *p, float *g) {
    if (p) bind_unit(m, u, p, &m->p);
    if (g) bind_unit(m, u, g, &m->g);
}

void rf_bert_bind_all(rf_bert *m) {
    if (m->params) bind(m, m->params, &m->p);
    if (m->grads) bind(m, m->grads, &m->g);
}

void rf_bert_release_blocks(rf_bert *m, bool params) {
    /* free never fails on a valid pointer (both backends); nothing to report */
    if (params) {
        (void)m->be->free(m->be, m->params);
        m->params = NULL;
    }
    (void)m->be->free(m->be, m->grads);
    (void)m->be->free(m->be, m->m);
    (void)m->be->free(m->be, m->v);
    m->grads = m->m = m->v = NULL;
    m->npadded = m->params ? m->nparams : 0;
    m->nmoments = 0;
}

int rf_bert_adopt_params(rf_bert *m, const float *host) {
    if (!m->params) {
        void *p = NULL;
        int rc = m->be->alloc(m->be, &p, m->nparams * sizeof(float));
        if (rc) return rf_fail_ctx(rc, "model: no memory for %zu parameters", m->nparams);
        m->params = p;
    }
    TRY(m->be->to_device(m->be, m->params, host, m->nparams * sizeof(float)));
    m->npadded = m->npadded > m->nparams ? m->npadded : m->nparams;
    rf_bert_bind_all(m);
    return RF_OK;
}

/* The unit hook (see rf_unit_hook), if any. */
static int unit_event(rf_bert *m, int u, rf_unit_event ev) {
    return m->unit_hook ? m->unit_hook(m->unit_user, m, u, ev) : RF_OK;
}

int rf_bert_new(const rf_bert_config *cfg, const rf_backend *be, rf_bert **out) {
    *out = NULL;
    rf_bert *m = calloc(1, sizeof *m);
    if (!m) return RF_ERR_NOMEM;
    m->cfg = *cfg;
    m->be = be;
    int rc = build_table(m);
    if (!rc) {
        m->p.layers = calloc((size_t)cfg->num_layers, sizeof(rf_bert_layer));
        m->g.layers = calloc((size_t)cfg->num_layers, sizeof(rf_bert_layer));
        m->params = rf_backend_alloc(be, m->nparams * sizeof(float));
        if (!m->p.layers || !m->g.layers || !m->params) rc = RF_ERR_NOMEM;
    }
    if (rc) {
        rf_bert_free(m);
        return rc == RF_ERR_NOMEM
                   ? rf_fail(rc, "model: out of memory for %zu parameters", m->nparams)
                   : rc;
    }
    bind(m, m->params, &m->p);
    m->npadded = m->nparams;
    *out = m;
    return RF_OK;
}

void rf_bert_free(rf_bert *m) {
    if (!m) return;
    const rf_backend *be = m->be;
    rf_backend_free(be, m->params);
    rf_backend_free(be, m->grads);
    rf_backend_free(be, m->m);
    rf_backend_free(be, m->v);
    rf_backend_free(be, m->acts);
    rf_backend_free(be, m->dacts);
    rf_inputs_free(&m->in, be);
    rf_backend_free(be, m->class_weights_dev);
    free(m->p.layers);
    free(m->g.layers);
    free(m->tensors);
    rf_tp_ctx_free(m->tp);
    free(m);
}

int rf_bert_set_class_weights(rf_bert *m, const float *w) {
    const rf_backend *be = m->be;
    if (!w) {
        rf_backend_free(be, m->class_weights_dev);
        m->class_weights_dev = NULL;
        return RF_OK;
    }
    size_t bytes = (size_t)m->cfg.num_labels * sizeof(float);
    if (!m->class_weights_dev && !(m->class_weights_dev = rf_backend_alloc(be, bytes)))
        return RF_ERR_NOMEM;
    TRY(be->to_device(be, m->class_weights_dev, w, bytes));
    return RF_OK;
}

const rf_tensor_info *rf_bert_find(const rf_bert *m, const char *name) {
    for (size_t i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

static void normal_fill(float *x, size_t n, float std, rf_rng *r) {
    for (size_t i = 0; i < n; i += 2) { /* Box-Muller, two values per draw */
        double u1 = 1.0 - rf_rng_double(r), u2 = rf_rng_double(r);
        double rad = sqrt(-2.0 * log(u1));
        x[i] = (float)(std * rad * cos(2 * M_PI * u2));
        if (i + 1 < n) x[i + 1] = (float)(std * rad * sin(2 * M_PI * u2));
    }
}

int rf_bert_init_head(rf_bert *m, uint64_t seed) {
    rf_rng r;
    rf_rng_seed(&r, seed);
    size_t nw = (size_t)m->cfg.num_labels * m->cfg.hidden_size;
    float *w = malloc(nw * sizeof(float));
    if (!w) return RF_ERR_NOMEM;
    normal_fill(w, nw, m->cfg.initializer_range, &r);
    int rc = m->be->to_device(m->be, m->p.cls_w, w, nw * sizeof(float));
    if (!rc) rc = m->be->zero(m->be, m->p.cls_b, (size_t)m->cfg.num_labels * sizeof(float));
    free(w);
    return rc;
}

static bool is_head(const char *name) {
    return strncmp(name, "classifier.", 11) == 0 || strncmp(name, "bert.pooler.", 12) == 0;
}

int rf_bert_load(const char *dir, int num_labels, uint64_t seed, const rf_backend *be,
                 rf_bert **out) {
    char path[4096];
    rf_bert_config cfg;
    *out = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = rf_bert_config_load(path, num_labels, &cfg);
    if (rc) return rc;
    rf_st_file *st = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((rc = rf_st_open(path, &st))) return rc;
    rf_bert *m;
    if ((rc = rf_bert_new(&cfg, be, &m))) {
        rf_st_free(st);
        return rc;
    }
    rf_rng r;
    rf_rng_seed(&r, seed);
    float *host = NULL;
    size_t used = 0, host_cap = 0;
    bool head_missing = false;
    for (size_t i = 0; i < m->ntensors && !rc; i++) {
        rf_tensor_info *t = &m->tensors[i];
        const rf_st_tensor *s = rf_st_find(st, t->name);
        if (!s && strncmp(t->name, "bert.", 5) == 0) s = rf_st_find(st, t->name + 5);
        bool classifier = strncmp(t->name, "classifier.", 11) == 0;
        if (s && classifier && num_labels > 0 && s->ndim >= 1 && s->shape[0] != num_labels)
            s = NULL; /* a new head with a different label count */
        if (host_cap < t->numel) {
            free(host);
            host_cap = t->numel;
            if (!(host = malloc(host_cap * sizeof(float)))) {
                rc = RF_ERR_NOMEM;
                break;
            }
        }
        if (!s) {
            if (!is_head(t->name)) {
                rc = rf_fail(RF_ERR_NOT_FOUND, "%s: tensor '%s' is missing", path, t->name);
                break;
            }
            head_missing = true;
            if (t->ndim == 2)
                normal_fill(host, t->numel, cfg.initializer_range, &r);
            else
                memset(host, 0, t->numel * sizeof(float));
        } else {
            used++;
            bool ok = s->ndim == t->ndim && s->shape[0] == t->shape[0] &&
                      (t->ndim == 1 || s->shape[1] == t->shape[1]);
            if (!ok) {
                rc = rf_fail(RF_ERR_INVALID,
                             "%s: tensor '%s' has shape [%lld%s%lld], the config needs [%d,%d]",
                             path, s->name, (long long)(s->ndim ? s->shape[0] : 0),
                             s->ndim > 1 ? "," : "", (long long)(s->ndim > 1 ? s->shape[1] : 0),
                             t->shape[0], t->shape[1]);
                break;
            }
            if ((rc = rf_st_to_f32(s, host))) {
                rc = rf_fail_ctx(rc, "%s", path);
                break;
            }
        }
        rc = be->to_device(be, m->params + t->offset, host, t->numel * sizeof(float));
    }
    free(host);
    if (!rc && used < st->n) {
        for (size_t i = 0; i < st->n; i++) {
            const char *nm = st->tensors[i].name;
            char full[128];
            snprintf(full, sizeof full, "bert.%s", nm);
            if (!rf_bert_find(m, nm) && !rf_bert_find(m, full) && !strstr(nm, "position_ids"))
                rf_warn("trainer", "%s: ignoring tensor '%s' (not part of the classifier)", path,
                        nm);
        }
    }
    if (!rc && head_missing)
        rf_info("trainer", "%s: pooler/classifier not in the checkpoint, initialised (seed %llu)",
                path, (unsigned long long)seed);
    rf_st_free(st);
    if (rc) {
        rf_bert_free(m);
        return rc;
    }
    *out = m;
    return RF_OK;
}

int rf_bert_save_safetensors(const rf_bert *m, const char *path) {
    if (m->tp)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "model: %s: a tensor-parallel shard is not a whole model (gather it first)",
                       path);
    rf_st_out *o = calloc(m->ntensors, sizeof *o);
    float *host = malloc(m->nparams * sizeof(float));
    int rc = o && host ? RF_OK : RF_ERR_NOMEM;
    if (!rc) {
        rc = m->be->to_host(m->be, host, m->params, m->nparams * sizeof(float));
    }
    if (!rc) {
        for (size_t i = 0; i < m->ntensors; i++) {
            const rf_tensor_info *t = &m->tensors[i];
            o[i].name = t->name;
            o[i].ndim = t->ndim;
            o[i].shape[0] = t->shape[0];
            o[i].shape[1] = t->shape[1];
            o[i].data = host + t->offset;
        }
        rc = rf_st_write(path, o, m->ntensors);
    }
    free(o);
    free(host);
    return rc;
}

int rf_bert_enable_training(rf_bert *m) {
    return rf_bert_enable_training_sharded(m, m->nparams, m->nparams);
}

int rf_bert_enable_training_sharded(rf_bert *m, size_t padded, size_t moments) {
    if (m->grads) return RF_OK;
    if (padded < m->nparams) padded = m->nparams;
    if (padded > m->nparams) { /* room for the collectives' padding: move params */
        float *p = rf_backend_alloc(m->be, padded * sizeof(float));
        if (!p) return rf_fail(RF_ERR_NOMEM, "model: no memory for padded parameters");
        int rc = m->be->copy(m->be, p, m->params, m->nparams * sizeof(float));
        if (rc) {
            rf_backend_free(m->be, p);
            return rc;
        }
        rf_backend_free(m->be, m->params);
        m->params = p;
        bind(m, m->params, &m->p);
    }
    m->npadded = padded;
    m->nmoments = moments;
    m->grads = rf_backend_alloc(m->be, padded * sizeof(float));
    m->m = rf_backend_alloc(m->be, (moments ? moments : 1) * sizeof(float));
    m->v = rf_backend_alloc(m->be, (moments ? moments : 1) * sizeof(float));
    if (!m->grads || !m->m || !m->v) return rf_fail(RF_ERR_NOMEM, "model: no memory for grads");
    bind(m, m->grads, &m->g);
    return RF_OK;
}

int rf_bert_zero_grad(rf_bert *m) {
    return m->grads ? m->be->zero(m->be, m->grads, m->npadded * sizeof(float)) : RF_OK;
}

int rf_bert_reserve(rf_bert *m, int B, int T) {
    if (B <= m->capB && T <= m->capT) return RF_OK;
    if (T > m->cfg.max_position)
        return rf_fail(RF_ERR_RANGE, "model: sequence length %d exceeds max_position_embeddings %d",
                       T, m->cfg.max_position);
    const rf_backend *be = m->be;
    B = B > m->capB ? B : m->capB;
    T = T > m->capT ? T : m->capT;
    int rc = rf_backend_attention_stats(be, m->cfg.hidden_size / m->cfg.num_heads, &m->att_stats);
    if (rc) return rc;
    layer_acts *la = calloc((size_t)m->cfg.num_layers, sizeof *la);
    if (!la) return RF_ERR_NOMEM;
    acts a = {.layers = la};
    size_t n = layout(&m->cfg, B, T, NULL, &a, true, tp_size(m), m->att_stats),
           ng = layout(&m->cfg, B, T, NULL, &a, false, tp_size(m), m->att_stats);
    free(la);
    rf_backend_free(be, m->acts);
    rf_backend_free(be, m->dacts);
    m->acts = rf_backend_alloc(be, n * sizeof(float));
    m->dacts = rf_backend_alloc(be, ng * sizeof(float));
    size_t nt = (size_t)B * T, nb = (size_t)B * sizeof(int32_t),
           pieces[5] = {nt * sizeof(int32_t), nt * sizeof(int32_t), nt, nb, nb};
    int irc = rf_inputs_alloc(&m->in, be, 5, pieces);
    m->ids_dev = irc ? NULL : rf_inputs_dev(&m->in, 0);
    m->types_dev = irc ? NULL : rf_inputs_dev(&m->in, 1);
    m->valid_dev = irc ? NULL : rf_inputs_dev(&m->in, 2);
    m->cls_rows_dev = irc ? NULL : rf_inputs_dev(&m->in, 3);
    m->labels_dev = irc ? NULL : rf_inputs_dev(&m->in, 4);
    m->capB = B;
    m->capT = T;
    m->nacts = n;
    if (!m->acts || !m->dacts || irc) {
        m->capB = m->capT = 0;
        return rf_fail(RF_ERR_NOMEM, "model: no memory for activations of %dx%d", B, T);
    }
    return RF_OK;
}

static uint64_t head_site(const rf_bert_config *c) {
    return 1 + 4 * (uint64_t)c->num_layers;
}

/* Per-site dropout seeds: a site is one dropout call of the graph. */
static uint64_t site_seed(uint64_t seed, uint64_t site) {
    uint64_t x = seed ^ (site * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 31)) * 0xd6e8feb86659fd93ull;
    return x ^ (x >> 32);
}

/* Boundary u of the residual stream (1 <= u <= num_layers + 1): the input of
 * unit u, in an activation-shaped arena (acts or dacts). */
static float *boundary_slot(const rf_bert_config *c, acts *a, int u) {
    return u == 1 ? a->x0 : a->layers[u - 2].x2;
}

size_t rf_bert_boundary_floats(const rf_bert *m, int B, int T, int u) {
    /* the last layer keeps only the [CLS] rows: the head's input is [B, 1, C] */
    size_t rows = u == m->cfg.num_layers + 1 ? (size_t)B : (size_t)B * T;
    return rows * (size_t)m->cfg.hidden_size;
}

/* at_u0, at_u1: the boundary buffers of the range's ends (input and output
 * forward, their gradients backward). */
static int check_range(const rf_bert *m, int u0, int u1, const float *at_u0, const float *at_u1) {
    int n = rf_bert_units(m);
    if (u0 < 0 || u1 > n || u0 >= u1)
        return rf_fail(RF_ERR_RANGE, "model: unit range [%d, %d) outside [0, %d)", u0, u1, n);
    if ((u0 > 0 && !at_u0) || (u1 < n && !at_u1))
        return rf_fail(RF_ERR_INVALID, "model: unit range [%d, %d) needs its boundary buffers", u0,
                       u1);
    return RF_OK;
}

int rf_bert_forward(rf_bert *m, const rf_batch *bt, bool train, uint64_t dropout_seed) {
    return rf_bert_forward_range(m, bt, train, dropout_seed, 0, rf_bert_units(m), NULL, NULL);
}

int rf_bert_forward_range(rf_bert *m, const rf_batch *bt, bool train, uint64_t dropout_seed, int u0,
                          int u1, const float *in, float *out) {
    const rf_bert_config *c = &m->cfg;
    const rf_backend *be = m->be;
    int B = bt->B, T = bt->T, C = c->hidden_size, I = c->intermediate_size, K = c->num_labels;
    size_t N = (size_t)B * T;
    if (B <= 0 || T <= 0) return rf_fail(RF_ERR_INVALID, "model: empty batch");
    int rc = check_range(m, u0, u1, in, out);
    if (rc) return rc;
    for (size_t i = 0; i < N; i++) {
        if (bt->ids[i] < 0 || bt->ids[i] >= c->vocab_size)
            return rf_fail(RF_ERR_RANGE, "model: token id %d outside the vocabulary (%d)",
                           bt->ids[i], c->vocab_size);
        if (bt->types[i] < 0 || bt->types[i] >= c->type_vocab_size)
            return rf_fail(RF_ERR_RANGE, "model: token type %d outside [0, %d)", bt->types[i],
                           c->type_vocab_size);
    }
    for (int b = 0; bt->labels && b < B; b++)
        if (bt->labels[b] >= K)
            return rf_fail(RF_ERR_RANGE, "model: label %d outside [0, %d)", bt->labels[b], K);
    rc = rf_bert_reserve(m, B, T);
    if (rc) return rc;
    memcpy(rf_inputs_host(&m->in, 0), bt->ids, N * sizeof(int32_t));
    memcpy(rf_inputs_host(&m->in, 1), bt->types, N * sizeof(int32_t));
    memcpy(rf_inputs_host(&m->in, 2), bt->valid, N);
    int32_t *rows = rf_inputs_host(&m->in, 3);
    for (int b = 0; b < B; b++)
        rows[b] = b * T;
    if (bt->labels) memcpy(rf_inputs_host(&m->in, 4), bt->labels, (size_t)B * sizeof(int32_t));
    TRY(rf_inputs_send(&m->in, be, bt->labels ? 5 : 4)); /* one upload */
    m->last = *bt;
    m->last_train = train;
    m->last_seed = dropout_seed;

    struct rf_bert_tp *tp = m->tp;
    int Cl = tp ? tp->Cl : C, Il = tp ? tp->Il : I;
    layer_acts la[c->num_layers];
    acts a = {.layers = la};
    layout(c, B, T, m->acts, &a, true, tp_size(m), m->att_stats);
    float ph = train ? c->hidden_dropout : 0, pa = train ? c->attention_dropout : 0,
          pc = train ? c->classifier_dropout : 0;
    int head = c->num_layers + 1;
    if (u0 > 0) /* the residual stream from the stage before */
        TRY(be->copy(be, boundary_slot(c, &a, u0), in,
                     rf_bert_boundary_floats(m, B, T, u0) * sizeof(float)));

    if (u0 == 0) {
        TRY(unit_event(m, 0, RF_UNIT_FWD));
        if (tp)
            TRY(tp->embed_fwd(&tp->g, a.emb_in, m->ids_dev, NULL, m->types_dev, m->p.wte,
                              &tp->vocab, m->p.wpe, m->p.wtt, B, T, C));
        else
            TRY(be->embed_fwd(be, a.emb_in, m->ids_dev, m->types_dev, m->p.wte, m->p.wpe, m->p.wtt,
                              B, T, C));
        TRY(be->layernorm_fwd(be, a.x0, a.emb_mean, a.emb_rstd, a.emb_in, m->p.eln_w, m->p.eln_b,
                              (int)N, C, c->layer_norm_eps));
        TRY(be->dropout_fwd(be, a.x0, a.x0, N * C, ph, site_seed(dropout_seed, 0)));
    }
    for (int l = 0; l < c->num_layers; l++) {
        if (1 + l < u0 || 1 + l >= u1) continue;
        const float *x = l ? la[l - 1].x2 : a.x0;
        TRY(unit_event(m, 1 + l, RF_UNIT_FWD));
        const rf_bert_layer *P = &m->p.layers[l];
        layer_acts *L = &la[l];
        uint64_t s = 1 + 4 * (uint64_t)l;
        /* Only the [CLS] rows reach the head, so the last layer takes its
         * queries, and runs everything after attention, on those B rows. */
        bool last = l == c->num_layers - 1;
        int Tq = last ? 1 : T;
        size_t Nq = (size_t)B * Tq;
        const float *xq = x;
        if (last) { /* row 0 of each sequence, in one copy */
            TRY(be->copy2d(be, a.cls, C * sizeof(float), x, (size_t)T * C * sizeof(float),
                           C * sizeof(float), (size_t)B));
            xq = a.cls;
        }
        /* the attention's probabilities are not kept (att NULL): the backward
         * recomputes them (layout) */
        if (tp) { /* QKV column-parallel by heads, attention on the local heads, output
                   * projection row-parallel (one all-reduce) */
            TRY(tp->qkv_fwd(&tp->g, L->qkv, x, P->qkv_w, P->qkv_b, Cl, (int)N, C, Cl));
            TRY(be->attention_fwd(be, L->ctx, NULL, a.att_scratch, L->qkv, m->valid_dev, B, T, Tq,
                                  Cl, tp->NHl, tp->h0, c->num_heads, pa,
                                  site_seed(dropout_seed, s)));
            TRY(tp->rowpar_fwd(&tp->g, L->res1, L->ctx, Cl, P->ao_w, Cl, P->ao_b, (int)Nq, Cl, C));
        } else {
            TRY(be->linear_fwd(be, L->qkv, x, P->qkv_w, P->qkv_b, (int)N, C, 3 * C));
            TRY(be->attention_fwd(be, L->ctx, NULL, a.att_scratch, L->qkv, m->valid_dev, B, T, Tq,
                                  C, c->num_heads, 0, c->num_heads, pa,
                                  site_seed(dropout_seed, s)));
            TRY(be->linear_fwd(be, L->res1, L->ctx, P->ao_w, P->ao_b, (int)Nq, C, C));
        }
        TRY(be->residual_fwd(be, L->res1, L->res1, xq, Nq * C, ph, site_seed(dropout_seed, s + 1)));
        TRY(be->layernorm_fwd(be, L->x1, L->ln1_mean, L->ln1_rstd, L->res1, P->ln1_w, P->ln1_b,
                              (int)Nq, C, c->layer_norm_eps));
        if (tp) { /* up column-parallel, down row-parallel (one all-reduce) */
            TRY(tp->colpar_fwd(&tp->g, L->fc_pre, Il, L->x1, P->fc_w, C, P->fc_b, (int)Nq, C, Il));
            TRY(be->gelu_fwd(be, L->fc_act, L->fc_pre, Nq * Il));
            TRY(tp->rowpar_fwd(&tp->g, L->res2, L->fc_act, Il, P->fo_w, Il, P->fo_b, (int)Nq, Il,
                               C));
        } else {
            TRY(be->linear_fwd(be, L->fc_pre, L->x1, P->fc_w, P->fc_b, (int)Nq, C, I));
            TRY(be->gelu_fwd(be, L->fc_act, L->fc_pre, Nq * I));
            TRY(be->linear_fwd(be, L->res2, L->fc_act, P->fo_w, P->fo_b, (int)Nq, I, C));
        }
        TRY(be->residual_fwd(be, L->res2, L->res2, L->x1, Nq * C, ph,
                             site_seed(dropout_seed, s + 2)));
        TRY(be->layernorm_fwd(be, L->x2, L->ln2_mean, L->ln2_rstd, L->res2, P->ln2_w, P->ln2_b,
                              (int)Nq, C, c->layer_norm_eps));
    }
    m->logits = a.logits;
    m->probs = a.probs;
    m->losses = a.losses;
    m->loss = 0.0f;
    if (u1 < head + 1) /* the residual stream for the stage after */
        return be->copy(be, out, boundary_slot(c, &a, u1),
                        rf_bert_boundary_floats(m, B, T, u1) * sizeof(float));
    const float *x = la[c->num_layers - 1].x2; /* [B, C]: the [CLS] rows */
    TRY(unit_event(m, head, RF_UNIT_FWD));
    TRY(be->linear_fwd(be, a.pool_pre, x, m->p.pool_w, m->p.pool_b, B, C, C));
    TRY(be->tanh_fwd(be, a.pooled, a.pool_pre, (size_t)B * C));
    TRY(be->dropout_fwd(be, a.pooled_drop, a.pooled, (size_t)B * C, pc,
                        site_seed(dropout_seed, head_site(c))));
    TRY(be->linear_fwd(be, a.logits, a.pooled_drop, m->p.cls_w, m->p.cls_b, B, C, K));
    if (bt->labels)
        TRY(be->xent_fwd(be, &m->loss, a.probs, a.losses, a.logits, m->labels_dev,
                         m->class_weights_dev, B, K));
    return RF_OK;
}

int rf_bert_backward(rf_bert *m, float loss_scale) {
    return rf_bert_backward_range(m, loss_scale, 0, rf_bert_units(m), NULL, NULL);
}

int rf_bert_backward_range(rf_bert *m, float loss_scale, int u0, int u1, const float *dout,
                           float *din) {
    const rf_bert_config *c = &m->cfg;
    const rf_backend *be = m->be;
    int B = m->last.B, T = m->last.T, C = c->hidden_size, I = c->intermediate_size,
        K = c->num_labels;
    size_t N = (size_t)B * T;
    int rc = check_range(m, u0, u1, din, dout);
    if (rc) return rc;
    bool tr = m->last_train;
    uint64_t seed = m->last_seed;
    float ph = tr ? c->hidden_dropout : 0, pa = tr ? c->attention_dropout : 0,
          pc = tr ? c->classifier_dropout : 0;
    struct rf_bert_tp *tp = m->tp;
    int Cl = tp ? tp->Cl : C, Il = tp ? tp->Il : I;
    layer_acts la[c->num_layers], dla[c->num_layers];
    acts a = {.layers = la}, d = {.layers = dla};
    layout(c, B, T, m->acts, &a, true, tp_size(m), m->att_stats);
    size_t used = layout(c, B, T, m->dacts, &d, false, tp_size(m), m->att_stats);
    TRY(be->zero(be, m->dacts, used * sizeof(float)));
    int head = c->num_layers + 1, last = c->num_layers - 1;
    /* the floats of one layer region of the gradient arena (layout), and the
     * first layer this range runs backward */
    size_t region = c->num_layers > 1 ? (size_t)(dla[1].qkv - dla[0].qkv) : 0;
    int first = u1 - 2 < last ? u1 - 2 : last;

    /* unit events: a hook failure (a collective) ends the backward with its error */
    if (u1 == head + 1) {
        TRY(unit_event(m, head, RF_UNIT_BWD));
        TRY(be->xent_bwd(be, d.logits, a.probs, m->labels_dev, m->class_weights_dev, B, K,
                         loss_scale));
        TRY(be->linear_bwd(be, d.pooled_drop, m->g.cls_w, m->g.cls_b, d.logits, a.pooled_drop,
                           m->p.cls_w, B, C, K));
        TRY(be->dropout_bwd(be, d.pooled, d.pooled_drop, (size_t)B * C, pc,
                            site_seed(seed, head_site(c))));
        TRY(be->tanh_bwd(be, d.pool_pre, a.pooled, d.pooled, (size_t)B * C));
        TRY(be->linear_bwd(be, dla[last].x2, m->g.pool_w, m->g.pool_b, d.pool_pre, la[last].x2,
                           m->p.pool_w, B, C, C));
        TRY(unit_event(m, head, RF_UNIT_BWD_DONE));
    } else { /* the residual stream's gradient from the stage after */
        TRY(be->copy(be, boundary_slot(c, &d, u1), dout,
                     rf_bert_boundary_floats(m, B, T, u1) * sizeof(float)));
    }
    for (int l = last; l >= 0; l--) {
        if (1 + l < u0 || 1 + l >= u1) continue;
        TRY(unit_event(m, 1 + l, RF_UNIT_BWD));
        const rf_bert_layer *P = &m->p.layers[l], *G = &m->g.layers[l];
        layer_acts *L = &la[l], *D = &dla[l];
        const float *x = l ? la[l - 1].x2 : a.x0;
        float *dxin = l ? dla[l - 1].x2 : d.x0;
        /* layer l - 1's region held layer l + 1's gradients: cleared for dxin */
        if (l >= 1 && l + 1 <= first) TRY(be->zero(be, dla[l - 1].qkv, region * sizeof(float)));
        uint64_t s = 1 + 4 * (uint64_t)l;
        int Tq = l == last ? 1 : T; /* as in forward: the last layer's queries are [CLS] rows */
        size_t Nq = (size_t)B * Tq;
        float *dxq = l == last ? d.cls : dxin;
        /* x2 = LN(res2), res2 = dropout(fo) + x1; D->res1 is scratch for d(fo). */
        TRY(be->layernorm_bwd(be, D->res2, G->ln2_w, G->ln2_b, D->x2, L->res2, P->ln2_w,
                              L->ln2_mean, L->ln2_rstd, (int)Nq, C));
        TRY(be->residual_bwd(be, D->res1, D->x1, D->res2, Nq * C, ph, site_seed(seed, s + 2)));
        if (tp) { /* down row-parallel (no communication), up column-parallel (one all-reduce
                   * of d(x1), which holds the replicated residual gradient already) */
            TRY(be->gelu_fwd(be, L->fc_act, L->fc_pre, Nq * Il)); /* recomputed (layout) */
            TRY(tp->rowpar_bwd(&tp->g, D->fc_act, Il, G->fo_w, Il, G->fo_b, D->res1, L->fc_act,
                               P->fo_w, (int)Nq, Il, C));
            TRY(be->gelu_bwd(be, D->fc_pre, L->fc_pre, D->fc_act, Nq * Il));
            TRY(tp->colpar_bwd(&tp->g, D->x1, G->fc_w, G->fc_b, C, D->fc_pre, Il, L->x1, P->fc_w,
                               (int)Nq, C, Il));
        } else {
            TRY(be->gelu_fwd(be, L->fc_act, L->fc_pre, Nq * I)); /* recomputed (layout) */
            TRY(be->linear_bwd(be, D->fc_act, G->fo_w, G->fo_b, D->res1, L->fc_act, P->fo_w,
                               (int)Nq, I, C));
            TRY(be->gelu_bwd(be, D->fc_pre, L->fc_pre, D->fc_act, Nq * I));
            TRY(be->linear_bwd(be, D->x1, G->fc_w, G->fc_b, D->fc_pre, L->x1, P->fc_w, (int)Nq, C,
                               I));
        }
        /* x1 = LN(res1), res1 = dropout(ao) + xq; D->res2 is scratch for d(ao). */
        TRY(be->zero(be, D->res1, Nq * C * sizeof(float)));
        TRY(be->layernorm_bwd(be, D->res1, G->ln1_w, G->ln1_b, D->x1, L->res1, P->ln1_w,
                              L->ln1_mean, L->ln1_rstd, (int)Nq, C));
        TRY(be->zero(be, D->res2, Nq * C * sizeof(float)));
        TRY(be->residual_bwd(be, D->res2, dxq, D->res1, Nq * C, ph, site_seed(seed, s + 1)));
        if (tp) { /* output row-parallel, local heads, QKV column-parallel (one all-reduce) */
            TRY(tp->rowpar_bwd(&tp->g, D->ctx, Cl, G->ao_w, Cl, G->ao_b, D->res2, L->ctx, P->ao_w,
                               (int)Nq, Cl, C));
            /* the layer's probabilities again (layout; and the dropped ones in the scratch,
             * which the backward reads); ctx already holds the values */
            TRY(be->attention_fwd(be, NULL, L->att, a.att_scratch, L->qkv, m->valid_dev, B, T, Tq,
                                  Cl, tp->NHl, tp->h0, c->num_heads, pa, site_seed(seed, s)));
            TRY(be->attention_bwd(be, D->qkv, a.att_scratch, D->ctx, L->qkv, L->att, L->ctx,
                                  m->valid_dev, B, T, Tq, Cl, tp->NHl, tp->h0, c->num_heads, pa,
                                  site_seed(seed, s)));
            TRY(tp->qkv_bwd(&tp->g, dxin, G->qkv_w, G->qkv_b, Cl, D->qkv, x, P->qkv_w, (int)N, C,
                            Cl));
        } else {
            TRY(be->linear_bwd(be, D->ctx, G->ao_w, G->ao_b, D->res2, L->ctx, P->ao_w, (int)Nq, C,
                               C));
            /* the layer's probabilities again (layout; and the dropped ones in the scratch,
             * which the backward reads); ctx already holds the values */
            TRY(be->attention_fwd(be, NULL, L->att, a.att_scratch, L->qkv, m->valid_dev, B, T, Tq,
                                  C, c->num_heads, 0, c->num_heads, pa, site_seed(seed, s)));
            TRY(be->attention_bwd(be, D->qkv, a.att_scratch, D->ctx, L->qkv, L->att, L->ctx,
                                  m->valid_dev, B, T, Tq, C, c->num_heads, 0, c->num_heads, pa,
                                  site_seed(seed, s)));
            TRY(be->linear_bwd(be, dxin, G->qkv_w, G->qkv_b, D->qkv, x, P->qkv_w, (int)N, C,
                               3 * C));
        }
        /* the [CLS] rows' residual gradient, dxin[b T] += d.cls[b]: a
         * scatter-add of B rows, which is the embedding backward's with the
         * rows' indices as ids (one launch, not one a row; one add an element,
         * as before) */
        if (l == last)
            TRY(be->embed_rows_bwd(be, dxin, NULL, NULL, d.cls, m->cls_rows_dev, NULL, 0, B * T, B,
                                   1, C));
        TRY(unit_event(m, 1 + l, RF_UNIT_BWD_DONE));
    }
    if (u0 > 0) /* the gradient of the residual stream the stage before sent */
        return be->copy(be, din, boundary_slot(c, &d, u0),
                        rf_bert_boundary_floats(m, B, T, u0) * sizeof(float));
    TRY(unit_event(m, 0, RF_UNIT_BWD));
    /* x0 = dropout(LN(emb)): d(LN out) goes to emb_in's slot, LN's input gradient to x0's. */
    TRY(be->dropout_bwd(be, d.emb_in, d.x0, N * C, ph, site_seed(seed, 0)));
    TRY(be->zero(be, d.x0, N * C * sizeof(float)));
    TRY(be->layernorm_bwd(be, d.x0, m->g.eln_w, m->g.eln_b, d.emb_in, a.emb_in, m->p.eln_w,
                          a.emb_mean, a.emb_rstd, (int)N, C));
    if (tp) /* vocabulary-parallel: this rank's rows; no communication */
        TRY(tp->embed_bwd(&tp->g, m->g.wte, m->g.wpe, m->g.wtt, d.x0, m->ids_dev, m->types_dev,
                          &tp->vocab, B, T, C));
    else
        TRY(be->embed_bwd(be, m->g.wte, m->g.wpe, m->g.wtt, d.x0, m->ids_dev, m->types_dev, B, T, C,
                          c->vocab_size, c->type_vocab_size));
    TRY(unit_event(m, 0, RF_UNIT_BWD_DONE));
    return RF_OK;
}
