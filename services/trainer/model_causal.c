/* GPT-2 (gpt2.h) and Llama (llama.h) as rf_models (model_iface.h). The two
 * tables differ only in the functions they call, so one macro writes both;
 * the export's config.json is the loaded one with its dtype set to float32
 * (the weights are written in F32), or, for a model built in memory, the
 * architecture's essential keys. The model lives on the backend it was
 * loaded on (full fine-tuning on one process runs on a device); its LoRA,
 * tensor-parallel and unit-hook paths refuse any backend but the CPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/json.h"
#include "common/sys.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/model_iface.h"
#include "trainer/model_tp.h"
#include "trainer/safetensors.h"

int rf_model_load_causal(const char *dir, const char *arch, const rf_backend *be, rf_model *m);

/* ---- config.json for the export ---- */

static int put_json(rf_buf *b, const rf_json *v, int depth);

static int indent(rf_buf *b, int depth) {
    int rc = rf_buf_putc(b, '\n');
    for (int i = 0; i < depth && !rc; i++)
        rc = rf_buf_puts(b, "  ");
    return rc;
}

/* Writes v as JSON (HF's layout: two-space indent); numbers keep their text,
 * and a top-level "torch_dtype"/"dtype" becomes "float32". */
static int put_json(rf_buf *b, const rf_json *v, int depth) {
    switch (v->type) {
    case RF_JSON_NULL:
        return rf_buf_puts(b, "null");
    case RF_JSON_FALSE:
        return rf_buf_puts(b, "false");
    case RF_JSON_TRUE:
        return rf_buf_puts(b, "true");
    case RF_JSON_NUMBER:
        return rf_buf_append(b, v->u.str, v->len);
    case RF_JSON_STRING:
        return rf_buf_append_json_str(b, v->u.str, v->len);
    case RF_JSON_ARRAY: {
        int rc = rf_buf_putc(b, '[');
        for (size_t i = 0; i < v->len && !rc; i++) {
            if (i) rc = rf_buf_putc(b, ',');
            if (!rc) rc = indent(b, depth + 1);
            if (!rc) rc = put_json(b, &v->u.items[i], depth + 1);
        }
        if (!rc && v->len) rc = indent(b, depth);
        return rc ? rc : rf_buf_putc(b, ']');
    }
    case RF_JSON_OBJECT: {
        int rc = rf_buf_putc(b, '{');
        for (size_t i = 0; i < v->len && !rc; i++) {
            const rf_json_member *mb = &v->u.members[i];
            if (i) rc = rf_buf_putc(b, ',');
            if (!rc) rc = indent(b, depth + 1);
            if (!rc) rc = rf_buf_append_json_str(b, mb->key, mb->keylen);
            if (!rc) rc = rf_buf_puts(b, ": ");
            bool dtype = depth == 0 && mb->value.type == RF_JSON_STRING &&
                         ((mb->keylen == 11 && !memcmp(mb->key, "torch_dtype", 11)) ||
                          (mb->keylen == 5 && !memcmp(mb->key, "dtype", 5)));
            if (!rc)
                rc = dtype ? rf_buf_puts(b, "\"float32\"") : put_json(b, &mb->value, depth + 1);
        }
        if (!rc && v->len) rc = indent(b, depth);
        return rc ? rc : rf_buf_putc(b, '}');
    }
    }
    return RF_ERR_INVALID;
}

static int config_from_source(const char *text, rf_buf *out) {
    rf_json_doc *doc = rf_json_doc_new();
    if (!doc) return RF_ERR_NOMEM;
    const rf_json *root;
    int rc = rf_json_parse(doc, text, strlen(text), &root);
    if (!rc) rc = put_json(out, root, 0);
    if (!rc) rc = rf_buf_putc(out, '\n');
    rf_json_doc_free(doc);
    return rc;
}

static int gpt2_config_json(const rf_gpt2_config *c, rf_buf *o) {
    return rf_buf_printf(
        o,
        "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": "
        "\"gpt2\",\n  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_embd\": "
        "%d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": %d,\n  "
        "\"layer_norm_epsilon\": %.9g,\n  \"activation_function\": \"gelu_new\",\n "
        " \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\"\n}\n",
        c->vocab_size, c->n_positions, c->n_embd, c->n_layer, c->n_head, c->n_inner,
        (double)c->layer_norm_epsilon);
}

