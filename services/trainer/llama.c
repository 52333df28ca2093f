#include "trainer/llama.h"

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

static int get_real(const rf_json *root, const char *key, double def, double min, double max,
                    float *out) {
    const rf_json *v = rf_json_get(root, key);
    if (!v || v->type == RF_JSON_NULL) {
        *out = (float)def;
        return RF_OK;
    }
    if (v->type != RF_JSON_NUMBER || !(v->num > min && v->num < max))
        return rf_fail(RF_ERR_INVALID, "config.json: '%s' must be a number in (%g, %g)", key, min,
                       max);
    *out = (float)v->num;
    return RF_OK;
}

static bool is_true(const rf_json *root, const char *key) {
    const rf_json *v = rf_json_get(root, key);
    return v && v->type == RF_JSON_TRUE;
}

int rf_llama_config_parse(const char *text, size_t len, rf_llama_config *c) {
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
        (!rf_json_is_str(v) || strcmp(v->u.str, "llama") != 0)) {
        rc = rf_fail(RF_ERR_UNSUPPORTED, "config.json: model_type is not 'llama'");
        goto out;
    }
    if ((rc = get_int(r, "vocab_size", -1, 1, 1 << 24, &c->vocab_size)) ||
        (rc = get_int(r, "hidden_size", -1, 1, 1 << 16, &c->hidden_size)) ||
        (rc = get_int(r, "intermediate_size", -1, 1, 1 << 20, &c->intermediate_size)) ||
        (rc = get_int(r, "num_hidden_layers", -1, 1, 1024, &c->num_hidden_layers)) ||
        (rc = get_int(r, "num_attention_heads", -1, 1, 1024, &c->num_attention_heads)) ||
        (rc = get_int(r, "num_key_value_heads", c->num_attention_heads, 1, 1024,
                      &c->num_key_value_heads)) ||
        (rc = get_int(r, "max_position_embeddings", 2048, 1, 1 << 24, &c->max_position_embeddings)))
        goto out;
    if (c->hidden_size % c->num_attention_heads == 0 &&
        (rc = get_int(r, "head_dim", c->hidden_size / c->num_attention_heads, 2, 1 << 12,
                      &c->head_dim)))
        goto out;
    if (!c->head_dim && (rc = get_int(r, "head_dim", -1, 2, 1 << 12, &c->head_dim))) goto out;
    if (c->head_dim % 2 || c->num_attention_heads % c->num_key_value_heads) {
        rc = rf_fail(RF_ERR_INVALID,
                     "config.json: head_dim %d must be even and num_key_value_heads %d must divide "
                     "num_attention_heads %d",
                     c->head_dim, c->num_key_value_heads, c->num_attention_heads);
        goto out;
    }
    if ((rc = get_real(r, "rms_norm_eps", 1e-6, 0, 1, &c->rms_norm_eps))) goto out;
    /* rope theta: transformers 5 writes rope_parameters, older versions rope_theta */
    const rf_json *rp = rf_json_get(r, "rope_parameters");
    if (rp && rp->type == RF_JSON_OBJECT) {
        if ((rc = get_real(rp, "rope_theta", 10000, 0, 1e12, &c->rope_theta))) goto out;
        v = rf_json_get(rp, "rope_type");
        if (v && (!rf_json_is_str(v) || strcmp(v->u.str, "default") != 0)) {
            rc = rf_fail(RF_ERR_UNSUPPORTED, "config.json: only rope_type 'default' is supported");
            goto out;
        }
    } else if ((rc = get_real(r, "rope_theta", 10000, 0, 1e12, &c->rope_theta))) {
        goto out;
    }
    if ((v = rf_json_get(r, "rope_scaling")) && v->type != RF_JSON_NULL) {
        rc = rf_fail(RF_ERR_UNSUPPORTED, "config.json: rope_scaling is not supported");
        goto out;
    }
    if ((v = rf_json_get(r, "hidden_act")) && (!rf_json_is_str(v) || strcmp(v->u.str, "silu"))) {
        rc = rf_fail(RF_ERR_UNSUPPORTED, "config.json: only hidden_act 'silu' is supported");
        goto out;
    }
    if (is_true(r, "attention_bias") || is_true(r, "mlp_bias")) {
        rc = rf_fail(RF_ERR_UNSUPPORTED, "config.json: attention and MLP biases are not supported");
        goto out;
    }
    c->tie_word_embeddings = is_true(r, "tie_word_embeddings");
out:
    rf_json_doc_free(doc);
    return rc;
}

/* ---- parameter table ---- */

