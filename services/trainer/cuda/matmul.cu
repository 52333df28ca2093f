// The linear layer through cuBLAS (the context's one handle, on its stream);
// twin of rf_op_linear_fwd/bwd. Row-major X[r, c] is column-major X^T, so
// each product below is written for the transposes. cuBLAS gives the same
// bits on every run on one GPU model (no atomics mode), so results are
// deterministic. fp32 mode uses
// CUBLAS_PEDANTIC_MATH (backend_cuda.cu): no TF32.
#include "trainer/cuda/ops_cuda.cuh"

// C = op(A) op(B) + beta C in column-major terms, fp32 storage; the compute
// type is the context's: pedantic fp32, or bf16 tensor cores with fp32
// accumulation (cuda-bf16).
static int gemm(rf_cuda_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                const char *what) {
    float one = 1.0f;
    cublasComputeType_t ct = c->bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_PEDANTIC;
    return rf_cublas_check(cublasGemmEx(c->blas, ta, tb, m, n, k, &one, A, CUDA_R_32F, lda, B,
                                        CUDA_R_32F, ldb, &beta, C, CUDA_R_32F, ldc, ct,
                                        CUBLAS_GEMM_DEFAULT),
                           what);
}

__global__ static void bias_rows_kernel(float *out, const float *b, int OC, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] = b[i % OC];
}

int rf_cu_linear_fwd(const rf_backend *be, float *out, const float *inp, const float *w,
                     const float *b, int N, int IC, int OC) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0) return RF_OK;
    float beta = 0.0f;
    if (b) { // out = b, then out += inp w^T, as the CPU twin
        size_t total = (size_t)N * OC;
        bias_rows_kernel<<<cu_blocks(total, 256), 256, 0, c->stream>>>(out, b, OC, total);
        int rc = cu_launched("linear_fwd (bias)");
        if (rc) return rc;
        beta = 1.0f;
    }
    // out^T[OC, N] = w^T... : C(OC x N) = op(A = w, IC x OC)^T * (B = inp^T, IC x N)
    return gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, IC, inp, IC, beta, out, OC,
                "linear_fwd");
}

int rf_cu_linear_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                     const float *inp, const float *w, int N, int IC, int OC) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0) return RF_OK;
    float one = 1.0f;
    int rc;
    // dinp[N, IC] += dout[N, OC] w[OC, IC]: dinp^T (IC x N) = w^T-view (IC x OC) * dout^T (OC x N)
    if (dinp && (rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, IC, dout, OC, 1.0f, dinp, IC,
                           "linear_bwd (input)")))
        return rc;
    // dw[OC, IC] += dout^T inp: dw^T (IC x OC) = inp^T (IC x N) * dout (N x OC)
    if ((rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, IC, dout, OC, 1.0f, dw, IC,
                   "linear_bwd (weights)")))
        return rc;
    if (!db) return RF_OK;
    // db[OC] += dout^T ones[N]: column-major dout^T is OC x N (ld OC)
    if ((rc = rf_cuda_ones(c, (size_t)N))) return rc;
    return rf_cublas_check(
        cublasSgemv(c->blas, CUBLAS_OP_N, OC, N, &one, dout, OC, c->ones, 1, &one, db, 1),
        "linear_bwd (bias)");
}
