/* The rf_model calls (model_iface.h): checks, then the model's slot. */
#include "trainer/model_iface.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sys.h"
#include "trainer/bert_config.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/llama_gguf.h"

/* The model_type of a config.json text into arch (empty when absent). */
static int config_arch(const char *text, size_t len, const char *path, char *arch, size_t cap) {
    rf_json_doc *doc = rf_json_doc_new();
    if (!doc) return RF_ERR_NOMEM;
    const rf_json *root, *t;
    int rc = rf_json_parse(doc, text, len, &root);
    if (rc)
        rc = rf_fail_ctx(RF_ERR_PARSE, "%s", path);
    else if (root->type != RF_JSON_OBJECT)
        rc = rf_fail(RF_ERR_PARSE, "%s: not a JSON object", path);
    else if ((t = rf_json_get(root, "model_type")) && rf_json_is_str(t))
        snprintf(arch, cap, "%s", t->u.str);
    else
        snprintf(arch, cap, "%s", "");
    rf_json_doc_free(doc);
    return rc;
}

static int read_config(const char *dir, char **text, size_t *len, char *arch, size_t cap) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = rf_read_file(path, 1 << 20, text, len);
    if (rc) return rf_fail_ctx(rc, "model %s", dir);
    if ((rc = config_arch(*text, *len, path, arch, cap))) {
        free(*text);
        *text = NULL;
    }
    return rc;
}

static rf_model_task task_of(const char *arch) {
    return strcmp(arch, "gpt2") == 0 || strcmp(arch, "llama") == 0 ? RF_TASK_CAUSAL_LM
                                                                   : RF_TASK_CLASSIFY;
}

static int eos_of(const char *text, size_t len) {
    rf_json_doc *doc = rf_json_doc_new();
    const rf_json *root, *v;
    int64_t x = -1;
    if (doc && rf_json_parse(doc, text, len, &root) == 0 &&
        (v = rf_json_get(root, "eos_token_id"))) {
        if (v->type == RF_JSON_ARRAY && v->len) v = &v->u.items[0];
        if (rf_json_int64(v, &x) || x < 0 || x > INT32_MAX) x = -1;
    }
    rf_json_doc_free(doc);
    return (int)x;
}

int rf_model_describe(const char *dir, rf_model_desc *out) {
    char *text = NULL, a[64];
    size_t len;
    memset(out, 0, sizeof *out);
    char *gguf;
    int rc = rf_llama_gguf_path(dir, &gguf);
    if (rc) return rc;
    if (gguf) { /* a llama.cpp file (llama_gguf.h): its metadata is the config */
        rf_llama_config c;
        rf_ggml_type proj;
        rc = rf_llama_gguf_describe(gguf, &c, &out->eos_token_id, &proj);
        free(gguf);
        if (rc) return rc;
        snprintf(out->arch, sizeof out->arch, "llama");
        out->task = RF_TASK_CAUSAL_LM;
        out->vocab = c.vocab_size;
        out->max_positions = c.max_position_embeddings;
        return RF_OK;
    }
    rc = read_config(dir, &text, &len, a, sizeof a);
    if (rc) return rc;
    snprintf(out->arch, sizeof out->arch, "%s", a[0] ? a : "bert");
    out->task = task_of(a);
    out->eos_token_id = eos_of(text, len);
    if (strcmp(out->arch, "gpt2") == 0) {
        rf_gpt2_config c;
        if (!(rc = rf_gpt2_config_parse(text, len, &c))) {
            out->vocab = c.vocab_size;
            out->max_positions = c.n_positions;
        }
    } else if (strcmp(out->arch, "llama") == 0) {
        rf_llama_config c;
        if (!(rc = rf_llama_config_parse(text, len, &c))) {
            out->vocab = c.vocab_size;
            out->max_positions = c.max_position_embeddings;
        }
    } else {
        rf_bert_config c;
        if (!(rc = rf_bert_config_parse(text, len, 0, &c))) {
            out->vocab = c.vocab_size;
            out->max_positions = c.max_position;
        }
        out->eos_token_id = -1;
    }
    free(text);
    return rc ? rf_fail_ctx(rc, "model %s", dir) : RF_OK;
}

