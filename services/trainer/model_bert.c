/* The BERT classifier (model.h) as an rf_model (model_iface.h): each slot is
 * one rf_bert_* call, so the arithmetic is model.c's, bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"
#include "trainer/bert_config.h"
#include "trainer/model_iface.h"
#include "trainer/model_tp.h"

#define BERT(m) ((rf_bert *)(m)->impl)

static int bert_close(rf_model *m) {
    rf_bert_free(BERT(m));
    m->impl = NULL;
    return RF_OK;
}

static int bert_info(const rf_model *m, rf_model_info *o) {
    const rf_bert_config *c = &BERT(m)->cfg;
    *o = (rf_model_info){.arch = "bert",
                         .task = RF_TASK_CLASSIFY,
                         .units = rf_bert_units(BERT(m)),
                         .layers = c->num_layers,
                         .hidden = c->hidden_size,
                         .vocab = c->vocab_size,
                         .max_positions = c->max_position,
                         .num_labels = c->num_labels,
                         .eos_token_id = -1,
                         .tied = false};
    return RF_OK;
}

rf_model_blocks rf_bert_blocks(const rf_bert *b) {
    return (rf_model_blocks){b->be,       b->tensors, b->ntensors, b->nparams, b->npadded,
                             b->nmoments, b->params,  b->grads,    b->m,       b->v};
}

static int bert_blocks(const rf_model *m, rf_model_blocks *o) {
    *o = rf_bert_blocks(BERT(m));
    return RF_OK;
}

static int bert_unit_range(const rf_model *m, int u, size_t *lo, size_t *hi) {
    rf_bert_unit_range(BERT(m), u, lo, hi);
    return RF_OK;
}

static int bert_bind_unit(rf_model *m, int u, float *p, float *g) {
    if (u < 0)
        rf_bert_bind_all(BERT(m));
    else
        rf_bert_bind_unit(BERT(m), u, p, g);
    return RF_OK;
}

static int bert_release(rf_model *m, bool params) {
    rf_bert_release_blocks(BERT(m), params);
    return RF_OK;
}

static int bert_adopt(rf_model *m, const float *host) {
    return rf_bert_adopt_params(BERT(m), host);
}

static int bert_enable(rf_model *m, size_t padded, size_t moments) {
    return rf_bert_enable_training_sharded(BERT(m), padded, moments);
}

static int bert_zero_grad(rf_model *m) {
    return rf_bert_zero_grad(BERT(m));
}

static int bert_class_weights(rf_model *m, const float *w) {
    return rf_bert_set_class_weights(BERT(m), w);
}

/* model.c's hook (rf_unit_hook) -> the rf_model's, with the prefetch hint:
 * the next unit of the pass inside the range in progress. */
static int bert_trampoline(void *user, rf_bert *b, int u, rf_unit_event ev) {
    (void)b;
    rf_model *m = user;
    int next = ev == RF_UNIT_FWD   ? (u + 1 < m->r1 ? u + 1 : -1)
               : ev == RF_UNIT_BWD ? (u - 1 >= m->r0 ? u - 1 : -1)
                                   : -1;
    return m->hook ? m->hook(m->hook_user, u, ev, next) : RF_OK;
}

static int bert_set_hook(rf_model *m) {
    rf_bert *b = BERT(m);
    b->unit_hook = m->hook ? bert_trampoline : NULL;
    b->unit_user = m->hook ? m : NULL;
    return RF_OK;
}

static int bert_replay(rf_model *m, int u0, int u1, bool backward) {
    rf_bert *b = BERT(m);
    for (int u = u0; u < u1; u++) {
        int rc = bert_trampoline(m, b, u, RF_UNIT_FWD);
        if (rc) return rc;
    }
    for (int u = u1 - 1; backward && u >= u0; u--) {
        int rc = bert_trampoline(m, b, u, RF_UNIT_BWD);
        if (!rc) rc = bert_trampoline(m, b, u, RF_UNIT_BWD_DONE);
        if (rc) return rc;
    }
    return RF_OK;
}

static int bert_boundary(const rf_model *m, int B, int T, int u, size_t *n) {
    *n = rf_bert_boundary_floats(BERT(m), B, T, u);
    return RF_OK;
}

static int bert_forward(rf_model *m, const rf_model_batch *b, int u0, int u1, const float *in,
                        float *out, bool train, uint64_t seed) {
    if (!b->types || !b->valid)
        return rf_fail(RF_ERR_INVALID, "bert: the batch needs token types and a mask");
    rf_batch bt = {b->B, b->T, b->ids, b->types, b->labels, b->valid};
    m->counted = 0;
    for (int i = 0; b->labels && i < b->B; i++)
        m->counted += b->labels[i] >= 0;
    return rf_bert_forward_range(BERT(m), &bt, train, seed, u0, u1, in, out);
}

static int bert_backward(rf_model *m, int u0, int u1, const float *dout, float *din, float scale) {
    return rf_bert_backward_range(BERT(m), scale, u0, u1, dout, din);
}

static int bert_loss(const rf_model *m, float *loss, long *counted) {
    *loss = BERT(m)->loss;
    *counted = m->counted;
    return RF_OK;
}

static int bert_logits(const rf_model *m, const float **logits, size_t *row) {
    *logits = BERT(m)->logits;
    *row = (size_t)BERT(m)->cfg.num_labels;
    return RF_OK;
}

static int bert_save(const rf_model *m, const char *dir) {
    char path[4096];
    rf_buf cfg = RF_BUF_INIT;
    int rc = rf_bert_config_to_json(&BERT(m)->cfg, &cfg);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = rf_write_file_atomic(path, cfg.data, cfg.len);
    rf_buf_free(&cfg);
    if (rc) return rf_fail_ctx(rc, "export: cannot write %s", path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return rf_bert_save_safetensors(BERT(m), path);
}

static int bert_sibling(const rf_model *m, rf_model **out) {
    const rf_bert *b = BERT(m);
    rf_bert *s;
    int rc = rf_bert_new(&b->cfg, b->be, &s);
    if (rc) return rc;
    if (b->tp && (rc = rf_bert_tp_split(s, b->tp->c, b->tp->dev))) {
        rf_bert_free(s);
        return rc;
    }
    rf_model *o = malloc(sizeof *o);
    if (!o) {
        rf_bert_free(s);
        return RF_ERR_NOMEM;
    }
    rf_model_init_bert(o, s);
    *out = o;
    return RF_OK;
}

static const rf_model_ops bert_ops = {
    .name = "bert",
    .close = bert_close,
    .info = bert_info,
    .blocks = bert_blocks,
    .unit_range = bert_unit_range,
    .bind_unit = bert_bind_unit,
    .release_blocks = bert_release,
    .adopt_params = bert_adopt,
    .enable_training = bert_enable,
    .zero_grad = bert_zero_grad,
    .set_class_weights = bert_class_weights,
    .set_hook = bert_set_hook,
    .replay = bert_replay,
    .boundary = bert_boundary,
    .forward = bert_forward,
    .backward = bert_backward,
    .loss = bert_loss,
    .logits = bert_logits,
    .save = bert_save,
    .sibling = bert_sibling,
};

void rf_model_init_bert(rf_model *m, rf_bert *b) {
    memset(m, 0, sizeof *m);
    m->ops = &bert_ops;
    m->impl = b;
    m->r1 = m->units = rf_bert_units(b);
    m->eos = -1;
}