static void add(rf_llama *m, const char *name, int d0, int d1) {
    rf_tensor_info *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = m->nparams;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->numel = (size_t)d0 * (d1 ? d1 : 1);
    t->decay = d1 != 0; /* matrices only, not the norms */
    m->nparams += t->numel;
}

#define PER_LAYER 9

static void build_table(rf_llama *m) {
    const rf_llama_config *c = &m->cfg;
    int C = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
    int NH = c->num_attention_heads, NKV = c->num_key_value_heads;
    char n[96];
    add(m, "model.embed_tokens.weight", c->vocab_size, C);
    for (int l = 0; l < c->num_hidden_layers; l++) {
#define L(suffix, d0, d1)                                                                          \
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                                        \
    add(m, n, d0, d1)
        L("input_layernorm.weight", C, 0);
        L("self_attn.q_proj.weight", NH * hd, C); /* q, k, v adjacent: one fused projection */
        L("self_attn.k_proj.weight", NKV * hd, C);
        L("self_attn.v_proj.weight", NKV * hd, C);
        L("self_attn.o_proj.weight", C, NH * hd);
        L("post_attention_layernorm.weight", C, 0);
        L("mlp.gate_proj.weight", F, C); /* gate, up adjacent: one fused projection */
        L("mlp.up_proj.weight", F, C);
        L("mlp.down_proj.weight", C, F);
#undef L
    }
    add(m, "model.norm.weight", C, 0);
    if (!c->tie_word_embeddings) add(m, "lm_head.weight", c->vocab_size, C);
}

/* ---- units (causal_units.h) ---- */

int rf_llama_units(const rf_llama *m) {
    return m->cfg.num_hidden_layers + 2;
}

static void unit_tensors(const rf_llama *m, int u, size_t *first, size_t *last) {
    int L = m->cfg.num_hidden_layers;
    *first = u == 0 ? 0 : u <= L ? 1 + PER_LAYER * (size_t)(u - 1) : 1 + PER_LAYER * (size_t)L;
    *last = u == 0 ? 0 : u <= L ? *first + PER_LAYER - 1 : m->ntensors - 1;
}

void rf_llama_unit_range(const rf_llama *m, int u, size_t *lo, size_t *hi) {
    size_t f, l;
    unit_tensors(m, u, &f, &l);
    *lo = m->tensors[f].offset;
    *hi = m->tensors[l].offset + m->tensors[l].numel;
}

/* Points unit u's views of v at ub, which holds the unit's range [lo, hi). A
 * tied head is unit 0's embedding. */
static void bind_unit(rf_llama *m, int u, rf_llama_params *v, float *ub) {
    const rf_tensor_info *t = m->tensors;
    size_t lo, hi, f, l;
    rf_llama_unit_range(m, u, &lo, &hi);
    unit_tensors(m, u, &f, &l);
#define AT(i) (ub + (t[i].offset - lo))
    if (u == 0) {
        v->wte = AT(0);
        if (m->cfg.tie_word_embeddings) v->head_w = v->wte;
    } else if (u <= m->cfg.num_hidden_layers) {
        rf_llama_layer *y = &v->layers[u - 1];
        y->ln1_w = AT(f);
        y->qkv_w = AT(f + 1);
        y->o_w = AT(f + 4);
        y->ln2_w = AT(f + 5);
        y->gu_w = AT(f + 6);
        y->down_w = AT(f + 8);
    } else {
        v->norm_w = AT(f);
        if (!m->cfg.tie_word_embeddings) v->head_w = AT(f + 1);
    }
#undef AT
}

static void bind(rf_llama *m, rf_llama_params *v, float *base) {
    for (int u = 0; u < rf_llama_units(m); u++) {
        size_t lo, hi;
        rf_llama_unit_range(m, u, &lo, &hi);
        bind_unit(m, u, v, base + lo);
    }
}

void rf_llama_bind_unit(rf_llama *m, int u, float *p, float *g) {
    if (p) bind_unit(m, u, &m->p, p);
    if (g) bind_unit(m, u, &m->g, g);
}

void rf_llama_bind_all(rf_llama *m) {
    if (m->params) bind(m, &m->p, m->params);
    if (m->grads) bind(m, &m->g, m->grads);
}

/* Whether be fills every slot the model calls (a backend built before its
 * causal-LM kernels has NULL there): RF_ERR_UNSUPPORTED naming the first
 * missing one otherwise. */
