/* CPU kernels of the optimizer: the gradient norm, clipping and AdamW (see
 * ops.h). Built with -fno-math-errno (module.mk) so sqrtf vectorizes. */
#include <math.h>
#include <omp.h>

#include "trainer/backend.h"
#include "trainer/ops.h"

double rf_op_sumsq(const float *x, size_t n) {
    double part[RF_OP_SUMSQ_CHUNKS];
    size_t per = (n + RF_OP_SUMSQ_CHUNKS - 1) / RF_OP_SUMSQ_CHUNKS;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < RF_OP_SUMSQ_CHUNKS; c++) {
        size_t a = c * per, b = a + per < n ? a + per : n;
        double s = 0;
        for (size_t i = a; i < b; i++)
            s += (double)x[i] * x[i];
        part[c] = s;
    }
    double s = 0;
    for (int c = 0; c < RF_OP_SUMSQ_CHUNKS; c++)
        s += part[c];
    return s;
}

void rf_op_scale(float *x, size_t n, float s) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

/* One range of one tensor, vectorized. */
static void adamw_range(float *restrict p, const float *restrict g, float *restrict m,
                        float *restrict v, size_t n, float decay, float b1, float b2,
                        float step_size, float bc2_sqrt, float eps, float gs) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gs; /* the clipped gradient (gs 1: exactly g[i]) */
        p[i] *= decay;
        m[i] += (1.0f - b1) * (gi - m[i]);
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] -= step_size * m[i] / denom;
    }
}

void rf_op_adamw(float *params, const float *grads, float *mom1, float *mom2, size_t lo, size_t hi,
                 const rf_param_span *spans, size_t nspans, const rf_adamw_hp *hp) {
    float b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr;
    double bc1 = 1.0 - pow(b1, (double)(hp->step + 1)), bc2 = 1.0 - pow(b2, (double)(hp->step + 1));
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    float gs = hp->sumsq ? rf_clip_coef(*hp->sumsq, hp->clip_norm) : 1.0f;
#pragma omp parallel /* one region for all tensors; each thread takes its share of each */
    {
        size_t id = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        for (size_t t = 0; t < nspans; t++) {
            const rf_param_span *ti = &spans[t];
            /* the part of tensor t inside [lo, hi): its decay flag still comes from the tensor */
            size_t a = ti->offset > lo ? ti->offset : lo;
            size_t b = ti->offset + ti->numel < hi ? ti->offset + ti->numel : hi;
            if (a >= b) continue;
            size_t len = b - a, x = len * id / nt, y = len * (id + 1) / nt, off = a + x;
            float decay = ti->decay ? 1.0f - lr * hp->weight_decay : 1.0f;
            adamw_range(params + off, grads + off, mom1 + (off - lo), mom2 + (off - lo), y - x,
                        decay, b1, b2, step_size, bc2_sqrt, hp->eps, gs);
        }
    }
}
