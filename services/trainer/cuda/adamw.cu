// AdamW on the device; twin of rf_op_adamw (same operation order, the bias
// corrections computed on the host in double as there). A range [lo, hi) of
// the parameters updates with moments of that range only (a ZeRO shard).
// Consecutive tensors with the same decay flag form one run; up to
// ADAMW_RUNS runs a launch. Each element's arithmetic is the CPU's.
#include <math.h>

#include "trainer/cuda/ops_cuda.cuh"
#include "trainer/ops.h"

// Runs of the range, at most ADAMW_RUNS a launch, passed by value (a kernel's
// parameters may take 4 KiB): run k updates elements [off, off + n) with its
// decay factor, and starts at `at` in the runs' concatenation. One launch
// covers a whole BERT layer's tensors (weights decay, biases and norms do
// not: about 16 runs a layer) where a launch per run made ~200 a step.
#define ADAMW_RUNS 48
struct adamw_runs {
    size_t off[ADAMW_RUNS], at[ADAMW_RUNS];
    float decay[ADAMW_RUNS];
    size_t total; // elements in all the runs
    int n;
};

// One thread an element: the run holding concatenation index i (the last
// starting at or before it), then the update of rf_op_adamw, in its order.
// Moments are indexed from lo (a shard's own).
// ss: the gradient's sum of squares in device memory (NULL: no clipping),
// whose coefficient (rf_clip_coef, ops.h) each thread computes.
__global__ static void adamw_kernel(float *p, const float *g, float *m, float *v, size_t lo,
                                    adamw_runs r, float b1, float b2, float step_size,
                                    float bc2_sqrt, float eps, const double *ss, float clip) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= r.total) return;
    float gs = ss ? rf_clip_coef(*ss, clip) : 1.0f;
    int a = 0, b = r.n - 1;
    while (a < b) {
        int mid = (a + b + 1) / 2;
        if (r.at[mid] <= i)
            a = mid;
        else
            b = mid - 1;
    }
    size_t e = r.off[a] + (i - r.at[a]), k = e - lo;
    // the clipped gradient rounded on its own, as the CPU's (times 1: exactly g)
    float gi = __fmul_rn(g[e], gs), pi = p[e] * r.decay[a], mi = m[k], vi = v[k];
    mi += (1.0f - b1) * (gi - mi);
    vi = b2 * vi + (1.0f - b2) * gi * gi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    pi -= step_size * mi / denom;
    p[e] = pi;
    m[k] = mi;
    v[k] = vi;
}

int rf_cu_adamw(const rf_backend *be, float *params, const float *grads, float *mom1, float *mom2,
                size_t lo, size_t hi, const rf_param_span *spans, size_t nspans,
                const rf_adamw_hp *hp) {
    float b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr;
    double bc1 = 1.0 - pow(b1, (double)(hp->step + 1)), bc2 = 1.0 - pow(b2, (double)(hp->step + 1));
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    cudaStream_t s = cu_ctx(be)->stream;
    adamw_runs r;
    r.n = 0;
    r.total = 0;
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
            r.off[r.n] = a;
            r.at[r.n] = r.total;
            r.decay[r.n] = spans[t].decay ? 1.0f - lr * hp->weight_decay : 1.0f;
            r.total += e - a;
            r.n++;
        }
        t = u;
        if (r.n == ADAMW_RUNS || (t == nspans && r.n > 0)) {
            adamw_kernel<<<cu_blocks(r.total, 256), 256, 0, s>>>(params, grads, mom1, mom2, lo, r,
                                                                 b1, b2, step_size, bc2_sqrt,
                                                                 hp->eps, hp->sumsq, hp->clip_norm);
            int rc = cu_launched("adamw");
            if (rc) return rc;
            r.n = 0;
            r.total = 0;
        }
    }
    return RF_OK;
}