static int check_slots(const rf_backend *be) {
#define SLOT(x)                                                                                    \
    { #x, be->x == NULL }
    const rf_backend_slot s[] = {SLOT(tokpos_fwd),
                                 SLOT(tokpos_bwd),
                                 SLOT(rmsnorm_fwd),
                                 SLOT(rmsnorm_bwd),
                                 SLOT(linear_fwd),
                                 SLOT(linear_bwd),
                                 SLOT(rope_fwd),
                                 SLOT(rope_bwd),
                                 SLOT(causal_attention_fwd),
                                 SLOT(causal_attention_bwd),
                                 SLOT(residual_fwd),
                                 SLOT(residual_bwd),
                                 SLOT(swiglu_fwd),
                                 SLOT(swiglu_bwd),
                                 SLOT(lm_head_fwd),
                                 SLOT(lm_head_bwd),
                                 SLOT(causal_xent_fwd),
                                 SLOT(causal_xent_bwd),
                                 SLOT(copy2d)};
#undef SLOT
    return rf_backend_check_slots(be, "llama", s, sizeof s / sizeof s[0]);
}

int rf_llama_new(const rf_llama_config *cfg, rf_llama **out) {
    return rf_llama_new_on(cfg, NULL, out);
}

int rf_llama_new_on(const rf_llama_config *cfg, const rf_backend *be, rf_llama **out) {
    *out = NULL;
    if (!be) be = rf_backend_cpu();
    int rc = check_slots(be);
    if (rc) return rc;
    rf_llama *m = calloc(1, sizeof *m);
    if (!m) return RF_ERR_NOMEM;
    m->be = be;
    m->cfg = *cfg;
    int L = cfg->num_hidden_layers;
    m->tensors = calloc((size_t)PER_LAYER * L + 3, sizeof *m->tensors);
    m->p.layers = calloc((size_t)L, sizeof(rf_llama_layer));
    m->g.layers = calloc((size_t)L, sizeof(rf_llama_layer));
    m->a.layers = calloc((size_t)L, sizeof(rf_llama_acts_layer));
    m->da.layers = calloc((size_t)L, sizeof(rf_llama_acts_layer));
    m->a.res = calloc((size_t)L + 1, sizeof(float *));
    m->da.res = calloc((size_t)L + 1, sizeof(float *));
    if (!m->tensors || !m->p.layers || !m->g.layers || !m->a.layers || !m->da.layers || !m->a.res ||
        !m->da.res) {
        rf_llama_free(m);
        return RF_ERR_NOMEM;
    }
    build_table(m);
    if (!(m->params = rf_backend_alloc(m->be, m->nparams * sizeof(float)))) {
        rf_llama_free(m);
        return RF_ERR_NOMEM;
    }
    bind(m, &m->p, m->params);
    m->npadded = m->nparams;
    *out = m;
    return RF_OK;
}

void rf_llama_free(rf_llama *m) {
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

const rf_tensor_info *rf_llama_find(const rf_llama *m, const char *name) {
    for (size_t i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

int rf_llama_load(const char *dir, rf_llama **out) {
    return rf_llama_load_on(dir, NULL, out);
}

/* Tensor s into m's parameters: directly on the CPU, else through a host
 * buffer and to_device. */
static int read_tensor(const rf_backend *be, const rf_st_tensor *s, float *dst, size_t numel) {
    if (be == rf_backend_cpu()) return rf_st_to_f32(s, dst);
    float *h = malloc(numel * sizeof(float) + 4);
    if (!h) return rf_fail(RF_ERR_NOMEM, "no host memory for tensor '%s'", s->name);
    int rc = rf_st_to_f32(s, h);
    if (!rc) rc = be->to_device(be, dst, h, numel * sizeof(float));
    free(h);
    return rc;
}

int rf_llama_load_on(const char *dir, const rf_backend *be, rf_llama **out) {
    char path[4096];
    *out = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    int rc = rf_read_file(path, 1 << 20, &text, &len);
    if (rc) return rc;
    rf_llama_config cfg;
    rc = rf_llama_config_parse(text, len, &cfg);
    free(text);
    if (rc) return rf_fail_ctx(rc, "%s", path);
    rf_st_file *st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((rc = rf_st_open(path, &st))) return rc;
    rf_llama *m;
    if ((rc = rf_llama_new_on(&cfg, be, &m))) {
        rf_st_free(st);
        return rc;
    }
    for (size_t i = 0; i < m->ntensors && !rc; i++) {
        const rf_tensor_info *t = &m->tensors[i];
        const rf_st_tensor *s = rf_st_find(st, t->name);
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
        rf_llama_free(m);
        return rc;
    }
    *out = m;
    return RF_OK;
}

int rf_llama_enable_training(rf_llama *m) {
    return rf_llama_enable_training_sharded(m, m->nparams, m->nparams);
}

int rf_llama_enable_training_sharded(rf_llama *m, size_t padded, size_t moments) {
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
        return rf_fail(RF_ERR_NOMEM, "llama: no memory for the training blocks");
    bind(m, &m->g, m->grads);
    m->training = true;
    if (m->acts && !m->dacts && !(m->dacts = rf_backend_alloc(be, m->ngrads * sizeof(float))))
        return RF_ERR_NOMEM;
    return RF_OK;
}

void rf_llama_release_blocks(rf_llama *m, bool params) {
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

int rf_llama_adopt_params(rf_llama *m, const float *host) {
    if (!m->params) {
        if (!(m->params = rf_backend_alloc(m->be, m->nparams * sizeof(float))))
            return rf_fail_ctx(RF_ERR_NOMEM, "llama: no memory for %zu parameters", m->nparams);
        m->npadded = m->nparams;
    }
    TRY(m->be->to_device(m->be, m->params, host, m->nparams * sizeof(float)));
    rf_llama_bind_all(m);
    return RF_OK;
}

int rf_llama_zero_grad(rf_llama *m) {
    if (!m->grads && !m->unit_hook)
        return rf_fail(RF_ERR_INVALID, "llama: training is not enabled");
    return m->grads ? m->be->zero(m->be, m->grads, m->npadded * sizeof(float)) : RF_OK;
}

/* The linear projections: through the LoRA adapters when attached. */
static int proj_fwd(rf_llama *m, int l, int slot, float *out, const float *x, const float *w, int N,
                    int IC, int OC) {
    if (m->lora) return rf_lora_fwd(m->lora, l, slot, out, x, w, NULL, N, IC, OC);
    return m->be->linear_fwd(m->be, out, x, w, NULL, N, IC, OC);
}

static int proj_bwd(rf_llama *m, int l, int slot, float *dx, float *dw, const float *dout,
                    const float *x, const float *w, int N, int IC, int OC) {
    if (m->lora) return rf_lora_bwd(m->lora, l, slot, dx, dw, NULL, dout, x, w, N, IC, OC);
    return m->be->linear_bwd(m->be, dx, dw, NULL, dout, x, w, N, IC, OC);
}

/* ---- activations ---- */

/* As gpt2.c's layout: the activations hold one buffer of attention
 * probabilities and one of SwiGLU outputs for every layer (recomputed by the
 * backward) and no qkvr (a gradient only); grads, the gradient arena, holds
 * one layer region for every layer. */
static size_t layout(const rf_llama *m, rf_llama_acts *v, float *base, int B, int T, bool grads) {
    const rf_llama_config *c = &m->cfg;
    const struct rf_bert_tp *tp = m->tp; /* the local widths of a tp shard */
    size_t NH = (size_t)(tp ? tp->NHl : c->num_attention_heads);
    size_t NKV = (size_t)(tp ? tp->NKVl : c->num_key_value_heads);
    size_t N = (size_t)B * T, C = (size_t)c->hidden_size, off = 0;
    size_t F = (size_t)(tp ? tp->Il : c->intermediate_size);
    size_t A = NH * (size_t)c->head_dim, W = (NH + 2 * NKV) * (size_t)c->head_dim;
    size_t V = (size_t)(tp ? tp->vocab.block : c->vocab_size);
#define TAKE(ptr, n)                                                                               \
    do {                                                                                           \
        if (base) (ptr) = base + off;                                                              \
        off += (n);                                                                                \
    } while (0)
    for (int l = 0; l <= c->num_hidden_layers; l++)
        TAKE(v->res[l], N * C);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        rf_llama_acts_layer *y = &v->layers[l];
        if (grads && l > 0) {
            if (base) *y = v->layers[0];
            continue;
        }
        TAKE(y->ln1, N * C);
        TAKE(y->ln1_rstd, N);
        TAKE(y->qkv, N * W); /* after RoPE */
        if (grads)
            TAKE(y->qkvr, N * W); /* the gradient before RoPE */
        else if (base)
            y->qkvr = NULL;
        if (!grads && l > 0) { /* one buffer of probabilities for every layer */
            if (base) y->att = v->layers[0].att;
        } else {
            /* the probabilities (or the statistics: rf_backend_attention_stats); in the
             * gradient arena the backward's scratch, B NH T floats */
            TAKE(y->att, B * NH * T * (grads || m->att_stats ? 1 : (size_t)T));
        }
        TAKE(y->atty, N * A);
        TAKE(y->res2, N * C);
        TAKE(y->ln2, N * C);
        TAKE(y->ln2_rstd, N);
        TAKE(y->gu, N * 2 * F);
        if (!grads && l > 0) { /* one SwiGLU output for every layer, as att */
            if (base) y->act = v->layers[0].act;
        } else {
            TAKE(y->act, N * F);
        }
    }
    TAKE(v->lnf, N * C);
    TAKE(v->lnf_rstd, N);
    TAKE(v->logits, N * V);
    TAKE(v->lse, N);
    TAKE(v->losses, N);
#undef TAKE
    return off;
}

int rf_llama_reserve(rf_llama *m, int B, int T) {
    if (B < 1 || T < 1 || T > m->cfg.max_position_embeddings)
        return rf_fail(RF_ERR_RANGE, "llama: batch %d x %d (at most %d positions)", B, T,
                       m->cfg.max_position_embeddings);
    if (B <= m->capB && T <= m->capT) return RF_OK;
    int nB = B > m->capB ? B : m->capB;
    T = T > m->capT ? T : m->capT;
    const rf_backend *be = m->be;
    int rc = rf_backend_attention_stats(be, m->cfg.head_dim, &m->att_stats);
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

static int event(rf_llama *m, int u, rf_unit_event ev, int next) {
    return m->unit_hook ? m->unit_hook(m->unit_user, u, ev, next) : RF_OK;
}

static int check_range(const rf_llama *m, int u0, int u1, const float *at_u0, const float *at_u1) {
    int n = rf_llama_units(m);
    if (u0 < 0 || u1 > n || u0 >= u1)
        return rf_fail(RF_ERR_RANGE, "llama: unit range [%d, %d) outside [0, %d)", u0, u1, n);
    if ((u0 > 0 && !at_u0) || (u1 < n && !at_u1))
        return rf_fail(RF_ERR_INVALID, "llama: unit range [%d, %d) needs its boundary buffers", u0,
                       u1);
    return RF_OK;
}

int rf_llama_replay(rf_llama *m, int u0, int u1, bool backward) {
    int n = rf_llama_units(m);
    bool tied = m->cfg.tie_word_embeddings, head = rf_cu_head_reads_emb(u1, n, tied);
    for (int u = u0; u < u1; u++)
        TRY(event(m, u, RF_UNIT_FWD, rf_cu_fwd_next(u, false, u1, n, tied)));
    if (head) TRY(event(m, 0, RF_UNIT_FWD, rf_cu_fwd_next(0, true, u1, n, tied)));
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

int rf_llama_forward(rf_llama *m, const rf_causal_batch *bt) {
    return rf_llama_forward_range(m, bt, 0, rf_llama_units(m), NULL, NULL);
}

int rf_llama_forward_range(rf_llama *m, const rf_causal_batch *bt, int u0, int u1, const float *in,
                           float *out) {
    int B = bt->B, T = bt->T;
    const int32_t *ids = bt->ids, *labels = bt->labels;
    const rf_llama_config *c = &m->cfg;
    const rf_backend *be = m->be;
    int rc = check_range(m, u0, u1, in, out);
    if (!rc) rc = rf_llama_reserve(m, B, T);
    if (!rc && m->lora) rc = rf_lora_reserve(m->lora, B * T);
    if (rc) return rc;
    struct rf_bert_tp *tp = m->tp;
    /* the local widths (the whole model's without tp): heads, MLP size,
     * vocabulary columns; V stays the whole vocabulary for the checks */
    int N = B * T, C = c->hidden_size, F = tp ? tp->Il : c->intermediate_size, V = c->vocab_size;
    int NH = tp ? tp->NHl : c->num_attention_heads, hd = c->head_dim;
    int NKV = tp ? tp->NKVl : c->num_key_value_heads;
    int A = NH * hd, W = (NH + 2 * NKV) * hd, Vl = tp ? tp->vocab.block : V;
    float eps = c->rms_norm_eps;
    for (int n = 0; n < N; n++)
        if (ids[n] < 0 || ids[n] >= V)
            return rf_fail(RF_ERR_RANGE, "llama: token id %d outside the vocabulary (%d)", ids[n],
                           V);
    for (int n = 0; labels && n < N; n++)
        if (labels[n] >= V)
            return rf_fail(RF_ERR_RANGE, "%s: label %d outside the vocabulary (%d)", "llama",
                           labels[n], V);
    for (int n = 0; bt->pos && n < N; n++)
        if (bt->pos[n] < 0 || bt->pos[n] >= c->max_position_embeddings)
            return rf_fail(RF_ERR_RANGE, "llama: position %d outside [0, %d)", bt->pos[n],
                           c->max_position_embeddings);
    memcpy(m->io.ids, ids, sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) {
        m->io.valid[n] = bt->valid ? bt->valid[n] != 0 : 1;
        m->io.labels[n] = labels ? labels[n] : -100;
        m->io.pos[n] = bt->pos ? bt->pos[n] : n % T;
        m->io.seg[n] = bt->seg ? bt->seg[n] : 0;
    }
    m->B = B, m->T = T, m->has_labels = labels != NULL, m->packed = bt->seg != NULL;
    TRY(rf_causal_io_send(&m->io, be)); /* the batch on the backend: one upload */
    layout(m, &m->a, m->acts, B, T, false);
    rf_llama_acts *a = &m->a;
    int L = c->num_hidden_layers, n_units = L + 2;
    bool tied = c->tie_word_embeddings;
    m->logits = a->logits;
    m->loss = 0;
    m->counted = 0;
    if (u0 > 0) /* boundary u0 is the residual stream res[u0 - 1] */
        TRY(be->copy(be, a->res[u0 - 1], in, (size_t)N * C * sizeof(float)));

    if (u0 == 0) {
        TRY(event(m, 0, RF_UNIT_FWD, rf_cu_fwd_next(0, false, u1, n_units, tied)));
        if (tp)
            TRY(tp->embed_fwd(&tp->g, a->res[0], m->io.ids_dev, NULL, NULL, m->p.wte, &tp->vocab,
                              NULL, NULL, B, T, C));
        else
            TRY(be->tokpos_fwd(be, a->res[0], m->io.ids_dev, m->io.pos_dev, m->p.wte, NULL, B, T,
                               C));
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (l + 1 < u0 || l + 1 >= u1) continue;
        TRY(event(m, l + 1, RF_UNIT_FWD, rf_cu_fwd_next(l + 1, false, u1, n_units, tied)));
        const rf_llama_layer *w = &m->p.layers[l];
        rf_llama_acts_layer *y = &a->layers[l];
        TRY(be->rmsnorm_fwd(be, y->ln1, y->ln1_rstd, a->res[l], w->ln1_w, N, C, eps));
        TRY(proj_fwd(m, l, RF_PROJ_QKV, y->qkv, y->ln1, w->qkv_w, N, C, W));
        TRY(be->rope_fwd(be, y->qkv, y->qkv, m->io.pos_dev, N, T, NH, hd, W, c->rope_theta));
        TRY(be->rope_fwd(be, y->qkv + A, y->qkv + A, m->io.pos_dev, N, T, NKV, hd, W,
                         c->rope_theta));
        TRY(be->causal_attention_fwd(be, y->atty, y->att, y->qkv, m->io.valid_dev,
                                     m->packed ? m->io.seg_dev : NULL, B, T, NH, NKV, hd));
        TRY(proj_fwd(m, l, RF_PROJ_O, y->res2, y->atty, w->o_w, N, A, C));
        if (tp) TRY(tp->sum(&tp->g, y->res2, (size_t)N * C)); /* row-parallel: g */
        TRY(be->residual_fwd(be, y->res2, y->res2, a->res[l], (size_t)N * C, 0.0f, 0));
        TRY(be->rmsnorm_fwd(be, y->ln2, y->ln2_rstd, y->res2, w->ln2_w, N, C, eps));
        TRY(proj_fwd(m, l, RF_PROJ_UP, y->gu, y->ln2, w->gu_w, N, C, 2 * F));
        TRY(be->swiglu_fwd(be, y->act, y->gu, N, F));
        TRY(proj_fwd(m, l, RF_PROJ_DOWN, a->res[l + 1], y->act, w->down_w, N, F, C));
        if (tp) TRY(tp->sum(&tp->g, a->res[l + 1], (size_t)N * C));
        TRY(be->residual_fwd(be, a->res[l + 1], a->res[l + 1], y->res2, (size_t)N * C, 0.0f, 0));
    }
    if (u1 < n_units) { /* boundary u1 for the stage after */
        return be->copy(be, out, a->res[u1 - 1], (size_t)N * C * sizeof(float));
    }
    TRY(event(m, L + 1, RF_UNIT_FWD, rf_cu_fwd_next(L + 1, false, u1, n_units, tied)));
    TRY(be->rmsnorm_fwd(be, a->lnf, a->lnf_rstd, a->res[c->num_hidden_layers], m->p.norm_w, N, C,
                        eps));
    if (tied) TRY(event(m, 0, RF_UNIT_FWD, rf_cu_fwd_next(0, true, u1, n_units, tied)));
    if (tp) { /* the rank's vocabulary columns, the loss over the group */
        TRY(tp->colpar_fwd(&tp->g, a->logits, Vl, a->lnf, m->p.head_w, C, NULL, N, C, Vl));
        if (labels) {
            m->counted = rf_causal_targets(m->io.tgt, m->io.labels, B, T);
            TRY(be->to_device(be, m->io.tgt_dev, m->io.tgt, sizeof(int32_t) * (size_t)N));
            TRY(tp->xent_fwd(&tp->g, &m->loss, a->losses, a->lse, m->io.se, a->logits, Vl,
                             m->io.tgt_dev, &tp->vocab, N));
        }
        return RF_OK;
    }
    TRY(be->lm_head_fwd(be, a->logits, a->lnf, m->p.head_w, N, C, V));
    if (labels)
        TRY(be->causal_xent_fwd(be, &m->loss, &m->counted, a->lse, a->losses, a->logits,
                                m->io.labels_dev, B, T, V));
    return RF_OK;
}

int rf_llama_backward(rf_llama *m, float loss_scale) {
    return rf_llama_backward_range(m, loss_scale, 0, rf_llama_units(m), NULL, NULL);
}

int rf_llama_backward_range(rf_llama *m, float loss_scale, int u0, int u1, const float *dout,
                            float *din) {
    const rf_llama_config *c = &m->cfg;
    if (!m->grads && !m->unit_hook && !m->lora) /* (a hook binds the gradient views: ZeRO-2/3) */
        return rf_fail(RF_ERR_INVALID, "llama: training is not enabled");
    const rf_backend *be = m->be;
    int n_units = rf_llama_units(m), rc = check_range(m, u0, u1, din, dout);
    if (rc) return rc;
    if (!m->dacts && !(m->dacts = rf_backend_alloc(be, m->ngrads * sizeof(float))))
        return RF_ERR_NOMEM;
    if (u1 == n_units && !m->has_labels)
        return rf_fail(RF_ERR_INVALID, "llama: backward needs a forward with labels");
    struct rf_bert_tp *tp = m->tp;
    int B = m->B, T = m->T, N = B * T, C = c->hidden_size, F = tp ? tp->Il : c->intermediate_size,
        V = c->vocab_size, L = c->num_hidden_layers;
    int NH = tp ? tp->NHl : c->num_attention_heads, hd = c->head_dim;
    int NKV = tp ? tp->NKVl : c->num_key_value_heads;
    int A = NH * hd, W = (NH + 2 * NKV) * hd, Vl = tp ? tp->vocab.block : V;
    bool tied = c->tie_word_embeddings;
    size_t used = layout(m, &m->da, m->dacts, B, T, true);
    TRY(be->zero(be, m->dacts, used * sizeof(float)));
    rf_llama_acts *a = &m->a, *d = &m->da;
    /* the gradient arena's one layer region, and the first layer this range
     * runs backward (as in gpt2.c) */
    size_t region = (size_t)(d->layers[0].act - d->layers[0].ln1) + (size_t)N * F;
    int first = u1 - 2 < L - 1 ? u1 - 2 : L - 1;

    if (u1 == n_units) {
        if (tp)
            TRY(tp->xent_bwd(&tp->g, d->logits, Vl, a->logits, Vl, a->lse, m->io.se, m->io.tgt_dev,
                             &tp->vocab, N, loss_scale));
        else
            TRY(be->causal_xent_bwd(be, d->logits, a->logits, a->lse, m->io.labels_dev, B, T, V,
                                    loss_scale));
        if (tied)
            TRY(event(m, 0, RF_UNIT_BWD, rf_cu_bwd_next(0, true, u0, u1)));
        else
            TRY(event(m, L + 1, RF_UNIT_BWD, rf_cu_bwd_next(L + 1, false, u0, u1)));
        if (tp)
            TRY(tp->colpar_bwd(&tp->g, d->lnf, m->g.head_w, NULL, C, d->logits, Vl, a->lnf,
                               m->p.head_w, N, C, Vl));
        else
            TRY(be->lm_head_bwd(be, d->lnf, m->g.head_w, d->logits, a->lnf, m->p.head_w, N, C, V));
        if (tied) {
            TRY(event(m, 0, RF_UNIT_BWD_PART, -1));
            TRY(event(m, L + 1, RF_UNIT_BWD, rf_cu_bwd_next(L + 1, false, u0, u1)));
        }
        TRY(be->rmsnorm_bwd(be, d->res[L], m->g.norm_w, d->lnf, a->res[L], m->p.norm_w, a->lnf_rstd,
                            N, C));
        TRY(event(m, L + 1, RF_UNIT_BWD_DONE, -1));
    } else { /* the gradient of boundary u1 from the stage after */
        TRY(be->copy(be, d->res[u1 - 1], dout, (size_t)N * C * sizeof(float)));
    }
    for (int l = L - 1; l >= 0; l--) {
        if (l + 1 < u0 || l + 1 >= u1) continue;
        TRY(event(m, l + 1, RF_UNIT_BWD, rf_cu_bwd_next(l + 1, false, u0, u1)));
        const rf_llama_layer *w = &m->p.layers[l];
        rf_llama_layer *g = &m->g.layers[l];
        rf_llama_acts_layer *y = &a->layers[l], *dy = &d->layers[l];
        float *dout_l = d->res[l + 1];
        if (l < first) TRY(be->zero(be, dy->ln1, region * sizeof(float)));
        TRY(be->swiglu_fwd(be, y->act, y->gu, N, F)); /* recomputed (layout) */
        TRY(proj_bwd(m, l, RF_PROJ_DOWN, dy->act, g->down_w, dout_l, y->act, w->down_w, N, F, C));
        TRY(be->swiglu_bwd(be, dy->gu, dy->act, y->gu, N, F));
        TRY(proj_bwd(m, l, RF_PROJ_UP, dy->ln2, g->gu_w, dy->gu, y->ln2, w->gu_w, N, C, 2 * F));
        if (tp) TRY(tp->sum(&tp->g, dy->ln2, (size_t)N * C)); /* column-parallel: f */
        TRY(be->rmsnorm_bwd(be, dy->res2, g->ln2_w, dy->ln2, y->res2, w->ln2_w, y->ln2_rstd, N, C));
        TRY(be->residual_bwd(be, dy->res2, NULL, dout_l, (size_t)N * C, 0.0f, 0));
        TRY(proj_bwd(m, l, RF_PROJ_O, dy->atty, g->o_w, dy->res2, y->atty, w->o_w, N, A, C));
        /* the layer's probabilities again (layout; atty already holds the values) */
        TRY(be->causal_attention_fwd(be, NULL, y->att, y->qkv, m->io.valid_dev,
                                     m->packed ? m->io.seg_dev : NULL, B, T, NH, NKV, hd));
        TRY(be->causal_attention_bwd(be, dy->qkv, dy->att, dy->atty, y->qkv, y->att, y->atty,
                                     m->io.valid_dev, m->packed ? m->io.seg_dev : NULL, B, T, NH,
                                     NKV, hd));
        /* back through RoPE on q and k; v passes unchanged (its column block) */
        TRY(be->rope_bwd(be, dy->qkvr, dy->qkv, m->io.pos_dev, N, T, NH, hd, W, c->rope_theta));
        TRY(be->rope_bwd(be, dy->qkvr + A, dy->qkv + A, m->io.pos_dev, N, T, NKV, hd, W,
                         c->rope_theta));
        TRY(be->copy2d(be, dy->qkvr + A + NKV * hd, sizeof(float) * W, dy->qkv + A + NKV * hd,
                       sizeof(float) * W, sizeof(float) * NKV * hd, (size_t)N));
        TRY(proj_bwd(m, l, RF_PROJ_QKV, dy->ln1, g->qkv_w, dy->qkvr, y->ln1, w->qkv_w, N, C, W));
        if (tp) TRY(tp->sum(&tp->g, dy->ln1, (size_t)N * C));
        TRY(be->rmsnorm_bwd(be, d->res[l], g->ln1_w, dy->ln1, a->res[l], w->ln1_w, y->ln1_rstd, N,
                            C));
        TRY(be->residual_bwd(be, d->res[l], NULL, dy->res2, (size_t)N * C, 0.0f, 0));
        TRY(event(m, l + 1, RF_UNIT_BWD_DONE, -1));
    }
    if (u0 > 0) { /* the gradient of boundary u0 for the stage before */
        return be->copy(be, din, d->res[u0 - 1], (size_t)N * C * sizeof(float));
    }
    TRY(event(m, 0, RF_UNIT_BWD, rf_cu_bwd_next(0, false, u0, u1)));
    if (tp)
        TRY(tp->embed_bwd(&tp->g, m->g.wte, NULL, NULL, d->res[0], m->io.ids_dev, NULL, &tp->vocab,
                          B, T, C));
    else if (m->g.wte) /* NULL: a frozen embedding (LoRA) */
        TRY(be->tokpos_bwd(be, m->g.wte, NULL, d->res[0], m->io.ids_dev, m->io.pos_dev, B, T, C, V,
                           0));
    TRY(event(m, 0, RF_UNIT_BWD_DONE, -1));
    return RF_OK;
}
