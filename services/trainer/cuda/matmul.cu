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
int rf_cu_gemm(rf_cuda_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
               float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C,
               int ldc, const char *what) {
    cublasComputeType_t ct = c->bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_PEDANTIC;
    return rf_cublas_check(cublasGemmEx(c->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B,
                                        CUDA_R_32F, ldb, &beta, C, CUDA_R_32F, ldc, ct,
                                        CUBLAS_GEMM_DEFAULT),
                           what);
}

static int gemm(rf_cuda_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                const char *what) {
    return rf_cu_gemm(c, ta, tb, m, n, k, 1.0f, A, lda, B, ldb, beta, C, ldc, what);
}

__global__ static void bias_rows_kernel(float *out, const float *b, int OC, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] = b[i % OC];
}

// out rows of OC floats, ldo apart, each = b
__global__ static void bias_rows_ld_kernel(float *out, int ldo, const float *b, int OC,
                                           size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[(i / OC) * ldo + i % OC] = b[i % OC];
}

// The linear layer with row strides (tensor parallelism's views; twin of
// rf_op_linear_ld_fwd/bwd): row-major X[r, c] with row stride ld is
// column-major X^T with leading dimension ld, so the strides go straight to
// cuBLAS. linear_fwd/bwd are this with packed rows.
int rf_cu_linear_ld_fwd(const rf_backend *be, float *out, int ldo, const float *inp, int ldi,
                        const float *w, int ldw, const float *b, int N, int IC, int OC) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0 || OC <= 0) return RF_OK;
    float beta = 0.0f;
    if (b) { // out = b, then out += inp w^T, as the CPU twin
        size_t total = (size_t)N * OC;
        bias_rows_ld_kernel<<<cu_blocks(total, 256), 256, 0, c->stream>>>(out, ldo, b, OC, total);
        int rc = cu_launched("linear_fwd (bias)");
        if (rc) return rc;
        beta = 1.0f;
    }
    // out^T[OC, N] = w^T... : C(OC x N) = op(A = w, IC x OC)^T * (B = inp^T, IC x N)
    return gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, ldw, inp, ldi, beta, out, ldo,
                "linear_fwd");
}

int rf_cu_linear_ld_bwd(const rf_backend *be, float *dinp, int lddi, float *dw, int lddw, float *db,
                        const float *dout, int ldd, const float *inp, int ldi, const float *w,
                        int ldw, int N, int IC, int OC) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0 || OC <= 0) return RF_OK; // nothing flows back through no outputs
    float one = 1.0f;
    int rc;
    // dinp[N, IC] += dout[N, OC] w[OC, IC]: dinp^T (IC x N) = w^T-view (IC x OC) * dout^T (OC x N)
    if (IC > 0 && dinp &&
        (rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, ldw, dout, ldd, 1.0f, dinp, lddi,
                   "linear_bwd (input)")))
        return rc;
    // dw[OC, IC] += dout^T inp: dw^T (IC x OC) = inp^T (IC x N) * dout (N x OC);
    // dw NULL: a frozen weight (LoRA's base)
    if (IC > 0 && dw &&
        (rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, ldi, dout, ldd, 1.0f, dw, lddw,
                   "linear_bwd (weights)")))
        return rc;
    if (!db) return RF_OK;
    // db[OC] += dout^T ones[N]: column-major dout^T is OC x N (ld ldd)
    if ((rc = rf_cuda_ones(c, (size_t)N))) return rc;
    return rf_cublas_check(
        cublasSgemv(c->blas, CUBLAS_OP_N, OC, N, &one, dout, ldd, c->ones, 1, &one, db, 1),
        "linear_bwd (bias)");
}

int rf_cu_linear_fwd(const rf_backend *be, float *out, const float *inp, const float *w,
                     const float *b, int N, int IC, int OC) {
    return rf_cu_linear_ld_fwd(be, out, OC, inp, IC, w, IC, b, N, IC, OC);
}

int rf_cu_linear_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                     const float *inp, const float *w, int N, int IC, int OC) {
    return rf_cu_linear_ld_bwd(be, dinp, IC, dw, IC, db, dout, OC, inp, IC, w, IC, N, IC, OC);
}

// Hugging Face's Conv1D (GPT-2), twin of rf_op_conv1d_fwd/bwd: the weight is
// stored [IC, OC], which column-major reads as w^T (OC x IC, ld OC).
int rf_cu_conv1d_fwd(const rf_backend *be, float *out, const float *inp, const float *w,
                     const float *b, int N, int IC, int OC) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0 || OC <= 0) return RF_OK;
    float beta = 0.0f;
    if (b) { // out = b, then out += inp w, as the CPU twin
        size_t total = (size_t)N * OC;
        bias_rows_kernel<<<cu_blocks(total, 256), 256, 0, c->stream>>>(out, b, OC, total);
        int rc = cu_launched("conv1d_fwd (bias)");
        if (rc) return rc;
        beta = 1.0f;
    }
    // out^T (OC x N) = w^T (OC x IC, ld OC) * inp^T (IC x N, ld IC)
    return gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, OC, N, IC, w, OC, inp, IC, beta, out, OC,
                "conv1d_fwd");
}

int rf_cu_conv1d_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                     const float *inp, const float *w, int N, int IC, int OC) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0) return RF_OK;
    float one = 1.0f;
    int rc;
    // dinp[N, IC] += dout[N, OC] w^T: dinp^T (IC x N) = (w^T)^T (IC x OC) * dout^T (OC x N)
    if (dinp && (rc = gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, IC, N, OC, w, OC, dout, OC, 1.0f, dinp, IC,
                           "conv1d_bwd (input)")))
        return rc;
    // dw[IC, OC] += inp^T dout: dw^T (OC x IC, ld OC) = dout^T (OC x N) * inp (N x IC)
    if (dw && (rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, OC, IC, N, dout, OC, inp, IC, 1.0f, dw, OC,
                         "conv1d_bwd (weights)")))
        return rc;
    if (!db) return RF_OK;
    if ((rc = rf_cuda_ones(c, (size_t)N))) return rc;
    return rf_cublas_check(
        cublasSgemv(c->blas, CUBLAS_OP_N, OC, N, &one, dout, OC, c->ones, 1, &one, db, 1),
        "conv1d_bwd (bias)");
}

// The tied LM head, twin of rf_op_lm_head_fwd/bwd: the linear layer without a
// bias on wte[V, C]; dh and dwte may each be NULL.
int rf_cu_lm_head_fwd(const rf_backend *be, float *logits, const float *h, const float *wte, int N,
                      int C, int V) {
    return rf_cu_linear_fwd(be, logits, h, wte, NULL, N, C, V);
}

int rf_cu_lm_head_bwd(const rf_backend *be, float *dh, float *dwte, const float *dlogits,
                      const float *h, const float *wte, int N, int C, int V) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0) return RF_OK;
    int rc;
    // dh^T (C x N) += wte^T-view (C x V, ld C) * dlogits^T (V x N, ld V)
    if (dh && (rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, C, N, V, wte, C, dlogits, V, 1.0f, dh, C,
                         "lm_head_bwd (input)")))
        return rc;
    // dwte^T (C x V) += h^T (C x N, ld C) * dlogits (N x V)
    if (dwte && (rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, C, V, N, h, C, dlogits, V, 1.0f, dwte, C,
                           "lm_head_bwd (weights)")))
        return rc;
    return RF_OK;
}
