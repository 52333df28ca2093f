// The linear layer through cuBLAS (the context's one handle, on its stream);
// twin of rf_op_linear_fwd/bwd. Row-major X[r, c] is column-major X^T, so
// each product below is written for the transposes. cuBLAS gives the same
// bits on every run on one GPU model (no atomics mode), so results are
// deterministic. fp32 mode uses
// CUBLAS_PEDANTIC_MATH (backend_cuda.cu): no TF32.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
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

// A product with a bias in cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS): C =
// op(A) op(B) + bias, the bias one per row of column-major C, in one call.
// Without it the bias kernel writes C first and the product reads it back
// (beta 1): a launch and a pass over the output more. The sum and the bias
// are added before one rounding instead of two: within the fp32 tests'
// 1e-5 of the CPU twin.
//
// A plan per product shape and pointer alignment: the descriptors and the
// heuristic's algorithm, found once. A shape for which the heuristic has no
// algorithm at the context's compute type (cuBLASLt need not have every
// one cublasGemmEx has), a bias not 16-byte aligned, a full plan table, or
// REFINERY_CUBLASLT=0 take the bias kernel and cublasGemmEx; each of the
// first two is logged once, and so is a full table (which one a GPU takes is
// what its run reports).
#define RF_CU_LT_PLANS     64
#define RF_CU_LT_WORKSPACE ((size_t)32 << 20) // NVIDIA's suggestion for Hopper

enum { LT_TA, LT_TB, LT_M, LT_N, LT_K, LT_LDA, LT_LDB, LT_LDC, LT_AL_A, LT_AL_B, LT_AL_C, LT_KEY };

struct rf_cu_lt_plan {
    int key[LT_KEY];
    bool ok; // an algorithm was found: else this shape takes the fallback
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c; // c also describes the output (in place)
    cublasLtMatmulAlgo_t algo;
};

// The largest power of two up to 256 that p is aligned to (the heuristic's
// default assumption is 256: a pointer inside an arena is often less).
static uint32_t align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t r = 256;
    while (r > 1 && a % r)
        r >>= 1;
    return r;
}

// With lt_mu held: cuBLASLt set up, or false when it is off.
static bool lt_on(rf_cuda_ctx *c) {
    if (c->lt_state) return c->lt_state > 0;
    c->lt_state = -1;
    const char *e = getenv("REFINERY_CUBLASLT");
    if (e && !strcmp(e, "0")) {
        rf_info("trainer", "cuda: cuBLASLt off (REFINERY_CUBLASLT=0): a bias kernel before each "
                           "product with a bias");
        return false;
    }
    cublasStatus_t st = cublasLtCreate(&c->lt);
    cudaError_t ce = st ? cudaSuccess : cudaMalloc(&c->lt_ws, RF_CU_LT_WORKSPACE);
    c->lt_plans = (rf_cu_lt_plan *)calloc(RF_CU_LT_PLANS, sizeof *c->lt_plans);
    if (st || ce != cudaSuccess || !c->lt_plans) {
        (void)cudaGetLastError(); // a failed cudaMalloc is not the next launch's error
        rf_warn("trainer",
                "cuda: cuBLASLt not used (status %d, %s): a bias kernel before each product "
                "with a bias",
                (int)st, cudaGetErrorString(ce));
        if (!st) (void)cublasLtDestroy(c->lt);
        cudaFree(c->lt_ws);
        free(c->lt_plans);
        c->lt = NULL, c->lt_ws = NULL, c->lt_plans = NULL;
        return false;
    }
    c->lt_state = 1;
    return true;
}

static void lt_drop(rf_cu_lt_plan *p) {
    if (p->desc) (void)cublasLtMatmulDescDestroy(p->desc);
    if (p->a) (void)cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) (void)cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) (void)cublasLtMatrixLayoutDestroy(p->c);
    p->desc = NULL, p->a = p->b = p->c = NULL;
    p->ok = false;
}

// The descriptors and the heuristic's first algorithm for the key's product
// at compute type ct; false (p dropped) when there is none.
static bool lt_try(rf_cuda_ctx *c, rf_cu_lt_plan *p, cublasComputeType_t ct) {
    const int *k = p->key;
    int32_t ta = k[LT_TA], tb = k[LT_TB];
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS, al[4] = {(uint32_t)k[LT_AL_A], (uint32_t)k[LT_AL_B],
                                                    (uint32_t)k[LT_AL_C], (uint32_t)k[LT_AL_C]};
    uint64_t ws = RF_CU_LT_WORKSPACE;
    bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t r = {};
    int got = 0;
    bool ok =
        !cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F) &&
        !cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) &&
        !cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) &&
        !cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) &&
        !cublasLtMatrixLayoutCreate(&p->a, CUDA_R_32F, na ? k[LT_M] : k[LT_K],
                                    na ? k[LT_K] : k[LT_M], k[LT_LDA]) &&
        !cublasLtMatrixLayoutCreate(&p->b, CUDA_R_32F, nb ? k[LT_K] : k[LT_N],
                                    nb ? k[LT_N] : k[LT_K], k[LT_LDB]) &&
        !cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, k[LT_M], k[LT_N], k[LT_LDC]) &&
        !cublasLtMatmulPreferenceCreate(&pref) &&
        !cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                              sizeof ws);
    for (int i = 0; ok && i < 4; i++)
        ok = !cublasLtMatmulPreferenceSetAttribute(
            pref,
            (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i),
            &al[i], sizeof al[i]);
    ok = ok &&
         !cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &r,
                                         &got) &&
         got > 0 && r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= RF_CU_LT_WORKSPACE;
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (ok)
        p->algo = r.algo;
    else
        lt_drop(p);
    return ok;
}

