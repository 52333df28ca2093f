// Multi-head self-attention with padding masks; twin of
// rf_op_attention_fwd/bwd (same layout: qkv[B*T, 3C], att[B,NH,Tq,T]).
//
// The products go through cuBLAS, batched over (batch, head) with a pointer
// per (batch, head) and operand (cublasGemmBatchedEx): each head's q, k and v
// are read where they are in qkv (row stride 3C), the output is written
// into out (row stride C), and the backward adds dq, dk and dv straight into
// dqkv (beta 1), so no head-major copy is made. One launch fills the pointer
// lists (the context's ptrs). S = q k^T scale into att, a warp per row turns
// S into the masked softmax (att, which the backward contract reads) and the
// dropped probabilities (the hash of ops.c, element index (b*NHall + h0 +
// h)*Tq*T + t*T + j as on the CPU, h0 and NHall placing a tensor-parallel
// shard's heads; into scratch), and out = P v (skipped when out is NULL: the
// backward's recompute needs att and the dropped probabilities only). att
// NULL: the probabilities are not kept (a forward whose backward recomputes
// them), so they are made in scratch, and with dropout dropped in place.
// On cuda-bf16 (head sizes up to 64) that forward is fused instead
// (flash_attention.cu), and so are the backward's recompute (out NULL: att
// receives each row's log-sum-exp, not the probabilities) and the backward
// (reading the forward's output and the mask, which the unfused one has no
// use for).
// Backward: dv = P^T dout (P as the forward left it in scratch, or att
// without dropout), dP = dout v^T, ds = p (dP - p.dP) scale by a warp per
// row, dq = ds k, dk = ds^T q. cuBLAS products are deterministic on one GPU
// model, and nothing uses atomics. (The first version, a warp per query row
// with one lane per key, ran BERT-base at T 512 at a quarter of PyTorch
// eager's speed on an H100; its key loads were uncoalesced. The second
// copied q, k, v and the output head-major around strided-batched products:
// four more passes over a B T C matrix forward and seven backward.) The
// pointer lists and their products are shared with the causal attention
// (causal_attention.cu; declared in ops_cuda.cuh).
#include "trainer/cuda/ops_cuda.cuh"

__global__ static void att_lists_kernel(const float **out, rf_cu_att_lists L, int B, int NH,
                                        int NKV) {
    int Z = B * NH, z = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (z >= Z) return;
    int per = B * NKV, r = z / per, b = z % per / NKV, g = z % NKV, h = g * (NH / NKV) + r;
    out[(size_t)i * Z + z] =
        L.base[i] + (long long)b * L.sb[i] + (long long)h * L.sq[i] + (long long)g * L.skv[i];
}

int rf_cu_att_fill(rf_cuda_ctx *c, const rf_cu_att_lists *L, int n, int B, int NH, int NKV,
                   const float ***lists) {
    if (n < 1 || n > RF_CU_ATT_LISTS_MAX || NKV < 1 || NH % NKV)
        return rf_fail(RF_ERR_INVALID, "cuda attention: %d pointer lists over %d heads of %d", n,
                       NH, NKV);
    int Z = B * NH;
    // ptrs is float storage: two floats a pointer (cudaMalloc aligns it for both)
    int rc = rf_cuda_grow(&c->ptrs, &c->ptrs_n, 2 * (size_t)n * Z, "attention pointer lists");
    if (rc) return rc;
    *lists = (const float **)(void *)c->ptrs;
    att_lists_kernel<<<dim3(cu_blocks((size_t)Z, 256), n), 256, 0, c->stream>>>(*lists, *L, B, NH,
                                                                                NKV);
    return cu_launched("attention (pointer lists)");
}

int rf_cu_gemm_lists(rf_cuda_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                     int k, float alpha, const float *const *A, int lda, const float *const *B,
                     int ldb, float beta, const float *const *Cm, int ldc, int Z,
                     const char *what) {
    cublasComputeType_t ct = c->bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_PEDANTIC;
    return rf_cublas_check(
        cublasGemmBatchedEx(c->blas, ta, tb, m, n, k, &alpha, (const void *const *)A, CUDA_R_32F,
                            lda, (const void *const *)B, CUDA_R_32F, ldb, &beta, (void *const *)Cm,
                            CUDA_R_32F, ldc, Z, ct, CUBLAS_GEMM_DEFAULT),
        what);
}

#define ATT_WARPS 8

// Where the dropout masks of row `row` of att ([B, NH, Tq, T], heads [h0, h0 +
// NH) of a layer of NHall) start: the global head's, as ops.c, so masks do not
// depend on how tensor parallelism splits the heads (row * T when h0 = 0 and
// NHall = NH).
__device__ static size_t mask_base(int row, int Tq, int T, int NH, int h0, int NHall) {
    int t = row % Tq, bh = row / Tq, b = bh / NH, h = bh % NH;
    return (((size_t)b * NHall + h0 + h) * Tq + t) * T;
}

