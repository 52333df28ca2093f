// SwiGLU over a fused gate | up buffer; twin of rf_op_swiglu_fwd/bwd
// (ops_causal.c). Elementwise: a thread per output element, backward
// accumulates into both halves of dgu.
#include "trainer/cuda/ops_cuda.cuh"

__device__ __forceinline__ static float sigmoidf_(float x) {
    return 1.0f / (1.0f + expf(-x));
}

__global__ static void swiglu_fwd_kernel(float *out, const float *gu, int F, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / F, k = i % F;
    float g = gu[n * 2 * F + k], u = gu[n * 2 * F + F + k];
    out[i] = g * sigmoidf_(g) * u;
}

__global__ static void swiglu_bwd_kernel(float *dgu, const float *dout, const float *gu, int F,
                                         size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / F, k = i % F, gi = n * 2 * F + k, ui = gi + F;
    float g = gu[gi], u = gu[ui], d = dout[i], sg = sigmoidf_(g);
    dgu[gi] += d * u * sg * (1.0f + g * (1.0f - sg));
    dgu[ui] += d * g * sg;
}

int rf_cu_swiglu_fwd(const rf_backend *be, float *out, const float *gu, int N, int F) {
    if (N <= 0 || F <= 0) return RF_OK;
    size_t total = (size_t)N * F;
    swiglu_fwd_kernel<<<cu_blocks(total, 256), 256, 0, cu_ctx(be)->stream>>>(out, gu, F, total);
    return cu_launched("swiglu_fwd");
}

int rf_cu_swiglu_bwd(const rf_backend *be, float *dgu, const float *dout, const float *gu, int N,
                     int F) {
    if (N <= 0 || F <= 0) return RF_OK;
    size_t total = (size_t)N * F;
    swiglu_bwd_kernel<<<cu_blocks(total, 256), 256, 0, cu_ctx(be)->stream>>>(dgu, dout, gu, F,
                                                                             total);
    return cu_launched("swiglu_bwd");
}