// A plan at the context's compute type: bf16 tensor cores (FAST_16BF) on
// cuda-bf16; on cuda, pedantic fp32 as cublasGemmEx, else plain fp32
// compute (cuBLASLt uses TF32 only when asked for FAST_TF32), which holds
// the same 1e-5 against the CPU. Logged once when neither has an algorithm.
static bool lt_make(rf_cuda_ctx *c, rf_cu_lt_plan *p) {
    static const cublasComputeType_t fp32[] = {CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_32F},
                                     bf16[] = {CUBLAS_COMPUTE_32F_FAST_16BF};
    const cublasComputeType_t *ct = c->bf16 ? bf16 : fp32;
    int n = c->bf16 ? 1 : 2;
    for (int i = 0; i < n; i++)
        if (lt_try(c, p, ct[i])) return true;
    const int *k = p->key;
    rf_info("trainer",
            "cuda: cuBLASLt has no algorithm for the %s product %d x %d x %d (op %d %d, "
            "alignment %d %d %d): a bias kernel, then cublasGemmEx",
            c->bf16 ? "bf16" : "fp32", k[LT_M], k[LT_N], k[LT_K], k[LT_TA], k[LT_TB], k[LT_AL_A],
            k[LT_AL_B], k[LT_AL_C]);
    return false;
}

// With lt_mu held: the plan for this product, made if new; NULL when the
// table is full.
static rf_cu_lt_plan *lt_plan(rf_cuda_ctx *c, const int *key) {
    for (int i = 0; i < c->lt_nplans; i++)
        if (!memcmp(c->lt_plans[i].key, key, sizeof c->lt_plans[i].key)) return &c->lt_plans[i];
    if (c->lt_nplans == RF_CU_LT_PLANS) {
        if (!c->lt_full)
            rf_info("trainer",
                    "cuda: cuBLASLt's %d plans are made: products of other shapes take "
                    "a bias kernel, then cublasGemmEx",
                    RF_CU_LT_PLANS);
        c->lt_full = true;
        return NULL;
    }
    rf_cu_lt_plan *p = &c->lt_plans[c->lt_nplans++];
    memcpy(p->key, key, sizeof p->key);
    p->ok = lt_make(c, p);
    return p;
}

// C (m x n, ld ldc) = op(A) op(B) + bias through cuBLASLt; false when this
// product takes the fallback (nothing queued then).
static bool lt_bias_gemm(rf_cuda_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                         int k, const float *A, int lda, const float *B, int ldb, const float *bias,
                         float *C, int ldc, const char *what) {
    if ((uintptr_t)bias % 16) return false;
    int key[LT_KEY] = {(int)ta,          (int)tb,         m, n, k, lda, ldb, ldc, (int)align_of(A),
                       (int)align_of(B), (int)align_of(C)};
    pthread_mutex_lock(&c->lt_mu);
    rf_cu_lt_plan *p = lt_on(c) ? lt_plan(c, key) : NULL;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    bool done = false;
    if (p && p->ok) {
        const float one = 1.0f, zero = 0.0f;
        st = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                            sizeof bias);
        if (!st)
            st = cublasLtMatmul(c->lt, p->desc, &one, A, p->a, B, p->b, &zero, C, p->c, C, p->c,
                                &p->algo, c->lt_ws, RF_CU_LT_WORKSPACE, c->stream);
        if (st) { // refused at the call: this shape takes the fallback from now on
            rf_warn("trainer", "cuda: %s: cuBLASLt status %d: a bias kernel, then cublasGemmEx",
                    what, (int)st);
            lt_drop(p);
        }
        done = !st;
    }
    pthread_mutex_unlock(&c->lt_mu);
    return done;
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
    int rc;
    // out^T[OC, N] = w^T... : C(OC x N) = op(A = w, IC x OC)^T * (B = inp^T, IC x N)
    if (b && lt_bias_gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, ldw, inp, ldi, b, out, ldo,
                          "linear_fwd"))
        return RF_OK;
    if (b) { // out = b, then out += inp w^T, as the CPU twin
        size_t total = (size_t)N * OC;
        bias_rows_ld_kernel<<<cu_blocks(total, 256), 256, 0, c->stream>>>(out, ldo, b, OC, total);
        if ((rc = cu_launched("linear_fwd (bias)"))) return rc;
        beta = 1.0f;
    }
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
    int rc;
    // out^T (OC x N) = w^T (OC x IC, ld OC) * inp^T (IC x N, ld IC)
    if (b && lt_bias_gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, OC, N, IC, w, OC, inp, IC, b, out, OC,
                          "conv1d_fwd"))
        return RF_OK;
    if (b) { // out = b, then out += inp w, as the CPU twin
        size_t total = (size_t)N * OC;
        bias_rows_kernel<<<cu_blocks(total, 256), 256, 0, c->stream>>>(out, b, OC, total);
        if ((rc = cu_launched("conv1d_fwd (bias)"))) return rc;
        beta = 1.0f;
    }
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
