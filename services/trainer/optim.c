#include "trainer/optim.h"

#include <math.h>

rf_adamw rf_adamw_defaults(void) {
    return (rf_adamw){.lr = 5e-5f,
                      .beta1 = 0.9f,
                      .beta2 = 0.999f,
                      .eps = 1e-8f,
                      .weight_decay = 0.0f,
                      .warmup_steps = 0,
                      .total_steps = 0,
                      .clip_norm = 1.0f};
}

float rf_adamw_lr(const rf_adamw *o, long step) {
    if (step < o->warmup_steps) return o->lr * (float)step / (float)o->warmup_steps;
    if (o->total_steps <= 0) return o->lr;
    long span = o->total_steps - o->warmup_steps;
    double f = (double)(o->total_steps - step) / (double)(span > 1 ? span : 1);
    return o->lr * (float)(f > 0 ? f : 0);
}

/* Fixed chunking: the same partial sums whatever the thread count. */
#define NORM_CHUNKS 64

float rf_grad_norm(const rf_bert *m) {
    double part[NORM_CHUNKS];
    size_t n = m->nparams, per = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
    const float *g = m->grads;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < NORM_CHUNKS; c++) {
        size_t a = c * per, b = a + per < n ? a + per : n;
        double s = 0;
        for (size_t i = a; i < b; i++)
            s += (double)g[i] * g[i];
        part[c] = s;
    }
    double s = 0;
    for (int c = 0; c < NORM_CHUNKS; c++)
        s += part[c];
    return (float)sqrt(s);
}

float rf_clip_grads(rf_bert *m, float clip_norm) {
    float norm = rf_grad_norm(m);
    if (clip_norm <= 0) return norm;
    float coef = clip_norm / (norm + 1e-6f); /* torch's clip_grad_norm_ formula */
    if (coef < 1.0f) {
        float *g = m->grads;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < m->nparams; i++)
            g[i] *= coef;
    }
    return norm;
}

void rf_adamw_step(rf_bert *m, const rf_adamw *o, long step, float lr) {
    /* Same operation order as torch's single-tensor AdamW: bias corrections in
     * double, m by lerp, v by mul + addcmul, then addcdiv. */
    float b1 = o->beta1, b2 = o->beta2;
    double bc1 = 1.0 - pow(b1, (double)(step + 1)), bc2 = 1.0 - pow(b2, (double)(step + 1));
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
#pragma omp parallel /* one region for all tensors; no barrier between them */
    for (size_t t = 0; t < m->ntensors; t++) {
        const rf_tensor_info *ti = &m->tensors[t];
        float decay = ti->decay ? 1.0f - lr * o->weight_decay : 1.0f;
        float *p = m->params + ti->offset, *g = m->grads + ti->offset, *mm = m->m + ti->offset,
              *vv = m->v + ti->offset;
#pragma omp for schedule(static) nowait
        for (size_t i = 0; i < ti->numel; i++) {
            p[i] *= decay;
            mm[i] += (1.0f - b1) * (g[i] - mm[i]);
            vv[i] = b2 * vv[i] + (1.0f - b2) * g[i] * g[i];
            float denom = sqrtf(vv[i]) / bc2_sqrt + o->eps;
            p[i] -= step_size * mm[i] / denom;
        }
    }
}
