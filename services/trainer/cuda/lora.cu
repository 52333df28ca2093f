// One LoRA adapter through cuBLAS (the context's handle, on its stream); twin
// of rf_op_lora_fwd/bwd (lora.c): u = drop(x) A^T, out += s u B^T, and the
// backward's du, dB, dA, dx. Row-major X[r, c] is column-major X^T, so each
// product is written for the transposes (as matmul.cu). The dropout masks
// are dropout.cu's (the hash of ops.c), regenerated in backward. No atomics:
// cuBLAS products are deterministic on one GPU model.
#include "trainer/cuda/ops_cuda.cuh"

int rf_cu_lora_fwd(const rf_backend *be, float *out, int ldo, float *u, float *xd, const float *x,
                   const float *A, const float *B, int N, int IC, int OC, int r, float scale,
                   float p, uint64_t seed) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0) return RF_OK;
    const float *in = x;
    int rc;
    if (p > 0) {
        if ((rc = rf_cu_dropout_fwd(be, xd, x, (size_t)N * IC, p, seed))) return rc;
        in = xd;
    }
    // u^T (r x N) = A (col-major IC x r)^T * in^T (IC x N)
    if ((rc = rf_cu_gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, r, N, IC, 1.0f, A, IC, in, IC, 0.0f, u, r,
                         "lora_fwd (u)")))
        return rc;
    // out^T (OC x N, ld ldo) += s B (col-major r x OC)^T * u^T (r x N)
    return rf_cu_gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, r, scale, B, r, u, r, 1.0f, out, ldo,
                      "lora_fwd (out)");
}

int rf_cu_lora_bwd(const rf_backend *be, float *dx, float *dA, float *dB, float *du, float *xd,
                   const float *dout, int ldo, const float *x, const float *u, const float *A,
                   const float *B, int N, int IC, int OC, int r, float scale, float p,
                   uint64_t seed) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0) return RF_OK;
    int rc;
    // du = s dout B: du^T (r x N) = B (col-major r x OC) * dout^T (OC x N, ld ldo)
    if ((rc = rf_cu_gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, r, N, OC, scale, B, r, dout, ldo, 0.0f, du, r,
                         "lora_bwd (du)")))
        return rc;
    // dB += s dout^T u: dB^T (r x OC) = u^T (r x N) * dout (N x OC: dout^T transposed)
    if ((rc = rf_cu_gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, r, OC, N, scale, u, r, dout, ldo, 1.0f, dB, r,
                         "lora_bwd (dB)")))
        return rc;
    const float *in = x;
    if (p > 0) { // the forward's drop(x) again
        if ((rc = rf_cu_dropout_fwd(be, xd, x, (size_t)N * IC, p, seed))) return rc;
        in = xd;
    }
    // dA += du^T in: dA^T (IC x r) = in^T (IC x N) * du (N x r: du^T transposed)
    if ((rc = rf_cu_gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, IC, r, N, 1.0f, in, IC, du, r, 1.0f, dA, IC,
                         "lora_bwd (dA)")))
        return rc;
    if (!dx) return RF_OK;
    // du A: (du A)^T (IC x N) = A (col-major IC x r) * du^T (r x N); without
    // dropout straight into dx, with it into xd, then dx += mask * xd / (1 - p)
    if (p <= 0)
        return rf_cu_gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, r, 1.0f, A, IC, du, r, 1.0f, dx, IC,
                          "lora_bwd (dx)");
    if ((rc = rf_cu_gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, r, 1.0f, A, IC, du, r, 0.0f, xd, IC,
                         "lora_bwd (du A)")))
        return rc;
    return rf_cu_dropout_bwd(be, dx, xd, (size_t)N * IC, p, seed);
}