/* model_causal.c */
int rf_model_load_causal(const char *dir, const char *arch, const rf_backend *be, rf_model *m);

int rf_model_load(const char *dir, const rf_model_load_opts *o, const rf_backend *be,
                  rf_model **out) {
    static const rf_model_load_opts none = {0};
    if (!o) o = &none;
    *out = NULL;
    char *text = NULL, arch[64];
    size_t len;
    int rc = read_config(dir, &text, &len, arch, sizeof arch);
    if (rc) return rc;
    rf_model *m = calloc(1, sizeof *m);
    if (!m) {
        free(text);
        return RF_ERR_NOMEM;
    }
    if (task_of(arch) == RF_TASK_CAUSAL_LM) {
        m->src_config = text;
        text = NULL;
        rc = rf_model_load_causal(dir, arch, be, m);
    } else if (arch[0] == 0 || strcmp(arch, "bert") == 0) {
        rf_bert *b = NULL;
        if (!(rc = rf_bert_load(dir, o->num_labels, o->seed, be, &b))) rf_model_init_bert(m, b);
    } else {
        rc = rf_fail(RF_ERR_UNSUPPORTED,
                     "%s/config.json: model_type '%s' is not supported (bert, gpt2, llama)", dir,
                     arch);
    }
    free(text);
    if (rc) {
        free(m->src_config);
        free(m);
        return rc;
    }
    m->owns = true;
    m->heap = true;
    *out = m;
    return RF_OK;
}

void rf_model_free(rf_model *m) {
    if (!m) return;
    if (m->hook) rf_model_set_hook(m, NULL, NULL);
    if (m->owns && m->ops && m->ops->close) (void)m->ops->close(m);
    free(m->src_config);
    m->src_config = NULL;
    if (m->heap) free(m);
}

/* ---- dispatch ---- */

