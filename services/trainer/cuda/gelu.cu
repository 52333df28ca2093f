// GELU: the exact erf form (BERT's "gelu"), twin of rf_op_gelu_fwd/bwd, and
// the tanh approximation (GPT-2's "gelu_new"), twin of rf_op_gelu_tanh_fwd/bwd.
#include "trainer/cuda/ops_cuda.cuh"

__global__ static void gelu_fwd_kernel(float *out, const float *inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * 0.70710678118654752f));
}

__global__ static void gelu_bwd_kernel(float *dinp, const float *inp, const float *dout, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    float pdf = 0.3989422804014327f * expf(-0.5f * x * x);
    dinp[i] += dout[i] * (cdf + x * pdf); // accumulates, as the CPU twin
}

int rf_cu_gelu_fwd(const rf_backend *be, float *out, const float *inp, size_t n) {
    if (!n) return RF_OK;
    gelu_fwd_kernel<<<cu_blocks(n, 256), 256, 0, cu_ctx(be)->stream>>>(out, inp, n);
    return cu_launched("gelu_fwd");
}

int rf_cu_gelu_bwd(const rf_backend *be, float *dinp, const float *inp, const float *dout,
                   size_t n) {
    if (!n) return RF_OK;
    gelu_bwd_kernel<<<cu_blocks(n, 256), 256, 0, cu_ctx(be)->stream>>>(dinp, inp, dout, n);
    return cu_launched("gelu_bwd");
}

// GELU with the tanh approximation (GPT-2's "gelu_new"); twin of
// rf_op_gelu_tanh_fwd/bwd (ops_causal.c).
#define GELU_K 0.7978845608028654f // sqrt(2/pi)

__global__ static void gelu_tanh_fwd_kernel(float *out, const float *inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
}

__global__ static void gelu_tanh_bwd_kernel(float *dinp, const float *inp, const float *dout,
                                            size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    float t = tanhf(GELU_K * (x + 0.044715f * x * x * x));
    float dt = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dt);
}

int rf_cu_gelu_tanh_fwd(const rf_backend *be, float *out, const float *inp, size_t n) {
    if (!n) return RF_OK;
    gelu_tanh_fwd_kernel<<<cu_blocks(n, 256), 256, 0, cu_ctx(be)->stream>>>(out, inp, n);
    return cu_launched("gelu_tanh_fwd");
}

int rf_cu_gelu_tanh_bwd(const rf_backend *be, float *dinp, const float *inp, const float *dout,
                        size_t n) {
    if (!n) return RF_OK;
    gelu_tanh_bwd_kernel<<<cu_blocks(n, 256), 256, 0, cu_ctx(be)->stream>>>(dinp, inp, dout, n);
    return cu_launched("gelu_tanh_bwd");
}
