// The pooler's tanh; twin of rf_op_tanh_fwd/bwd.
#include "trainer/cuda/ops_cuda.cuh"

__global__ static void tanh_fwd_kernel(float *out, const float *inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tanhf(inp[i]);
}

__global__ static void tanh_bwd_kernel(float *dinp, const float *out, const float *dout, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dinp[i] += dout[i] * (1.0f - out[i] * out[i]);
}

int rf_cu_tanh_fwd(const rf_backend *be, float *out, const float *inp, size_t n) {
    if (!n) return RF_OK;
    tanh_fwd_kernel<<<cu_blocks(n, 256), 256, 0, cu_ctx(be)->stream>>>(out, inp, n);
    return cu_launched("tanh_fwd");
}

int rf_cu_tanh_bwd(const rf_backend *be, float *dinp, const float *out, const float *dout,
                   size_t n) {
    if (!n) return RF_OK;
    tanh_bwd_kernel<<<cu_blocks(n, 256), 256, 0, cu_ctx(be)->stream>>>(dinp, out, dout, n);
    return cu_launched("tanh_bwd");
}
