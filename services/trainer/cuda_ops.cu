// CUDA kernels twinned with ops.c; compiled only with CUDA=1.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/error.h"
#include "trainer/cuda_ops.h"

static int cuda_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return RF_OK;
    return rf_fail(RF_ERR_INTERNAL, "cuda: %s: %s", what, cudaGetErrorString(e));
}

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

extern "C" int rf_cuda_gelu_fwd(float *out, const float *inp, size_t n) {
    if (n == 0) return RF_OK;
    gelu_fwd_kernel<<<(unsigned)((n + 255) / 256), 256>>>(out, inp, n);
    return cuda_check(cudaGetLastError(), "gelu_fwd");
}

extern "C" int rf_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
    if (n == 0) return RF_OK;
    gelu_bwd_kernel<<<(unsigned)((n + 255) / 256), 256>>>(dinp, inp, dout, n);
    return cuda_check(cudaGetLastError(), "gelu_bwd");
}

__global__ static void bias_rows_kernel(float *out, const float *b, int N, int OC) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)N * OC) out[i] = b[i % OC];
}

extern "C" int rf_cuda_linear_fwd(float *out, const float *inp, const float *w, const float *b,
                                  int N, int IC, int OC) {
    static cublasHandle_t handle;
    if (!handle && cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS)
        return rf_fail(RF_ERR_INTERNAL, "cuda: cublasCreate failed");
    float alpha = 1.0f, beta = 0.0f;
    if (b) {
        size_t n = (size_t)N * OC;
        bias_rows_kernel<<<(unsigned)((n + 255) / 256), 256>>>(out, b, N, OC);
        int rc = cuda_check(cudaGetLastError(), "bias");
        if (rc) return rc;
        beta = 1.0f;
    }
    // Row-major out[N,OC] = inp[N,IC] w^T is column-major out^T[OC,N] = w[OC,IC]... :
    // in cuBLAS terms C(OC x N) = op(A) * B with A = w (stored IC x OC col-major, transposed)
    // and B = inp (IC x N col-major).
    cublasStatus_t s = cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &alpha, w, IC, inp,
                                   IC, &beta, out, OC);
    if (s != CUBLAS_STATUS_SUCCESS) return rf_fail(RF_ERR_INTERNAL, "cuda: sgemm failed (%d)", s);
    return RF_OK;
}
