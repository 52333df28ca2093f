#include "trainer/gpt2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/json.h"
#include "common/sys.h"
#include "trainer/causal_units.h"
#include "trainer/lora.h"
#include "trainer/model_tp.h"
#include "trainer/ops.h"
#include "trainer/ops_causal.h"
#include "trainer/safetensors.h"

#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) return rc_;                                                                       \
    } while (0)

/* ---- config ---- */

static int get_int(const rf_json *root, const char *key, int def, int min, int max, int *out) {
    const rf_json *v = rf_json_get(root, key);
    int64_t x;
    if (!v || v->type == RF_JSON_NULL) {
        if (def < 0) return rf_fail(RF_ERR_INVALID, "config.json: missing '%s'", key);
        *out = def;
        return RF_OK;
    }
    if (rf_json_int64(v, &x) != 0 || x < min || x > max)
        return rf_fail(RF_ERR_INVALID, "config.json: '%s' must be an integer in [%d, %d]", key, min,
                       max);
    *out = (int)x;
    return RF_OK;
}

int rf_gpt2_config_parse(const char *text, size_t len, rf_gpt2_config *c) {
    memset(c, 0, sizeof *c);
    rf_json_doc *doc = rf_json_doc_new();
    if (!doc) return RF_ERR_NOMEM;
    const rf_json *r, *v;
    int rc = rf_json_parse(doc, text, len, &r);
    if (rc) {
        rc = rf_fail_ctx(RF_ERR_PARSE, "config.json");
        goto out;
    }
    if (r->type != RF_JSON_OBJECT) {
        rc = rf_fail(RF_ERR_PARSE, "config.json: not a JSON object");
        goto out;
    }
    if ((v = rf_json_get(r, "model_type")) &&
        (!rf_json_is_str(v) || strcmp(v->u.str, "gpt2") != 0)) {
        rc = rf_fail(RF_ERR_UNSUPPORTED, "config.json: model_type is not 'gpt2'");
        goto out;
    }
    if ((rc = get_int(r, "vocab_size", -1, 1, 1 << 24, &c->vocab_size)) ||
        (rc = get_int(r, "n_positions", -1, 1, 1 << 20, &c->n_positions)) ||
        (rc = get_int(r, "n_embd", -1, 1, 1 << 16, &c->n_embd)) ||
        (rc = get_int(r, "n_layer", -1, 1, 1024, &c->n_layer)) ||
        (rc = get_int(r, "n_head", -1, 1, 1024, &c->n_head)) ||
        (rc = get_int(r, "n_inner", 4 * c->n_embd, 1, 1 << 20, &c->n_inner)))
        goto out;
    if (c->n_embd % c->n_head) {
        rc = rf_fail(RF_ERR_INVALID, "config.json: n_embd %d is not a multiple of n_head %d",
                     c->n_embd, c->n_head);
        goto out;
    }
    c->layer_norm_epsilon = 1e-5f;
    if ((v = rf_json_get(r, "layer_norm_epsilon")) && v->type != RF_JSON_NULL) {
        if (v->type != RF_JSON_NUMBER || !(v->num > 0 && v->num < 1)) {
            rc = rf_fail(RF_ERR_INVALID, "config.json: 'layer_norm_epsilon' must be in (0, 1)");
            goto out;
        }
        c->layer_norm_epsilon = (float)v->num;
    }
    if ((v = rf_json_get(r, "activation_function")) &&
        (!rf_json_is_str(v) ||
         (strcmp(v->u.str, "gelu_new") && strcmp(v->u.str, "gelu_pytorch_tanh")))) {
        rc = rf_fail(RF_ERR_UNSUPPORTED,
                     "config.json: activation_function '%s'; only the tanh GELU (gelu_new) is "
                     "supported",
                     rf_json_is_str(v) ? v->u.str : "(not a string)");
        goto out;
    }
    if ((v = rf_json_get(r, "tie_word_embeddings")) && v->type == RF_JSON_FALSE) {
        rc = rf_fail(RF_ERR_UNSUPPORTED, "config.json: untied GPT-2 heads are not supported");
        goto out;
    }
    v = rf_json_get(r, "scale_attn_by_inverse_layer_idx");
    bool inv = v && v->type == RF_JSON_TRUE;
    v = rf_json_get(r, "scale_attn_weights");
    if (inv || (v && v->type == RF_JSON_FALSE))
        rc = rf_fail(RF_ERR_UNSUPPORTED,
                     "config.json: only attention scaled by 1/sqrt(head size) is supported");
out:
    rf_json_doc_free(doc);
    return rc;
}

/* ---- parameter table ---- */

static void add(rf_gpt2 *m, const char *name, int d0, int d1) {
    rf_tensor_info *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = m->nparams;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->numel = (size_t)d0 * (d1 ? d1 : 1);
    t->decay = d1 != 0; /* matrices only: not biases, not LayerNorm */
    m->nparams += t->numel;
}