#define NEED(slot)                                                                                 \
    do {                                                                                           \
        if (!m || !m->ops || !m->ops->slot)                                                        \
            return rf_fail(RF_ERR_UNSUPPORTED, "model %s: no '%s'",                                \
                           m && m->ops ? m->ops->name : "(none)", #slot);                          \
    } while (0)

rf_model_info rf_model_info_of(const rf_model *m) {
    rf_model_info i = {0};
    if (!m || !m->ops || !m->ops->info || m->ops->info(m, &i)) {
        rf_error("trainer", "model info: %s", rf_errmsg());
        memset(&i, 0, sizeof i);
    }
    return i;
}

int rf_model_blocks_of(const rf_model *m, rf_model_blocks *out) {
    NEED(blocks);
    return m->ops->blocks(m, out);
}

int rf_model_units(const rf_model *m) {
    return m && m->units > 0 ? m->units : rf_model_info_of(m).units;
}

int rf_model_unit_range(const rf_model *m, int unit, size_t *lo, size_t *hi) {
    NEED(unit_range);
    if (unit < 0 || unit >= rf_model_units(m))
        return rf_fail(RF_ERR_RANGE, "model %s: no unit %d", m->ops->name, unit);
    return m->ops->unit_range(m, unit, lo, hi);
}

int rf_model_bind_unit(rf_model *m, int unit, float *p, float *g) {
    NEED(bind_unit);
    if (unit < 0 || unit >= rf_model_units(m))
        return rf_fail(RF_ERR_RANGE, "model %s: no unit %d", m->ops->name, unit);
    return m->ops->bind_unit(m, unit, p, g);
}

int rf_model_bind_all(rf_model *m) {
    NEED(bind_unit);
    return m->ops->bind_unit(m, -1, NULL, NULL);
}

int rf_model_release_blocks(rf_model *m, bool params) {
    NEED(release_blocks);
    return m->ops->release_blocks(m, params);
}

int rf_model_adopt_params(rf_model *m, const float *host) {
    NEED(adopt_params);
    return m->ops->adopt_params(m, host);
}

int rf_model_enable_training(rf_model *m, size_t padded, size_t moments) {
    NEED(enable_training);
    return m->ops->enable_training(m, padded, moments);
}

int rf_model_zero_grad(rf_model *m) {
    NEED(zero_grad);
    return m->ops->zero_grad(m);
}

int rf_model_set_class_weights(rf_model *m, const float *w) {
    NEED(set_class_weights);
    return m->ops->set_class_weights(m, w);
}

int rf_model_set_hook(rf_model *m, rf_model_hook fn, void *user) {
    NEED(set_hook);
    if (fn && m->hook && (m->hook != fn || m->hook_user != user))
        return rf_fail(RF_ERR_INVALID, "model %s: a unit hook is installed already", m->ops->name);
    m->hook = fn;
    m->hook_user = fn ? user : NULL;
    return m->ops->set_hook(m);
}

static int check_range(const rf_model *m, int u0, int u1) {
    int n = rf_model_units(m);
    if (u0 < 0 || u1 > n || u0 >= u1)
        return rf_fail(RF_ERR_RANGE, "model %s: unit range [%d, %d) outside [0, %d)", m->ops->name,
                       u0, u1, n);
    return RF_OK;
}

int rf_model_replay(rf_model *m, int u0, int u1, bool backward) {
    NEED(replay);
    int rc = check_range(m, u0, u1);
    if (rc) return rc;
    m->r0 = u0;
    m->r1 = u1;
    return m->ops->replay(m, u0, u1, backward);
}

size_t rf_model_boundary(const rf_model *m, int B, int T, int unit) {
    size_t n = 0;
    if (!m || !m->ops || !m->ops->boundary || unit < 1 || unit >= rf_model_units(m) ||
        m->ops->boundary(m, B, T, unit, &n))
        return 0;
    return n;
}

int rf_model_forward_range(rf_model *m, const rf_model_batch *b, int u0, int u1, const float *in,
                           float *out, bool train, uint64_t seed) {
    NEED(forward);
    int rc = check_range(m, u0, u1);
    if (rc) return rc;
    if (!b || b->B < 1 || b->T < 1 || !b->ids)
        return rf_fail(RF_ERR_INVALID, "model %s: empty batch", m->ops->name);
    m->r0 = u0;
    m->r1 = u1;
    return m->ops->forward(m, b, u0, u1, in, out, train, seed);
}

int rf_model_backward_range(rf_model *m, int u0, int u1, const float *dout, float *din,
                            float loss_scale) {
    NEED(backward);
    int rc = check_range(m, u0, u1);
    if (rc) return rc;
    m->r0 = u0;
    m->r1 = u1;
    return m->ops->backward(m, u0, u1, dout, din, loss_scale);
}

int rf_model_forward(rf_model *m, const rf_model_batch *b, bool train, uint64_t seed) {
    return rf_model_forward_range(m, b, 0, rf_model_units(m), NULL, NULL, train, seed);
}

int rf_model_backward(rf_model *m, float loss_scale) {
    return rf_model_backward_range(m, 0, rf_model_units(m), NULL, NULL, loss_scale);
}

int rf_model_loss(const rf_model *m, float *loss, long *counted) {
    NEED(loss);
    return m->ops->loss(m, loss, counted);
}

int rf_model_logits(const rf_model *m, const float **logits, size_t *row) {
    NEED(logits);
    return m->ops->logits(m, logits, row);
}

int rf_model_save(const rf_model *m, const char *dir) {
    NEED(save);
    return m->ops->save(m, dir);
}

int rf_model_sibling(const rf_model *m, rf_model **out) {
    *out = NULL;
    NEED(sibling);
    int rc = m->ops->sibling(m, out);
    if (!rc) {
        (*out)->owns = true;
        (*out)->heap = true;
    }
    return rc;
}