static int llama_config_json(const rf_llama_config *c, rf_buf *o) {
    return rf_buf_printf(
        o,
        "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  "
        "\"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  "
        "\"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": "
        "%d,\n  \"head_dim\": %d,\n  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %.9g,\n "
        " \"rope_theta\": %.9g,\n  \"tie_word_embeddings\": %s,\n  \"hidden_act\": \"silu\",\n  "
        "\"attention_bias\": false,\n  \"mlp_bias\": false,\n  \"torch_dtype\": \"float32\"\n}\n",
        c->vocab_size, c->hidden_size, c->intermediate_size, c->num_hidden_layers,
        c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->max_position_embeddings,
        (double)c->rms_norm_eps, (double)c->rope_theta, c->tie_word_embeddings ? "true" : "false");
}

/* eos_token_id of the loaded config.json (an integer, or the first of a
 * list), -1 when absent. */
static int config_eos(const char *text) {
    if (!text) return -1;
    rf_json_doc *doc = rf_json_doc_new();
    const rf_json *root, *v;
    int64_t x = -1;
    if (doc && rf_json_parse(doc, text, strlen(text), &root) == 0 &&
        (v = rf_json_get(root, "eos_token_id"))) {
        if (v->type == RF_JSON_ARRAY && v->len) v = &v->u.items[0];
        if (rf_json_int64(v, &x) || x < 0 || x > INT32_MAX) x = -1;
    }
    rf_json_doc_free(doc);
    return (int)x;
}

/* config.json and model.safetensors of a causal LM into dir. */
static int save_causal(const rf_model *m, const char *dir, const rf_backend *be,
                       const rf_tensor_info *t, size_t nt, const float *params, rf_buf *cfg) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = rf_write_file_atomic(path, cfg->data, cfg->len);
    if (rc) return rf_fail_ctx(rc, "export: cannot write %s", path);
    if (!params)
        return rf_fail(RF_ERR_INVALID, "export: the %s model holds no parameters", m->ops->name);
    /* a device's parameters come to the host first (the tensors tile the block) */
    float *host = NULL;
    if (be != rf_backend_cpu()) {
        size_t n = nt ? t[nt - 1].offset + t[nt - 1].numel : 0;
        if (!(host = malloc(n * sizeof(float) + 4))) return RF_ERR_NOMEM;
        if ((rc = be->to_host(be, host, params, n * sizeof(float)))) {
            free(host);
            return rc;
        }
        params = host;
    }
    rf_st_out *o = calloc(nt, sizeof *o);
    if (!o) {
        free(host);
        return RF_ERR_NOMEM;
    }
    for (size_t i = 0; i < nt; i++)
        o[i] =
            (rf_st_out){t[i].name, t[i].ndim, {t[i].shape[0], t[i].shape[1]}, params + t[i].offset};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = rf_st_write(path, o, nt);
    free(o);
    free(host);
    return rc;
}

/* ---- the two tables ---- */