static void build_table(rf_gpt2 *m) {
    const rf_gpt2_config *c = &m->cfg;
    int C = c->n_embd, F = c->n_inner;
    char n[96];
    add(m, "transformer.wte.weight", c->vocab_size, C);
    add(m, "transformer.wpe.weight", c->n_positions, C);
    for (int l = 0; l < c->n_layer; l++) {
#define L(suffix, d0, d1)                                                                          \
    snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix);                                       \
    add(m, n, d0, d1)
        L("ln_1.weight", C, 0);
        L("ln_1.bias", C, 0);
        L("attn.c_attn.weight", C, 3 * C);
        L("attn.c_attn.bias", 3 * C, 0);
        L("attn.c_proj.weight", C, C);
        L("attn.c_proj.bias", C, 0);
        L("ln_2.weight", C, 0);
        L("ln_2.bias", C, 0);
        L("mlp.c_fc.weight", C, F);
        L("mlp.c_fc.bias", F, 0);
        L("mlp.c_proj.weight", F, C);
        L("mlp.c_proj.bias", C, 0);
#undef L
    }
    add(m, "transformer.ln_f.weight", C, 0);
    add(m, "transformer.ln_f.bias", C, 0);
}

/* ---- units (causal_units.h) ---- */

int rf_gpt2_units(const rf_gpt2 *m) {
    return m->cfg.n_layer + 2;
}

/* The unit's tensors [first, last] of the table. */
static void unit_tensors(const rf_gpt2 *m, int u, size_t *first, size_t *last) {
    int L = m->cfg.n_layer;
    *first = u == 0 ? 0 : u <= L ? 2 + 12 * (size_t)(u - 1) : m->ntensors - 2;
    *last = u == 0 ? 1 : u <= L ? *first + 11 : m->ntensors - 1;
}

void rf_gpt2_unit_range(const rf_gpt2 *m, int u, size_t *lo, size_t *hi) {
    size_t f, l;
    unit_tensors(m, u, &f, &l);
    *lo = m->tensors[f].offset;
    *hi = m->tensors[l].offset + m->tensors[l].numel;
}

/* Points unit u's views of v at ub, which holds the unit's range [lo, hi). */
static void bind_unit(rf_gpt2 *m, int u, rf_gpt2_params *v, float *ub) {
    const rf_tensor_info *t = m->tensors;
    size_t lo, hi, f, l;
    rf_gpt2_unit_range(m, u, &lo, &hi);
    unit_tensors(m, u, &f, &l);
#define AT(i) (ub + (t[i].offset - lo))
    if (u == 0) {
        v->wte = AT(0);
        v->wpe = AT(1);
    } else if (u <= m->cfg.n_layer) {
        rf_gpt2_layer *y = &v->layers[u - 1];
        float **p[] = {&y->ln1_w, &y->ln1_b, &y->attn_w, &y->attn_b, &y->proj_w, &y->proj_b,
                       &y->ln2_w, &y->ln2_b, &y->fc_w,   &y->fc_b,   &y->fcp_w,  &y->fcp_b};
        for (int i = 0; i < 12; i++)
            *p[i] = AT(f + (size_t)i);
    } else {
        v->lnf_w = AT(f);
        v->lnf_b = AT(f + 1);
    }
#undef AT
}

/* Points the views of v at block base (params or grads: same offsets). */
static void bind(rf_gpt2 *m, rf_gpt2_params *v, float *base) {
    for (int u = 0; u < rf_gpt2_units(m); u++) {
        size_t lo, hi;
        rf_gpt2_unit_range(m, u, &lo, &hi);
        bind_unit(m, u, v, base + lo);
    }
}

void rf_gpt2_bind_unit(rf_gpt2 *m, int u, float *p, float *g) {
    if (p) bind_unit(m, u, &m->p, p);
    if (g) bind_unit(m, u, &m->g, g);
}

void rf_gpt2_bind_all(rf_gpt2 *m) {
    if (m->params) bind(m, &m->p, m->params);
    if (m->grads) bind(m, &m->g, m->grads);
}

/* Whether be fills every slot the model calls (a backend built before its
 * causal-LM kernels has NULL there): RF_ERR_UNSUPPORTED naming the first
 * missing one otherwise. */
