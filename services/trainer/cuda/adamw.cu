// AdamW on the device; twin of rf_op_adamw (same operation order, the bias
// corrections computed on the host in double as there). A range [lo, hi) of
// the parameters updates with moments of that range only (a ZeRO shard).
// Consecutive tensors with the same decay flag form one launch.
#include <math.h>

#include "trainer/cuda/ops_cuda.cuh"

__global__ static void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n,
                                    float decay, float b1, float b2, float step_size,
                                    float bc2_sqrt, float eps) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i], pi = p[i] * decay, mi = m[i], vi = v[i];
    mi += (1.0f - b1) * (gi - mi);
    vi = b2 * vi + (1.0f - b2) * gi * gi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    pi -= step_size * mi / denom;
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
}

int rf_cu_adamw(const rf_backend *be, float *params, const float *grads, float *mom1, float *mom2,
                size_t lo, size_t hi, const rf_param_span *spans, size_t nspans,
                const rf_adamw_hp *hp) {
    float b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr;
    double bc1 = 1.0 - pow(b1, (double)(hp->step + 1)), bc2 = 1.0 - pow(b2, (double)(hp->step + 1));
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    cudaStream_t s = cu_ctx(be)->stream;
    size_t t = 0;
    while (t < nspans) {
        // a run of tensors with one decay flag, cut to [lo, hi)
        size_t u = t + 1;
        while (u < nspans && spans[u].decay == spans[t].decay &&
               spans[u].offset == spans[u - 1].offset + spans[u - 1].numel)
            u++;
        size_t a = spans[t].offset > lo ? spans[t].offset : lo;
        size_t end = spans[u - 1].offset + spans[u - 1].numel;
        size_t e = end < hi ? end : hi;
        if (a < e) {
            float decay = spans[t].decay ? 1.0f - lr * hp->weight_decay : 1.0f;
            size_t n = e - a;
            adamw_kernel<<<cu_blocks(n, 256), 256, 0, s>>>(params + a, grads + a, mom1 + (a - lo),
                                                           mom2 + (a - lo), n, decay, b1, b2,
                                                           step_size, bc2_sqrt, hp->eps);
            int rc = cu_launched("adamw");
            if (rc) return rc;
        }
        t = u;
    }
    return RF_OK;
}
