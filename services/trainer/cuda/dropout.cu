// Seeded dropout and BERT's residual adds; twins of rf_op_dropout_* and
// rf_op_residual_*. The mask of element i is rf_keep(seed, i, p), the hash of
// ops.c, so both devices drop exactly the same elements (no cuRAND state).
// Products go through __fmul_rn: nvcc would otherwise contract x * s + y into
// one FMA, and the results would differ from the CPU's (a multiply, then an
// add) in the last bit.
#include "trainer/cuda/ops_cuda.cuh"

__global__ static void dropout_fwd_kernel(float *out, const float *inp, size_t n, float p,
                                          uint64_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = 1.0f / (1.0f - p);
    out[i] = rf_keep(seed, i, p) ? inp[i] * s : 0.0f;
}

__global__ static void dropout_bwd_kernel(float *dinp, const float *dout, size_t n, float p,
                                          uint64_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
    if (p <= 0 || rf_keep(seed, i, p)) dinp[i] += __fmul_rn(dout[i], s);
}

int rf_cu_dropout_fwd(const rf_backend *be, float *out, const float *inp, size_t n, float p,
                      uint64_t seed) {
    if (!n) return RF_OK;
    cudaStream_t s = cu_ctx(be)->stream;
    if (p <= 0) {
        if (out == inp) return RF_OK;
        return rf_cuda_check(
            cudaMemcpyAsync(out, inp, n * sizeof(float), cudaMemcpyDeviceToDevice, s), "dropout");
    }
    dropout_fwd_kernel<<<cu_blocks(n, 256), 256, 0, s>>>(out, inp, n, p, seed);
    return cu_launched("dropout_fwd");
}

int rf_cu_dropout_bwd(const rf_backend *be, float *dinp, const float *dout, size_t n, float p,
                      uint64_t seed) {
    if (!n) return RF_OK;
    dropout_bwd_kernel<<<cu_blocks(n, 256), 256, 0, cu_ctx(be)->stream>>>(dinp, dout, n, p, seed);
    return cu_launched("dropout_bwd");
}

__global__ static void residual_fwd_kernel(float *out, const float *a, const float *b, size_t n,
                                           float p, uint64_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
    out[i] = (p <= 0 ? a[i] : rf_keep(seed, i, p) ? __fmul_rn(a[i], s) : 0.0f) + b[i];
}

__global__ static void residual_bwd_kernel(float *da, float *db, const float *dout, size_t n,
                                           float p, uint64_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
    if (p <= 0 || rf_keep(seed, i, p)) da[i] += __fmul_rn(dout[i], s);
    if (db) db[i] += dout[i];
}

int rf_cu_residual_fwd(const rf_backend *be, float *out, const float *a, const float *b, size_t n,
                       float p, uint64_t seed) {
    if (!n) return RF_OK;
    residual_fwd_kernel<<<cu_blocks(n, 256), 256, 0, cu_ctx(be)->stream>>>(out, a, b, n, p, seed);
    return cu_launched("residual_fwd");
}

int rf_cu_residual_bwd(const rf_backend *be, float *da, float *db, const float *dout, size_t n,
                       float p, uint64_t seed) {
    if (!n) return RF_OK;
    residual_bwd_kernel<<<cu_blocks(n, 256), 256, 0, cu_ctx(be)->stream>>>(da, db, dout, n, p,
                                                                           seed);
    return cu_launched("residual_bwd");
}