static int check_slots(const rf_backend *be) {
#define SLOT(x)                                                                                    \
    { #x, be->x == NULL }
    const rf_backend_slot s[] = {
        SLOT(tokpos_fwd),           SLOT(tokpos_bwd),           SLOT(layernorm_fwd),
        SLOT(layernorm_bwd),        SLOT(conv1d_fwd),           SLOT(conv1d_bwd),
        SLOT(causal_attention_fwd), SLOT(causal_attention_bwd), SLOT(residual_fwd),
        SLOT(residual_bwd),         SLOT(gelu_tanh_fwd),        SLOT(gelu_tanh_bwd),
        SLOT(lm_head_fwd),          SLOT(lm_head_bwd),          SLOT(causal_xent_fwd),
        SLOT(causal_xent_bwd)};
#undef SLOT
    return rf_backend_check_slots(be, "gpt2", s, sizeof s / sizeof s[0]);
}

int rf_gpt2_new(const rf_gpt2_config *cfg, rf_gpt2 **out) {
    return rf_gpt2_new_on(cfg, NULL, out);
}

int rf_gpt2_new_on(const rf_gpt2_config *cfg, const rf_backend *be, rf_gpt2 **out) {
    *out = NULL;
    if (!be) be = rf_backend_cpu();
    int rc = check_slots(be);
    if (rc) return rc;
    rf_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return RF_ERR_NOMEM;
    m->be = be;
    m->cfg = *cfg;
    int L = cfg->n_layer;
    m->tensors = calloc((size_t)12 * L + 4, sizeof *m->tensors);
    m->p.layers = calloc((size_t)L, sizeof(rf_gpt2_layer));
    m->g.layers = calloc((size_t)L, sizeof(rf_gpt2_layer));
    m->a.layers = calloc((size_t)L, sizeof(rf_gpt2_acts_layer));
    m->da.layers = calloc((size_t)L, sizeof(rf_gpt2_acts_layer));
    m->a.res = calloc((size_t)L + 1, sizeof(float *));
    m->da.res = calloc((size_t)L + 1, sizeof(float *));
    if (!m->tensors || !m->p.layers || !m->g.layers || !m->a.layers || !m->da.layers || !m->a.res ||
        !m->da.res) {
        rf_gpt2_free(m);
        return RF_ERR_NOMEM;
    }
    build_table(m);
    if (!(m->params = rf_backend_alloc(m->be, m->nparams * sizeof(float)))) {
        rf_gpt2_free(m);
        return RF_ERR_NOMEM;
    }
    bind(m, &m->p, m->params);
    m->npadded = m->nparams;
    *out = m;
    return RF_OK;
}

void rf_gpt2_free(rf_gpt2 *m) {
    if (!m) return;
    const rf_backend *be = m->be;
    free(m->tensors);
    rf_backend_free(be, m->params);
    rf_backend_free(be, m->grads);
    rf_backend_free(be, m->mom1);
    rf_backend_free(be, m->mom2);
    free(m->p.layers);
    free(m->g.layers);
    free(m->a.layers);
    free(m->da.layers);
    free(m->a.res);
    free(m->da.res);
    rf_backend_free(be, m->acts);
    rf_backend_free(be, m->dacts);
    rf_causal_io_free(&m->io, be);
    if (m->tp) { /* model_tp.c's context (freed here so the evaluator needs no tp code) */
        rf_backend_free(m->tp->g.be, m->tp->g.sync);
        free(m->tp->full);
        free(m->tp->spans);
        free(m->tp->kinds);
        free(m->tp);
    }
    free(m);
}

const rf_tensor_info *rf_gpt2_find(const rf_gpt2 *m, const char *name) {
    for (size_t i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

int rf_gpt2_load(const char *dir, rf_gpt2 **out) {
    return rf_gpt2_load_on(dir, NULL, out);
}

/* Tensor t of st into m's parameters: directly on the CPU, else through a
 * host buffer and to_device. */
static int read_tensor(const rf_backend *be, const rf_st_tensor *s, float *dst, size_t numel) {
    if (be == rf_backend_cpu()) return rf_st_to_f32(s, dst);
    float *h = malloc(numel * sizeof(float) + 4);
    if (!h) return rf_fail(RF_ERR_NOMEM, "no host memory for tensor '%s'", s->name);
    int rc = rf_st_to_f32(s, h);
    if (!rc) rc = be->to_device(be, dst, h, numel * sizeof(float));
    free(h);
    return rc;
}

int rf_gpt2_load_on(const char *dir, const rf_backend *be, rf_gpt2 **out) {
    char path[4096];
    *out = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    int rc = rf_read_file(path, 1 << 20, &text, &len);
    if (rc) return rc;
    rf_gpt2_config cfg;
    rc = rf_gpt2_config_parse(text, len, &cfg);
    free(text);
    if (rc) return rf_fail_ctx(rc, "%s", path);
    rf_st_file *st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((rc = rf_st_open(path, &st))) return rc;
    rf_gpt2 *m;
    if ((rc = rf_gpt2_new_on(&cfg, be, &m))) {
        rf_st_free(st);
        return rc;
    }
    for (size_t i = 0; i < m->ntensors && !rc; i++) {
        const rf_tensor_info *t = &m->tensors[i];
        const rf_st_tensor *s = rf_st_find(st, t->name);
        if (!s) s = rf_st_find(st, t->name + strlen("transformer."));
        if (!s) {
            rc = rf_fail(RF_ERR_NOT_FOUND, "%s: tensor '%s' is missing", path, t->name);
            break;
        }
        if (s->ndim != t->ndim || s->shape[0] != t->shape[0] ||
            (t->ndim == 2 && s->shape[1] != t->shape[1])) {
            rc = rf_fail(RF_ERR_INVALID, "%s: tensor '%s' does not have the config's shape [%d,%d]",
                         path, s->name, t->shape[0], t->shape[1]);
            break;
        }
        if ((rc = read_tensor(m->be, s, m->params + t->offset, t->numel)))
            rc = rf_fail_ctx(rc, "%s", path);
    }
    rf_st_free(st);
    if (rc) {
        rf_gpt2_free(m);
        return rc;
    }
    *out = m;
    return RF_OK;
}

int rf_gpt2_enable_training(rf_gpt2 *m) {
    return rf_gpt2_enable_training_sharded(m, m->nparams, m->nparams);
}

int rf_gpt2_enable_training_sharded(rf_gpt2 *m, size_t padded, size_t moments) {
    const rf_backend *be = m->be;
    if (m->lora) { /* LoRA: the base is frozen, no gradient block or moments (g views NULL) */
        m->training = true;
        if (m->acts && !m->dacts && !(m->dacts = rf_backend_alloc(be, m->ngrads * sizeof(float))))
            return RF_ERR_NOMEM;
        return RF_OK;
    }
    if (m->grads) return RF_OK;
    if (padded < m->nparams) padded = m->nparams;
    if (padded > m->npadded) { /* room for the collectives' padding: params move */
        float *p = rf_backend_alloc(be, padded * sizeof(float));
        if (!p) return RF_ERR_NOMEM;
        int rc = be->copy(be, p, m->params, m->nparams * sizeof(float));
        if (rc) {
            rf_backend_free(be, p);
            return rc;
        }
        rf_backend_free(be, m->params);
        m->params = p;
        bind(m, &m->p, m->params);
    }
    m->npadded = padded;
    m->nmoments = moments;
    m->grads = rf_backend_alloc(be, padded * sizeof(float));
    m->mom1 = rf_backend_alloc(be, (moments ? moments : 1) * sizeof(float));
    m->mom2 = rf_backend_alloc(be, (moments ? moments : 1) * sizeof(float));
    if (!m->grads || !m->mom1 || !m->mom2)
        return rf_fail(RF_ERR_NOMEM, "gpt2: no memory for the training blocks");
    bind(m, &m->g, m->grads);
    m->training = true;
    if (m->acts && !m->dacts && !(m->dacts = rf_backend_alloc(be, m->ngrads * sizeof(float))))
        return RF_ERR_NOMEM;
    return RF_OK;
}

void rf_gpt2_release_blocks(rf_gpt2 *m, bool params) {
    if (params) {
        rf_backend_free(m->be, m->params);
        m->params = NULL;
    }
    rf_backend_free(m->be, m->grads);
    rf_backend_free(m->be, m->mom1);
    rf_backend_free(m->be, m->mom2);
    m->grads = m->mom1 = m->mom2 = NULL;
    m->npadded = m->params ? m->npadded : 0;
    m->nmoments = 0;
}

int rf_gpt2_adopt_params(rf_gpt2 *m, const float *host) {
    if (!m->params) {
        if (!(m->params = rf_backend_alloc(m->be, m->nparams * sizeof(float))))
            return rf_fail_ctx(RF_ERR_NOMEM, "gpt2: no memory for %zu parameters", m->nparams);
        m->npadded = m->nparams;
    }
    int rc = m->be->to_device(m->be, m->params, host, m->nparams * sizeof(float));
    if (rc) return rc;
    rf_gpt2_bind_all(m);
    return RF_OK;
}

int rf_gpt2_zero_grad(rf_gpt2 *m) {
    if (!m->grads && !m->unit_hook) return rf_fail(RF_ERR_INVALID, "gpt2: training is not enabled");
    return m->grads ? m->be->zero(m->be, m->grads, m->npadded * sizeof(float)) : RF_OK;
}

/* The Conv1D projections: through the LoRA adapters when attached. */
static int proj_fwd(rf_gpt2 *m, int l, int slot, float *out, const float *x, const float *w,
                    const float *b, int N, int IC, int OC) {
    if (m->lora) return rf_lora_fwd(m->lora, l, slot, out, x, w, b, N, IC, OC);
    return m->be->conv1d_fwd(m->be, out, x, w, b, N, IC, OC);
}

static int proj_bwd(rf_gpt2 *m, int l, int slot, float *dx, float *dw, float *db, const float *dout,
                    const float *x, const float *w, int N, int IC, int OC) {
    if (m->lora) return rf_lora_bwd(m->lora, l, slot, dx, dw, db, dout, x, w, N, IC, OC);
    return m->be->conv1d_bwd(m->be, dx, dw, db, dout, x, w, N, IC, OC);
}

/* ---- activations ---- */

/* Lays the activation views of v out from base (NULL: only counts floats).
 * The activations hold one buffer of attention probabilities and one of
 * GELU outputs for every layer (the backward recomputes a layer's before
 * using them: B NH T T floats a layer are the largest activation, against
 * one extra attention forward per layer, Megatron's selective recomputation;
 * the GELU output from its input, one elementwise op). grads: the
 * gradient arena, where every layer's views are one region (layer 0's): a
 * layer's gradients live only while its backward runs, the residual stream's
 * gradients between layers have their own slots (res), and the backward
 * zeroes the region before each layer reuses it. */
static size_t layout(const rf_gpt2 *m, rf_gpt2_acts *v, float *base, int B, int T, bool grads) {
    const rf_gpt2_config *c = &m->cfg;
    const struct rf_bert_tp *tp = m->tp; /* the local widths of a tp shard */
    size_t N = (size_t)B * T, C = (size_t)c->n_embd, off = 0;
    size_t F = (size_t)(tp ? tp->Il : c->n_inner), Cl = tp ? (size_t)tp->Cl : C;
    size_t NH = (size_t)(tp ? tp->NHl : c->n_head),
           V = (size_t)(tp ? tp->vocab.block : c->vocab_size);
#define TAKE(ptr, n)                                                                               \
    do {                                                                                           \
        if (base) (ptr) = base + off;                                                              \
        off += (n);                                                                                \
    } while (0)
    for (int l = 0; l <= c->n_layer; l++)
        TAKE(v->res[l], N * C);
    for (int l = 0; l < c->n_layer; l++) {
        rf_gpt2_acts_layer *y = &v->layers[l];
        if (grads && l > 0) {
            if (base) *y = v->layers[0];
            continue;
        }
        TAKE(y->ln1, N * C);
        TAKE(y->ln1_mean, N);
        TAKE(y->ln1_rstd, N);
        TAKE(y->qkv, N * 3 * Cl);
        if (!grads && l > 0) { /* one buffer of probabilities for every layer */
            if (base) y->att = v->layers[0].att;
        } else {
            /* the probabilities (or the statistics: rf_backend_attention_stats); in the
             * gradient arena the backward's scratch, B NH T floats */
            TAKE(y->att, B * NH * T * (grads || m->att_stats ? 1 : (size_t)T));
        }
        TAKE(y->atty, N * Cl);
        TAKE(y->res2, N * C);
        TAKE(y->ln2, N * C);
        TAKE(y->ln2_mean, N);
        TAKE(y->ln2_rstd, N);
        TAKE(y->fch, N * F);
        if (!grads && l > 0) { /* one GELU output for every layer, as att */
            if (base) y->fcg = v->layers[0].fcg;
        } else {
            TAKE(y->fcg, N * F);
        }
    }
    TAKE(v->lnf, N * C);
    TAKE(v->lnf_mean, N);
    TAKE(v->lnf_rstd, N);
    TAKE(v->logits, N * V);
    TAKE(v->lse, N);
    TAKE(v->losses, N);
#undef TAKE
    return off;
}

int rf_gpt2_reserve(rf_gpt2 *m, int B, int T) {
    if (B < 1 || T < 1 || T > m->cfg.n_positions)
        return rf_fail(RF_ERR_RANGE, "gpt2: batch %d x %d (at most %d positions)", B, T,
                       m->cfg.n_positions);
    if (B <= m->capB && T <= m->capT) return RF_OK;
    int nB = B > m->capB ? B : m->capB;
    T = T > m->capT ? T : m->capT;
    const rf_backend *be = m->be;
    int rc = rf_backend_attention_stats(be, m->cfg.n_embd / m->cfg.n_head, &m->att_stats);
    if (rc) return rc;
    size_t n = layout(m, &m->a, NULL, nB, T, false), ng = layout(m, &m->da, NULL, nB, T, true);
    bool train = m->training || m->dacts;
    float *a = rf_backend_alloc(be, n * sizeof(float)),
          *d = train ? rf_backend_alloc(be, ng * sizeof(float)) : NULL;
    if (!a || (train && !d) || rf_causal_io_alloc(&m->io, be, (size_t)nB * T)) {
        rf_backend_free(be, a), rf_backend_free(be, d);
        return RF_ERR_NOMEM;
    }
    rf_backend_free(be, m->acts), rf_backend_free(be, m->dacts);
    m->acts = a, m->dacts = d;
    m->nacts = n, m->ngrads = ng, m->capB = nB, m->capT = T;
    return RF_OK;
}

/* The unit hook, if any (causal_units.h). */
static int event(rf_gpt2 *m, int u, rf_unit_event ev, int next) {
    return m->unit_hook ? m->unit_hook(m->unit_user, u, ev, next) : RF_OK;
}

static int check_range(const rf_gpt2 *m, int u0, int u1, const float *at_u0, const float *at_u1) {
    int n = rf_gpt2_units(m);
    if (u0 < 0 || u1 > n || u0 >= u1)
        return rf_fail(RF_ERR_RANGE, "gpt2: unit range [%d, %d) outside [0, %d)", u0, u1, n);
    if ((u0 > 0 && !at_u0) || (u1 < n && !at_u1))
        return rf_fail(RF_ERR_INVALID, "gpt2: unit range [%d, %d) needs its boundary buffers", u0,
                       u1);
    return RF_OK;
}

int rf_gpt2_replay(rf_gpt2 *m, int u0, int u1, bool backward) {
    int n = rf_gpt2_units(m);
    bool head = rf_cu_head_reads_emb(u1, n, true);
    for (int u = u0; u < u1; u++)
        TRY(event(m, u, RF_UNIT_FWD, rf_cu_fwd_next(u, false, u1, n, true)));
    if (head) TRY(event(m, 0, RF_UNIT_FWD, rf_cu_fwd_next(0, true, u1, n, true)));
    if (!backward) return RF_OK;
    if (head) {
        TRY(event(m, 0, RF_UNIT_BWD, rf_cu_bwd_next(0, true, u0, u1)));
        TRY(event(m, 0, RF_UNIT_BWD_PART, -1));
    }
    for (int u = u1 - 1; u >= u0; u--) {
        TRY(event(m, u, RF_UNIT_BWD, rf_cu_bwd_next(u, false, u0, u1)));
        TRY(event(m, u, RF_UNIT_BWD_DONE, -1));
    }
    return RF_OK;
}

int rf_gpt2_forward(rf_gpt2 *m, const rf_causal_batch *bt) {
    return rf_gpt2_forward_range(m, bt, 0, rf_gpt2_units(m), NULL, NULL);
}

int rf_gpt2_forward_range(rf_gpt2 *m, const rf_causal_batch *bt, int u0, int u1, const float *in,
                          float *out) {
    int B = bt->B, T = bt->T;
    const int32_t *ids = bt->ids, *labels = bt->labels;
    const rf_gpt2_config *c = &m->cfg;
    const rf_backend *be = m->be;
    int rc = check_range(m, u0, u1, in, out);
    if (!rc) rc = rf_gpt2_reserve(m, B, T);
    if (!rc && m->lora) rc = rf_lora_reserve(m->lora, B * T);
    if (rc) return rc;
    int N = B * T, C = c->n_embd, F = c->n_inner, NH = c->n_head, V = c->vocab_size;
    float eps = c->layer_norm_epsilon;
    struct rf_bert_tp *tp = m->tp;
    /* the local widths (the whole model's without tp): heads, q/k/v channels,
     * MLP size, vocabulary columns */
    int NHl = tp ? tp->NHl : NH, Cl = tp ? tp->Cl : C, Fl = tp ? tp->Il : F;
    int Vl = tp ? tp->vocab.block : V;
    for (int n = 0; n < N; n++)
        if (ids[n] < 0 || ids[n] >= V)
            return rf_fail(RF_ERR_RANGE, "gpt2: token id %d outside the vocabulary (%d)", ids[n],
                           V);
    for (int n = 0; labels && n < N; n++)
        if (labels[n] >= V)
            return rf_fail(RF_ERR_RANGE, "%s: label %d outside the vocabulary (%d)", "gpt2",
                           labels[n], V);
    for (int n = 0; bt->pos && n < N; n++)
        if (bt->pos[n] < 0 || bt->pos[n] >= c->n_positions)
            return rf_fail(RF_ERR_RANGE, "gpt2: position %d outside [0, %d)", bt->pos[n],
                           c->n_positions);
    memcpy(m->io.ids, ids, sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) {
        m->io.valid[n] = bt->valid ? bt->valid[n] != 0 : 1;
        m->io.labels[n] = labels ? labels[n] : -100;
        m->io.pos[n] = bt->pos ? bt->pos[n] : n % T;
        m->io.seg[n] = bt->seg ? bt->seg[n] : 0;
    }
    m->B = B, m->T = T, m->has_labels = labels != NULL, m->packed = bt->seg != NULL;
    TRY(rf_causal_io_send(&m->io, be)); /* the batch on the backend: one upload */
    /* the views for this B x T (the arena holds capB x capT) */
    layout(m, &m->a, m->acts, B, T, false);
    rf_gpt2_acts *a = &m->a;
    int L = c->n_layer, n_units = L + 2;
    m->logits = a->logits;
    m->loss = 0;
    m->counted = 0;
    if (u0 > 0) /* boundary u0 is the residual stream res[u0 - 1] */
        TRY(be->copy(be, a->res[u0 - 1], in, (size_t)N * C * sizeof(float)));

    if (u0 == 0) {
        TRY(event(m, 0, RF_UNIT_FWD, rf_cu_fwd_next(0, false, u1, n_units, true)));
        if (tp) { /* the word embedding vocabulary-parallel, then positions */
            TRY(tp->embed_fwd(&tp->g, a->res[0], m->io.ids_dev, m->io.pos_dev, NULL, m->p.wte,
                              &tp->vocab, m->p.wpe, NULL, B, T, C));
        } else {
            TRY(be->tokpos_fwd(be, a->res[0], m->io.ids_dev, m->io.pos_dev, m->p.wte, m->p.wpe, B,
                               T, C));
        }
    }
    for (int l = 0; l < c->n_layer; l++) {
        if (l + 1 < u0 || l + 1 >= u1) continue;
        TRY(event(m, l + 1, RF_UNIT_FWD, rf_cu_fwd_next(l + 1, false, u1, n_units, true)));
        const rf_gpt2_layer *w = &m->p.layers[l];
        rf_gpt2_acts_layer *y = &a->layers[l];
        TRY(be->layernorm_fwd(be, y->ln1, y->ln1_mean, y->ln1_rstd, a->res[l], w->ln1_w, w->ln1_b,
                              N, C, eps));
        /* tp: q_l | k_l | v_l of the local heads (column-parallel), the output
         * projection row-parallel: its bias added once, then the sum */
        TRY(proj_fwd(m, l, RF_PROJ_QKV, y->qkv, y->ln1, w->attn_w, w->attn_b, N, C, 3 * Cl));
        TRY(be->causal_attention_fwd(be, y->atty, y->att, y->qkv, m->io.valid_dev,
                                     m->packed ? m->io.seg_dev : NULL, B, T, NHl, NHl, C / NH));
        TRY(proj_fwd(m, l, RF_PROJ_O, y->res2, y->atty, w->proj_w, !tp || !tp->r ? w->proj_b : NULL,
                     N, Cl, C));
        if (tp) TRY(tp->sum(&tp->g, y->res2, (size_t)N * C));
        TRY(be->residual_fwd(be, y->res2, y->res2, a->res[l], (size_t)N * C, 0.0f, 0));
        TRY(be->layernorm_fwd(be, y->ln2, y->ln2_mean, y->ln2_rstd, y->res2, w->ln2_w, w->ln2_b, N,
                              C, eps));
        TRY(proj_fwd(m, l, RF_PROJ_UP, y->fch, y->ln2, w->fc_w, w->fc_b, N, C, Fl));
        TRY(be->gelu_tanh_fwd(be, y->fcg, y->fch, (size_t)N * Fl));
        TRY(proj_fwd(m, l, RF_PROJ_DOWN, a->res[l + 1], y->fcg, w->fcp_w,
                     !tp || !tp->r ? w->fcp_b : NULL, N, Fl, C));
        if (tp) TRY(tp->sum(&tp->g, a->res[l + 1], (size_t)N * C));
        TRY(be->residual_fwd(be, a->res[l + 1], a->res[l + 1], y->res2, (size_t)N * C, 0.0f, 0));
    }
    if (u1 < n_units) { /* boundary u1 for the stage after */
        return be->copy(be, out, a->res[u1 - 1], (size_t)N * C * sizeof(float));
    }
    TRY(event(m, L + 1, RF_UNIT_FWD, rf_cu_fwd_next(L + 1, false, u1, n_units, true)));
    TRY(be->layernorm_fwd(be, a->lnf, a->lnf_mean, a->lnf_rstd, a->res[c->n_layer], m->p.lnf_w,
                          m->p.lnf_b, N, C, eps));
    TRY(event(m, 0, RF_UNIT_FWD, rf_cu_fwd_next(0, true, u1, n_units, true))); /* tied head */
    if (tp) { /* the rank's vocabulary columns, the loss over the group */
        TRY(tp->colpar_fwd(&tp->g, a->logits, Vl, a->lnf, m->p.wte, C, NULL, N, C, Vl));
        if (labels) {
            m->counted = rf_causal_targets(m->io.tgt, m->io.labels, B, T);
            TRY(be->to_device(be, m->io.tgt_dev, m->io.tgt, sizeof(int32_t) * (size_t)N));
            TRY(tp->xent_fwd(&tp->g, &m->loss, a->losses, a->lse, m->io.se, a->logits, Vl,
                             m->io.tgt_dev, &tp->vocab, N));
        }
        return RF_OK;
    }
    TRY(be->lm_head_fwd(be, a->logits, a->lnf, m->p.wte, N, C, V));
    if (labels)
        TRY(be->causal_xent_fwd(be, &m->loss, &m->counted, a->lse, a->losses, a->logits,
                                m->io.labels_dev, B, T, V));
    return RF_OK;
}

int rf_gpt2_backward(rf_gpt2 *m, float loss_scale) {
    return rf_gpt2_backward_range(m, loss_scale, 0, rf_gpt2_units(m), NULL, NULL);
}

int rf_gpt2_backward_range(rf_gpt2 *m, float loss_scale, int u0, int u1, const float *dout,
                           float *din) {
    const rf_gpt2_config *c = &m->cfg;
    if (!m->grads && !m->unit_hook && !m->lora) /* (a hook binds the gradient views: ZeRO-2/3) */
        return rf_fail(RF_ERR_INVALID, "gpt2: training is not enabled");
    const rf_backend *be = m->be;
    int n_units = rf_gpt2_units(m), rc = check_range(m, u0, u1, din, dout);
    if (rc) return rc;
    if (!m->dacts && !(m->dacts = rf_backend_alloc(be, m->ngrads * sizeof(float))))
        return RF_ERR_NOMEM;
    if (u1 == n_units && !m->has_labels)
        return rf_fail(RF_ERR_INVALID, "gpt2: backward needs a forward with labels");
    int B = m->B, T = m->T, N = B * T, C = c->n_embd, F = c->n_inner, NH = c->n_head,
        V = c->vocab_size, L = c->n_layer;
    struct rf_bert_tp *tp = m->tp;
    int NHl = tp ? tp->NHl : NH, Cl = tp ? tp->Cl : C, Fl = tp ? tp->Il : F;
    int Vl = tp ? tp->vocab.block : V;
    size_t used = layout(m, &m->da, m->dacts, B, T, true);
    TRY(be->zero(be, m->dacts, used * sizeof(float)));
    rf_gpt2_acts *a = &m->a, *d = &m->da;
    /* the gradient arena's one layer region (layout), and the first layer this
     * range runs backward (the region is zero for it already) */
    size_t region = (size_t)(d->layers[0].fcg - d->layers[0].ln1) + (size_t)N * Fl;
    int first = u1 - 2 < L - 1 ? u1 - 2 : L - 1;

    if (u1 == n_units) {
        if (tp)
            TRY(tp->xent_bwd(&tp->g, d->logits, Vl, a->logits, Vl, a->lse, m->io.se, m->io.tgt_dev,
                             &tp->vocab, N, loss_scale));
        else
            TRY(be->causal_xent_bwd(be, d->logits, a->logits, a->lse, m->io.labels_dev, B, T, V,
                                    loss_scale));
        TRY(event(m, 0, RF_UNIT_BWD, rf_cu_bwd_next(0, true, u0, u1))); /* tied head */
        if (tp)
            TRY(tp->colpar_bwd(&tp->g, d->lnf, m->g.wte, NULL, C, d->logits, Vl, a->lnf, m->p.wte,
                               N, C, Vl));
        else
            TRY(be->lm_head_bwd(be, d->lnf, m->g.wte, d->logits, a->lnf, m->p.wte, N, C, V));
        TRY(event(m, 0, RF_UNIT_BWD_PART, -1));
        TRY(event(m, L + 1, RF_UNIT_BWD, rf_cu_bwd_next(L + 1, false, u0, u1)));
        TRY(be->layernorm_bwd(be, d->res[c->n_layer], m->g.lnf_w, m->g.lnf_b, d->lnf,
                              a->res[c->n_layer], m->p.lnf_w, a->lnf_mean, a->lnf_rstd, N, C));
        TRY(event(m, L + 1, RF_UNIT_BWD_DONE, -1));
    } else { /* the gradient of boundary u1 from the stage after */
        TRY(be->copy(be, d->res[u1 - 1], dout, (size_t)N * C * sizeof(float)));
    }
    for (int l = c->n_layer - 1; l >= 0; l--) {
        if (l + 1 < u0 || l + 1 >= u1) continue;
        TRY(event(m, l + 1, RF_UNIT_BWD, rf_cu_bwd_next(l + 1, false, u0, u1)));
        const rf_gpt2_layer *w = &m->p.layers[l];
        rf_gpt2_layer *g = &m->g.layers[l];
        rf_gpt2_acts_layer *y = &a->layers[l], *dy = &d->layers[l];
        float *dout_l = d->res[l + 1];
        if (l < first) TRY(be->zero(be, dy->ln1, region * sizeof(float)));
        TRY(be->gelu_tanh_fwd(be, y->fcg, y->fch, (size_t)N * Fl)); /* recomputed (layout) */
        TRY(proj_bwd(m, l, RF_PROJ_DOWN, dy->fcg, g->fcp_w, g->fcp_b, dout_l, y->fcg, w->fcp_w, N,
                     Fl, C));
        TRY(be->gelu_tanh_bwd(be, dy->fch, y->fch, dy->fcg, (size_t)N * Fl));
        TRY(proj_bwd(m, l, RF_PROJ_UP, dy->ln2, g->fc_w, g->fc_b, dy->fch, y->ln2, w->fc_w, N, C,
                     Fl));
        if (tp) TRY(tp->sum(&tp->g, dy->ln2, (size_t)N * C)); /* column-parallel: f */
        TRY(be->layernorm_bwd(be, dy->res2, g->ln2_w, g->ln2_b, dy->ln2, y->res2, w->ln2_w,
                              y->ln2_mean, y->ln2_rstd, N, C));
        TRY(be->residual_bwd(be, dy->res2, NULL, dout_l, (size_t)N * C, 0.0f, 0));
        TRY(proj_bwd(m, l, RF_PROJ_O, dy->atty, g->proj_w, g->proj_b, dy->res2, y->atty, w->proj_w,
                     N, Cl, C));
        /* the layer's probabilities again (layout; atty already holds the
         * values); the probability slot of the gradient arena is the scratch */
        TRY(be->causal_attention_fwd(be, NULL, y->att, y->qkv, m->io.valid_dev,
                                     m->packed ? m->io.seg_dev : NULL, B, T, NHl, NHl, C / NH));
        TRY(be->causal_attention_bwd(be, dy->qkv, dy->att, dy->atty, y->qkv, y->att, y->atty,
                                     m->io.valid_dev, m->packed ? m->io.seg_dev : NULL, B, T, NHl,
                                     NHl, C / NH));
        TRY(proj_bwd(m, l, RF_PROJ_QKV, dy->ln1, g->attn_w, g->attn_b, dy->qkv, y->ln1, w->attn_w,
                     N, C, 3 * Cl));
        if (tp) TRY(tp->sum(&tp->g, dy->ln1, (size_t)N * C));
        TRY(be->layernorm_bwd(be, d->res[l], g->ln1_w, g->ln1_b, dy->ln1, a->res[l], w->ln1_w,
                              y->ln1_mean, y->ln1_rstd, N, C));
        TRY(be->residual_bwd(be, d->res[l], NULL, dy->res2, (size_t)N * C, 0.0f, 0));
        TRY(event(m, l + 1, RF_UNIT_BWD_DONE, -1));
    }
    if (u0 > 0) { /* the gradient of boundary u0 for the stage before */
        return be->copy(be, din, d->res[u0 - 1], (size_t)N * C * sizeof(float));
    }
    TRY(event(m, 0, RF_UNIT_BWD, rf_cu_bwd_next(0, false, u0, u1)));
    if (tp) {
        TRY(tp->embed_bwd(&tp->g, m->g.wte, NULL, NULL, d->res[0], m->io.ids_dev, NULL, &tp->vocab,
                          B, T, C));
        TRY(be->tokpos_bwd(be, NULL, m->g.wpe, d->res[0], m->io.ids_dev, m->io.pos_dev, B, T, C, V,
                           c->n_positions));
    } else if (m->g.wte) { /* NULL: a frozen embedding (LoRA) */
        TRY(be->tokpos_bwd(be, m->g.wte, m->g.wpe, d->res[0], m->io.ids_dev, m->io.pos_dev, B, T, C,
                           V, c->n_positions));
    }
    TRY(event(m, 0, RF_UNIT_BWD_DONE, -1));
    return RF_OK;
}
