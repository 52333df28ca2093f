#include "trainer/optim.h"

#include <math.h>
#include <omp.h>

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
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < m->nparams; i++)
            g[i] *= coef;
    }
    return norm;
}

/* One range of one tensor, vectorized (sqrtf too: module.mk drops errno for this file). */
static void adamw_range(float *restrict p, const float *restrict g, float *restrict m,
                        float *restrict v, size_t n, float decay, float b1, float b2,
                        float step_size, float bc2_sqrt, float eps) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        p[i] *= decay;
        m[i] += (1.0f - b1) * (g[i] - m[i]);
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] -= step_size * m[i] / denom;
    }
}

void rf_adamw_step(rf_bert *m, const rf_adamw *o, long step, float lr) {
    rf_adamw_step_range(m, o, step, lr, 0, m->nparams, m->m, m->v);
}

void rf_adamw_step_range(rf_bert *m, const rf_adamw *o, long step, float lr, size_t lo, size_t hi,
                         float *mom1, float *mom2) {
    rf_adamw_step_blocks(m, o, step, lr, lo, hi, m->params + lo, m->grads + lo, mom1, mom2);
}

void rf_adamw_step_blocks(const rf_bert *m, const rf_adamw *o, long step, float lr, size_t lo,
                          size_t hi, float *params, const float *grads, float *mom1, float *mom2) {
    /* Same operation order as torch's single-tensor AdamW: bias corrections in
     * double, m by lerp, v by mul + addcmul, then addcdiv. Every element is
     * updated on its own, so a range gives exactly the full update's values. */
    float b1 = o->beta1, b2 = o->beta2;
    double bc1 = 1.0 - pow(b1, (double)(step + 1)), bc2 = 1.0 - pow(b2, (double)(step + 1));
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
#pragma omp parallel /* one region for all tensors; each thread takes its share of each */
    {
        size_t id = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        for (size_t t = 0; t < m->ntensors; t++) {
            const rf_tensor_info *ti = &m->tensors[t];
            /* the part of tensor t inside [lo, hi): a shard may cut it anywhere,
             * and its decay flag still comes from the tensor */
            size_t a = ti->offset > lo ? ti->offset : lo;
            size_t b = ti->offset + ti->numel < hi ? ti->offset + ti->numel : hi;
            if (a >= b) continue;
            size_t len = b - a, x = len * id / nt, y = len * (id + 1) / nt, off = a + x - lo;
            float decay = ti->decay ? 1.0f - lr * o->weight_decay : 1.0f;
            adamw_range(params + off, grads + off, mom1 + off, mom2 + off, y - x, decay, b1, b2,
                        step_size, bc2_sqrt, o->eps);
        }
    }
}