#define CAUSAL_OPS(P, TYPE, ARCH, LAYERS, HIDDEN, VOCAB, MAXPOS, TIED)                             \
    static int P##_close(rf_model *m) {                                                            \
        rf_##P##_free(m->impl);                                                                    \
        m->impl = NULL;                                                                            \
        return RF_OK;                                                                              \
    }                                                                                              \
    static int P##_info(const rf_model *m, rf_model_info *o) {                                     \
        const TYPE *x = m->impl;                                                                   \
        *o = (rf_model_info){.arch = ARCH,                                                         \
                             .task = RF_TASK_CAUSAL_LM,                                            \
                             .units = rf_##P##_units(x),                                           \
                             .layers = x->cfg.LAYERS,                                              \
                             .hidden = x->cfg.HIDDEN,                                              \
                             .vocab = x->cfg.VOCAB,                                                \
                             .max_positions = x->cfg.MAXPOS,                                       \
                             .num_labels = 0,                                                      \
                             .eos_token_id = m->eos,                                               \
                             .tied = (TIED)};                                                      \
        return RF_OK;                                                                              \
    }                                                                                              \
    static int P##_blocks(const rf_model *m, rf_model_blocks *o) {                                 \
        const TYPE *x = m->impl;                                                                   \
        *o = (rf_model_blocks){x->be,       x->tensors, x->ntensors, x->nparams, x->npadded,       \
                               x->nmoments, x->params,  x->grads,    x->mom1,    x->mom2};         \
        return RF_OK;                                                                              \
    }                                                                                              \
    static int P##_unit_range(const rf_model *m, int u, size_t *lo, size_t *hi) {                  \
        rf_##P##_unit_range(m->impl, u, lo, hi);                                                   \
        return RF_OK;                                                                              \
    }                                                                                              \
    static int P##_bind_unit(rf_model *m, int u, float *p, float *g) {                             \
        if (u < 0)                                                                                 \
            rf_##P##_bind_all(m->impl);                                                            \
        else                                                                                       \
            rf_##P##_bind_unit(m->impl, u, p, g);                                                  \
        return RF_OK;                                                                              \
    }                                                                                              \
    static int P##_release(rf_model *m, bool params) {                                             \
        rf_##P##_release_blocks(m->impl, params);                                                  \
        return RF_OK;                                                                              \
    }                                                                                              \
    static int P##_adopt(rf_model *m, const float *host) {                                         \
        return rf_##P##_adopt_params(m->impl, host);                                               \
    }                                                                                              \
    static int P##_enable(rf_model *m, size_t padded, size_t moments) {                            \
        return rf_##P##_enable_training_sharded(m->impl, padded, moments);                         \
    }                                                                                              \
    static int P##_zero_grad(rf_model *m) {                                                        \
        return rf_##P##_zero_grad(m->impl);                                                        \
    }                                                                                              \
    static int P##_set_hook(rf_model *m) {                                                         \
        TYPE *x = m->impl;                                                                         \
        x->unit_hook = m->hook;                                                                    \
        x->unit_user = m->hook_user;                                                               \
        return RF_OK;                                                                              \
    }                                                                                              \
    static int P##_replay(rf_model *m, int u0, int u1, bool backward) {                            \
        return rf_##P##_replay(m->impl, u0, u1, backward);                                         \
    }                                                                                              \
    static int P##_boundary(const rf_model *m, int B, int T, int u, size_t *n) {                   \
        (void)u;                                                                                   \
        *n = (size_t)B * T * (size_t)((const TYPE *)m->impl)->cfg.HIDDEN;                          \
        return RF_OK;                                                                              \
    }                                                                                              \
    static int P##_forward(rf_model *m, const rf_model_batch *b, int u0, int u1, const float *in,  \
                           float *out, bool train, uint64_t seed) {                                \
        (void)train, (void)seed; /* no dropout in the causal models */                             \
        rf_causal_batch cb = {b->B, b->T, b->ids, b->labels, b->pos, b->seg, b->valid};            \
        int rc = rf_##P##_forward_range(m->impl, &cb, u0, u1, in, out);                            \
        m->counted = rc ? 0 : ((TYPE *)m->impl)->counted;                                          \
        return rc;                                                                                 \
    }                                                                                              \
    static int P##_backward(rf_model *m, int u0, int u1, const float *dout, float *din,            \
                            float scale) {                                                         \
        return rf_##P##_backward_range(m->impl, scale, u0, u1, dout, din);                         \
    }                                                                                              \
    static int P##_loss(const rf_model *m, float *loss, long *counted) {                           \
        *loss = ((const TYPE *)m->impl)->loss;                                                     \
        *counted = m->counted;                                                                     \
        return RF_OK;                                                                              \
    }                                                                                              \
    static int P##_logits(const rf_model *m, const float **logits, size_t *row) {                  \
        const TYPE *x = m->impl;                                                                   \
        *logits = x->logits;                                                                       \
        *row = x->tp ? (size_t)x->tp->vocab.block : (size_t)x->cfg.VOCAB;                          \
        return RF_OK;                                                                              \
    }                                                                                              \
    static int P##_save(const rf_model *m, const char *dir) {                                      \
        const TYPE *x = m->impl;                                                                   \
        if (x->tp)                                                                                 \
            return rf_fail(RF_ERR_UNSUPPORTED,                                                     \
                           "export: %s: a tensor-parallel shard is not a whole model", dir);       \
        rf_buf cfg = RF_BUF_INIT;                                                                  \
        int rc = m->src_config ? config_from_source(m->src_config, &cfg)                           \
                               : P##_config_json(&x->cfg, &cfg);                                   \
        if (!rc) rc = save_causal(m, dir, x->be, x->tensors, x->ntensors, x->params, &cfg);        \
        rf_buf_free(&cfg);                                                                         \
        return rc;                                                                                 \
    }                                                                                              \
    static int P##_class_weights(rf_model *m, const float *w) {                                    \
        return w ? rf_fail(RF_ERR_UNSUPPORTED, "%s: class weights apply to classifiers only",      \
                           m->ops->name)                                                           \
                 : RF_OK;                                                                          \
    }                                                                                              \
    static int P##_sibling(const rf_model *m, rf_model **out) {                                    \
        TYPE *x;                                                                                   \
        const TYPE *src = m->impl;                                                                 \
        int rc = rf_##P##_new_on(&src->cfg, src->be, &x);                                          \
        if (!rc && src->tp && (rc = rf_##P##_tp_split(x, src->tp->c, src->tp->dev)))               \
            rf_##P##_free(x);                                                                      \
        if (rc) return rc;                                                                         \
        rf_model *o = malloc(sizeof *o);                                                           \
        if (!o) {                                                                                  \
            rf_##P##_free(x);                                                                      \
            return RF_ERR_NOMEM;                                                                   \
        }                                                                                          \
        rf_model_init_##P(o, x);                                                                   \
        *out = o;                                                                                  \
        return RF_OK;                                                                              \
    }                                                                                              \
    static const rf_model_ops P##_ops = {                                                          \
        .name = ARCH,                                                                              \
        .close = P##_close,                                                                        \
        .info = P##_info,                                                                          \
        .blocks = P##_blocks,                                                                      \
        .unit_range = P##_unit_range,                                                              \
        .bind_unit = P##_bind_unit,                                                                \
        .release_blocks = P##_release,                                                             \
        .adopt_params = P##_adopt,                                                                 \
        .enable_training = P##_enable,                                                             \
        .zero_grad = P##_zero_grad,                                                                \
        .set_class_weights = P##_class_weights,                                                    \
        .set_hook = P##_set_hook,                                                                  \
        .replay = P##_replay,                                                                      \
        .boundary = P##_boundary,                                                                  \
        .forward = P##_forward,                                                                    \
        .backward = P##_backward,                                                                  \
        .loss = P##_loss,                                                                          \
        .logits = P##_logits,                                                                      \
        .save = P##_save,                                                                          \
        .sibling = P##_sibling,                                                                    \
    };                                                                                             \
    void rf_model_init_##P(rf_model *m, TYPE *x) {                                                 \
        memset(m, 0, sizeof *m);                                                                   \
        m->ops = &P##_ops;                                                                         \
        m->impl = x;                                                                               \
        m->r1 = m->units = rf_##P##_units(x);                                                      \
        m->eos = -1;                                                                               \
    }

CAUSAL_OPS(gpt2, rf_gpt2, "gpt2", n_layer, n_embd, vocab_size, n_positions, true)
CAUSAL_OPS(llama, rf_llama, "llama", num_hidden_layers, hidden_size, vocab_size,
           max_position_embeddings, x->cfg.tie_word_embeddings)

int rf_model_load_causal(const char *dir, const char *arch, const rf_backend *be, rf_model *m) {
    char *src = m->src_config; /* rf_model_init_* clears m */
    int rc;
    if (strcmp(arch, "gpt2") == 0) {
        rf_gpt2 *g;
        if ((rc = rf_gpt2_load_on(dir, be, &g))) return rc;
        rf_model_init_gpt2(m, g);
    } else {
        rf_llama *l;
        if ((rc = rf_llama_load_on(dir, be, &l))) return rc;
        rf_model_init_llama(m, l);
    }
    m->src_config = src;
    m->eos = config_eos(src);
    return RF_OK;
}
