/* The optimizer on the model's blocks, all math through the backend's slots
 * (sumsq, scale, adamw): the CPU kernels are in ops_optim.c, the CUDA ones in
 * cuda/adamw.cu and cuda/norm.cu. */
#include "trainer/optim.h"

#include <math.h>
#include <stdlib.h>

#include "common/error.h"
#include "common/log.h"
#include "trainer/ops.h"

float rf_adamw_lr(const rf_adamw *o, long step) {
    if (step < o->warmup_steps) return o->lr * (float)step / (float)o->warmup_steps;
    if (o->total_steps <= 0) return o->lr;
    long span = o->total_steps - o->warmup_steps;
    double f = (double)(o->total_steps - step) / (double)(span > 1 ? span : 1);
    return o->lr * (float)(f > 0 ? f : 0);
}

/* The gradients' sum of squares into *ss and the norm into *norm (NaN on
 * failure). */
static int grad_norm(const rf_model_blocks *m, double *ss, float *norm) {
    *ss = 0;
    int rc = m->be->sumsq(m->be, ss, m->grads, m->nparams);
    *norm = rc ? NAN : (float)sqrt(*ss);
    return rc;
}

int rf_grad_norm_ex(const rf_bert *m, float *norm) {
    rf_model_blocks b = rf_bert_blocks(m);
    double ss;
    return grad_norm(&b, &ss, norm);
}

float rf_grad_norm(const rf_bert *m) {
    float norm;
    if (rf_grad_norm_ex(m, &norm)) rf_error("trainer", "gradient norm: %s", rf_errmsg());
    return norm;
}

int rf_clip_grads_ex(rf_bert *m, float clip_norm, float *norm) {
    rf_model_blocks b = rf_bert_blocks(m);
    return rf_optim_clip(&b, clip_norm, norm);
}

int rf_optim_clip(const rf_model_blocks *m, float clip_norm, float *norm) {
    double ss;
    int rc = grad_norm(m, &ss, norm);
    float coef = rc ? 1.0f : rf_clip_coef(ss, clip_norm);
    if (coef < 1.0f) rc = m->be->scale(m->be, m->grads, m->nparams, coef);
    return rc;
}

float rf_clip_grads(rf_bert *m, float clip_norm) {
    float norm;
    if (rf_clip_grads_ex(m, clip_norm, &norm)) rf_error("trainer", "clipping: %s", rf_errmsg());
    return norm;
}

int rf_adamw_update(rf_bert *m, const rf_adamw *o, long step, float lr, size_t lo, size_t hi,
                    float *mom1, float *mom2) {
    rf_model_blocks b = rf_bert_blocks(m);
    return rf_optim_adamw(&b, o, step, lr, lo, hi, mom1, mom2);
}

/* AdamW on [lo, hi) of the model's blocks, clipping with the sum of squares
 * *ss in backend memory (NULL: none). */
static int adamw_blocks(const rf_model_blocks *m, const rf_adamw *o, long step, float lr, size_t lo,
                        size_t hi, float *mom1, float *mom2, const double *ss) {
    rf_param_span *spans = malloc(m->ntensors * sizeof *spans);
    if (!spans) return rf_fail(RF_ERR_NOMEM, "adamw: no memory for %zu spans", m->ntensors);
    for (size_t t = 0; t < m->ntensors; t++)
        spans[t] = (rf_param_span){m->tensors[t].offset, m->tensors[t].numel, m->tensors[t].decay};
    rf_adamw_hp hp = {lr, o->beta1, o->beta2, o->eps, o->weight_decay, step, ss, o->clip_norm};
    int rc = m->be->adamw(m->be, m->params, m->grads, mom1, mom2, lo, hi, spans, m->ntensors, &hp);
    free(spans);
    return rc;
}

int rf_optim_adamw(const rf_model_blocks *m, const rf_adamw *o, long step, float lr, size_t lo,
                   size_t hi, float *mom1, float *mom2) {
    return adamw_blocks(m, o, step, lr, lo, hi, mom1, mom2, NULL);
}

int rf_optim_clipped_adamw(const rf_model_blocks *m, const rf_adamw *o, long step, float lr,
                           size_t lo, size_t hi, double *ss, float *norm) {
    *norm = NAN;
    const rf_backend *be = m->be;
    rf_param_span all = {0, m->nparams, false};
    int rc = be->sumsq_into(be, ss, m->grads, &all, 1);
    if (!rc) rc = adamw_blocks(m, o, step, lr, lo, hi, m->m, m->v, o->clip_norm > 0 ? ss : NULL);
    double host;
    if (!rc) rc = be->to_host(be, &host, ss, sizeof host);
    if (!rc) *norm = (float)sqrt(host);
    return rc;
}

void rf_adamw_step(rf_bert *m, const rf_adamw *o, long step, float lr) {
    rf_adamw_step_range(m, o, step, lr, 0, m->nparams, m->m, m->v);
}

void rf_adamw_step_range(rf_bert *m, const rf_adamw *o, long step, float lr, size_t lo, size_t hi,
                         float *mom1, float *mom2) {
    if (rf_adamw_update(m, o, step, lr, lo, hi, mom1, mom2))
        rf_error("trainer", "adamw: %s", rf_errmsg());
}

int rf_adamw_step_blocks(const rf_bert *m, const rf_adamw *o, long step, float lr, size_t lo,
                         size_t hi, float *params, const float *grads, float *mom1, float *mom2) {
    rf_model_blocks b = rf_bert_blocks(m);
    return rf_optim_adamw_pieces(&b, o, step, lr, lo, hi, params, grads, mom1, mom2, NULL);
}

int rf_optim_adamw_pieces(const rf_model_blocks *m, const rf_adamw *o, long step, float lr,
                          size_t lo, size_t hi, float *params, const float *grads, float *mom1,
                          float *mom2, const double *ss) {
    /* The backend's adamw indexes params/grads by absolute offset and the
     * moments from lo; here all four start at lo, so the spans are moved to the
     * range's own coordinates (each cut to [lo, hi), keeping its decay flag). */
    rf_param_span *spans = malloc(m->ntensors * sizeof *spans);
    if (!spans) return rf_fail(RF_ERR_NOMEM, "adamw: no memory for %zu spans", m->ntensors);
    size_t n = 0;
    for (size_t t = 0; t < m->ntensors; t++) {
        const rf_tensor_info *ti = &m->tensors[t];
        size_t a = ti->offset > lo ? ti->offset : lo;
        size_t b = ti->offset + ti->numel < hi ? ti->offset + ti->numel : hi;
        if (a < b) spans[n++] = (rf_param_span){a - lo, b - a, ti->decay};
    }
    rf_adamw_hp hp = {
        lr, o->beta1, o->beta2, o->eps, o->weight_decay, step, ss, ss ? o->clip_norm : 0};
    int rc = m->be->adamw(m->be, params, grads, mom1, mom2, 0, hi - lo, spans, n, &hp);
    free(spans);
    return rc;
}