// A warp per row (bh, t) of att: the scores (already scaled) become the
// softmax over the valid keys (0 where none), written to att; the dropped
// probabilities (p / (1 - pdrop) where kept, else 0) to pd, which may be
// att itself (probabilities not kept: then only the dropped ones).
__global__ static void softmax_rows_kernel(float *att, float *pd, const uint8_t *valid, int NH,
                                           int h0, int NHall, int Tq, int T, int rows, float pdrop,
                                           uint64_t seed) {
    int row = blockIdx.x * ATT_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const uint8_t *vb = valid + (size_t)(row / Tq / NH) * T;
    size_t base = (size_t)row * T, mb = pd ? mask_base(row, Tq, T, NH, h0, NHall) : 0;
    float *a = att + base, mx = -INFINITY;
    for (int j = lane; j < T; j += 32)
        if (vb[j] && a[j] > mx) mx = a[j];
    mx = warp_max(mx);
    float sum = 0;
    for (int j = lane; j < T; j += 32) {
        float e = vb[j] ? expf(a[j] - mx) : 0.0f;
        a[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    float inv = sum > 0 ? 1.0f / sum : 0.0f, ks = pdrop > 0 ? 1.0f / (1.0f - pdrop) : 1.0f;
    for (int j = lane; j < T; j += 32) {
        float p = a[j] * inv;
        if (pd != att) a[j] = p;
        if (pd) pd[base + j] = rf_keep(seed, mb + j, pdrop) ? p * ks : 0.0f;
    }
}

// A warp per row: dP (in ds) through the dropout masks, then
// ds = p (dp - sum_j p dp) scale, in place.
__global__ static void softmax_bwd_rows_kernel(float *ds, const float *att, int Tq, int T, int NH,
                                               int h0, int NHall, int rows, float scale,
                                               float pdrop, uint64_t seed) {
    int row = blockIdx.x * ATT_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    size_t base = (size_t)row * T, mb = pdrop > 0 ? mask_base(row, Tq, T, NH, h0, NHall) : 0;
    float ks = pdrop > 0 ? 1.0f / (1.0f - pdrop) : 1.0f, dot = 0;
    for (int j = lane; j < T; j += 32) {
        float s = ds[base + j];
        if (pdrop > 0) s = rf_keep(seed, mb + j, pdrop) ? s * ks : 0.0f;
        ds[base + j] = s;
        dot += att[base + j] * s;
    }
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32)
        ds[base + j] = att[base + j] * (ds[base + j] - dot) * scale;
}

static int check_shape(int C, int NH, int h0, int NHall) {
    if (NH <= 0 || C % NH)
        return rf_fail(RF_ERR_INVALID, "cuda attention: %d channels in %d heads", C, NH);
    if (h0 < 0 || h0 + NH > NHall)
        return rf_fail(RF_ERR_INVALID, "cuda attention: heads [%d, %d) outside the layer's %d", h0,
                       h0 + NH, NHall);
    return RF_OK;
}

int rf_cu_attention_fwd(const rf_backend *be, float *out, float *att, float *scratch,
                        const float *qkv, const uint8_t *valid, int B, int T, int Tq, int C, int NH,
                        int h0, int NHall, float pdrop, uint64_t seed) {
    int rc = check_shape(C, NH, h0, NHall);
    if (rc || B <= 0 || Tq <= 0) return rc;
    rf_cuda_ctx *c = cu_ctx(be);
    int hs = C / NH, Z = B * NH, rows = Z * Tq, W = 3 * C;
    long long sx = (long long)T * W, sa = (long long)NH * Tq * T, ha = (long long)Tq * T;
    if (!att && !out) return rf_fail(RF_ERR_INVALID, "cuda attention: neither out nor att");
    if (rf_cu_flash_on(c, hs) && !(att && out)) { // flash_attention.cu
        if (!att)                                 // out alone
            return rf_cu_flash_fwd(c, out, NULL, qkv, valid, B, T, Tq, C, NH, h0, NHall, pdrop,
                                   seed);
        // the backward's recompute: att is room, for the rows' log-sum-exp the fused backward
        // reads
        return rf_cu_flash_fwd(c, NULL, att, qkv, valid, B, T, Tq, C, NH, h0, NHall, pdrop, seed);
    }
    // att NULL (not kept): the scores and probabilities in scratch, with
    // dropout made dropped in place
    float *pd = pdrop > 0 ? scratch : NULL, *sp = att ? att : scratch;
    enum { Q, K, V, ATT, P, OUT, NL };
    // out NULL: the values' list is filled over att and not used
    rf_cu_att_lists L = {{qkv, qkv + C, qkv + 2 * C, sp, pd ? pd : sp, out ? out : sp},
                         {sx, sx, sx, sa, sa, (long long)Tq * C},
                         {hs, hs, hs, ha, ha, hs},
                         {}};
    const float **l;
    if ((rc = rf_cu_att_fill(c, &L, NL, B, NH, NH, &l))) return rc;
    // S (Tq x T, row-major) = q k^T scale: column-major S^T (T x Tq) = k (T x hs) q^T, the
    // head's k and q read in qkv (row stride 3C)
    float scale = 1.0f / sqrtf((float)hs);
    if ((rc = rf_cu_gemm_lists(c, CUBLAS_OP_T, CUBLAS_OP_N, T, Tq, hs, scale, l + K * Z, W,
                               l + Q * Z, W, 0.0f, l + ATT * Z, T, Z, "attention_fwd (scores)")))
        return rc;
    softmax_rows_kernel<<<cu_blocks(rows, ATT_WARPS), ATT_WARPS * 32, 0, c->stream>>>(
        sp, pd, valid, NH, h0, NHall, Tq, T, rows, pdrop, seed);
    if ((rc = cu_launched("attention_fwd (softmax)")) || !out) return rc;
    // o (Tq x hs) = P v: column-major o^T (hs x Tq) = v^T (hs x T) P^T (T x Tq), into the
    // head's columns of out (row stride C)
    return rf_cu_gemm_lists(c, CUBLAS_OP_N, CUBLAS_OP_N, hs, Tq, T, 1.0f, l + V * Z, W, l + P * Z,
                            T, 0.0f, l + OUT * Z, C, Z, "attention_fwd (values)");
}

int rf_cu_attention_stats(const rf_backend *be, int hs, bool *stats) {
    rf_cuda_ctx *c = cu_ctx(be);
    *stats = rf_cu_flash_on(c, hs); // the fused kernels' choice, both attentions
    return RF_OK;
}

int rf_cu_attention_bwd(const rf_backend *be, float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *att, const float *out, const uint8_t *valid,
                        int B, int T, int Tq, int C, int NH, int h0, int NHall, float pdrop,
                        uint64_t seed) {
    int rc = check_shape(C, NH, h0, NHall);
    if (rc || B <= 0 || Tq <= 0) return rc;
    rf_cuda_ctx *c = cu_ctx(be);
    int hs = C / NH, Z = B * NH, rows = Z * Tq, W = 3 * C;
    if (rf_cu_flash_on(c, hs)) { // after the fused recompute (att: its statistics)
        if (!out || !valid)
            return rf_fail(RF_ERR_INVALID, "cuda fused attention backward: no %s",
                           out ? "mask" : "forward output");
        return rf_cu_flash_bwd(c, dqkv, scratch, att, qkv, out, dout, valid, B, T, Tq, C, NH, h0,
                               NHall, pdrop, seed);
    }
    long long sx = (long long)T * W, sa = (long long)NH * Tq * T, ha = (long long)Tq * T;
    // P: the dropped probabilities (in scratch, as the forward left them, when dropout is on);
    // S: dP, then ds, in scratch
    const float *pd = pdrop > 0 ? scratch : att;
    enum { Q, K, V, DO, P, S, DQ, DK, DV, NL };
    rf_cu_att_lists L = {
        {qkv, qkv + C, qkv + 2 * C, dout, pd, scratch, dqkv, dqkv + C, dqkv + 2 * C},
        {sx, sx, sx, (long long)Tq * C, sa, sa, sx, sx, sx},
        {hs, hs, hs, hs, ha, ha, hs, hs, hs},
        {}};
    const float **l;
    if ((rc = rf_cu_att_fill(c, &L, NL, B, NH, NH, &l))) return rc;
    // dv (T x hs) += P^T dout: column-major dv^T (hs x T) = dout^T (hs x Tq) P (Tq x T), added
    // into the head's columns of dqkv (beta 1; row strides C and 3C)
    if ((rc = rf_cu_gemm_lists(c, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, Tq, 1.0f, l + DO * Z, C,
                               l + P * Z, T, 1.0f, l + DV * Z, W, Z, "attention_bwd (values)")))
        return rc;
    // dP (Tq x T) = dout v^T into scratch (over P, which is no longer read): column-major
    // dP^T (T x Tq) = v (T x hs) dout^T
    if ((rc = rf_cu_gemm_lists(c, CUBLAS_OP_T, CUBLAS_OP_N, T, Tq, hs, 1.0f, l + V * Z, W,
                               l + DO * Z, C, 0.0f, l + S * Z, T, Z,
                               "attention_bwd (probabilities)")))
        return rc;
    float scale = 1.0f / sqrtf((float)hs);
    softmax_bwd_rows_kernel<<<cu_blocks(rows, ATT_WARPS), ATT_WARPS * 32, 0, c->stream>>>(
        scratch, att, Tq, T, NH, h0, NHall, rows, scale, pdrop, seed);
    if ((rc = cu_launched("attention_bwd (softmax)"))) return rc;
    // dq (Tq x hs) += ds k: column-major dq^T (hs x Tq) = k^T (hs x T) ds^T (T x Tq)
    if ((rc = rf_cu_gemm_lists(c, CUBLAS_OP_N, CUBLAS_OP_N, hs, Tq, T, 1.0f, l + K * Z, W,
                               l + S * Z, T, 1.0f, l + DQ * Z, W, Z, "attention_bwd (queries)")))
        return rc;
    // dk (T x hs) += ds^T q: column-major dk^T (hs x T) = q^T (hs x Tq) ds (Tq x T)
    return rf_cu_gemm_lists(c, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, Tq, 1.0f, l + Q * Z, W, l + S * Z,
                            T, 1.0f, l + DK * Z, W, Z, "attention_bwd (keys)");
}
