// Causal self-attention with grouped-query heads, padding and packed-document
// masks; twin of rf_op_causal_attention_fwd/bwd (ops_causal.c), same layout:
// qkv[B*T, (NH + 2 NKV) hs], out[B*T, NH*hs], att[B,NH,T,T].
//
// The products go through cuBLAS as the encoder's (attention.cu), batched
// over a pointer per (sequence, query head) and operand: q, k and v are read
// in place in qkv (query head h reads kv head h / (NH / NKV)), the output is
// written into its columns of out, and the gradients are added into dqkv
// (beta 1). Forward: S = q k^T scale into att, a warp per row turns S into
// the masked softmax (keys j <= t, valid, same document; the sum in double
// as the CPU; 0 elsewhere, and a zero row when no key is seen), o = P v
// (skipped when out is NULL: the backward's recompute). With out, att is
// room the slot may use (backend.h): on cuda-bf16, for head sizes up to 64,
// the forward is fused instead (flash_attention.cu: no T x T matrix, key
// tiles above the diagonal skipped) and att is not touched; so are the
// recompute (att receives each row's log-sum-exp) and the backward.
// Backward: dP = dout v^T into the context's dprobs, ds = p (dP - p.dP)
// scale by a warp per row (the dot in double), dq = ds k in one product
// each; dv = P^T dout and dk = ds^T q in NH / NKV products, each over one
// query head of every kv head, so the group's heads add into their kv head
// one after another. Deterministic (cuBLAS on one GPU model, no atomics). The
// scores above the diagonal are computed and discarded: twice the products'
// minimum, on tensor-core-shaped calls. (The first version, a warp per query
// row holding its scores in shared memory, had the encoder's first design,
// which ran BERT-base at T 512 at a quarter of PyTorch eager's speed; it also
// bounded T by shared memory, 2048, and the head size by registers, 256. The
// second copied q, k, v head-major, each kv head's group of query heads one
// operand. Neither bound is left.)
#include "trainer/cuda/ops_cuda.cuh"

#define CA_WARPS 4 // warps per block of the row kernels

// Whether query t (segment st) sees key j of its sequence: valid and seg
// already point at the sequence's row (NULL: no such mask).
__device__ __forceinline__ static bool ca_sees(const uint8_t *valid, const int32_t *seg, int st,
                                               int t, int j) {
    return j <= t && (!valid || valid[j]) && (!seg || seg[j] == st);
}

// A warp per row (b, h, t) of att: the scaled scores become the masked
// softmax, 0 at the keys t does not see (above the diagonal included).
__global__ static void causal_softmax_rows_kernel(float *att, const uint8_t *valid,
                                                  const int32_t *seg, int NH, int T, size_t rows) {
    size_t row = (size_t)blockIdx.x * CA_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = (int)(row % T), b = (int)(row / T / NH);
    const uint8_t *vb = valid ? valid + (size_t)b * T : NULL;
    const int32_t *sb = seg ? seg + (size_t)b * T : NULL;
    int st = sb ? sb[t] : 0;
    float *a = att + row * T, mx = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        if (ca_sees(vb, sb, st, t, j)) mx = fmaxf(mx, a[j]);
    mx = warp_max(mx);     // the same on every lane
    if (mx == -INFINITY) { // no key to attend to: zero probabilities, so a zero output
        for (int j = lane; j < T; j += 32)
            a[j] = 0.0f;
        return;
    }
    double sum = 0;
    for (int j = lane; j <= t; j += 32) {
        float e = ca_sees(vb, sb, st, t, j) ? expf(a[j] - mx) : 0.0f;
        a[j] = e;
        sum += e;
    }
    float inv = (float)(1.0 / warp_sum_d(sum));
    for (int j = lane; j < T; j += 32)
        a[j] = j <= t ? a[j] * inv : 0.0f;
}

// A warp per row: ds = p (dp - sum_j p dp) scale, in place over dp (0 where
// p is, as the CPU skips those keys).
__global__ static void causal_softmax_bwd_rows_kernel(float *ds, const float *att, int T,
                                                      size_t rows, float scale) {
    size_t row = (size_t)blockIdx.x * CA_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float *a = att + row * T;
    float *d = ds + row * T;
    double dot = 0;
    for (int j = lane; j < T; j += 32)
        if (a[j] != 0.0f) dot += (double)a[j] * d[j];
    float fdot = (float)warp_sum_d(dot);
    for (int j = lane; j < T; j += 32)
        d[j] = a[j] != 0.0f ? a[j] * (d[j] - fdot) * scale : 0.0f;
}

static int check_shape(int NH, int NKV, int hs, const char *what) {
    if (NH <= 0 || NKV <= 0 || NH % NKV || hs <= 0)
        return rf_fail(RF_ERR_INVALID, "cuda %s: %d query heads, %d kv heads, head size %d", what,
                       NH, NKV, hs);
    return RF_OK;
}

int rf_cu_causal_attention_fwd(const rf_backend *be, float *out, float *att, const float *qkv,
                               const uint8_t *valid, const int32_t *seg, int B, int T, int NH,
                               int NKV, int hs) {
    int rc = check_shape(NH, NKV, hs, "causal_attention_fwd");
    if (rc || B <= 0 || T <= 0) return rc;
    rf_cuda_ctx *c = cu_ctx(be);
    if (rf_cu_flash_on(c, hs)) // flash_attention.cu
        // with out, att only room; without, the backward's recompute: att is room for the
        // rows' log-sum-exp the fused backward reads
        return out ? rf_cu_flash_causal_fwd(c, out, NULL, qkv, valid, seg, B, T, NH, NKV, hs)
                   : rf_cu_flash_causal_fwd(c, NULL, att, qkv, valid, seg, B, T, NH, NKV, hs);
    int A = NH * hs, W = A + 2 * NKV * hs, Z = B * NH;
    size_t rows = (size_t)Z * T;
    long long sx = (long long)T * W, sa = (long long)NH * T * T, ha = (long long)T * T;
    enum { Q, K, V, ATT, OUT, NL };
    // out NULL (the probabilities only): the values' list is filled over att and not used
    rf_cu_att_lists L = {{qkv, qkv + A, qkv + A + NKV * hs, att, out ? out : att},
                         {sx, sx, sx, sa, (long long)T * A},
                         {hs, 0, 0, ha, hs},
                         {0, hs, hs, 0, 0}};
    const float **l;
    if ((rc = rf_cu_att_fill(c, &L, NL, B, NH, NKV, &l))) return rc;
    // S (T x T, row-major) = q k^T scale: column-major S^T = k (T x hs) q^T
    float scale = 1.0f / sqrtf((float)hs);
    if ((rc =
             rf_cu_gemm_lists(c, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, l + K * Z, W, l + Q * Z,
                              W, 0.0f, l + ATT * Z, T, Z, "causal_attention_fwd (scores)")))
        return rc;
    causal_softmax_rows_kernel<<<cu_blocks(rows, CA_WARPS), CA_WARPS * 32, 0, c->stream>>>(
        att, valid, seg, NH, T, rows);
    if ((rc = cu_launched("causal_attention_fwd (softmax)")) || !out) return rc;
    // o (T x hs) = P v: column-major o^T (hs x T) = v^T (hs x T) P^T, into out's columns
    return rf_cu_gemm_lists(c, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, l + V * Z, W, l + ATT * Z,
                            T, 0.0f, l + OUT * Z, A, Z, "causal_attention_fwd (values)");
}

// G_z (a kv head's gradient, column-major hs x T, ld ldc) += X_z Y_z^T
// (X_z hs x T, ld ldx; Y_z T x T, ld T) over the Z entries, in Z / per
// products of per entries: each holds one query head of every kv head, so
// a group's heads add into their kv head one after another.
static int kv_grad(rf_cuda_ctx *c, const float *const *X, int ldx, const float *const *Y,
                   const float *const *G, int ldc, int hs, int T, int Z, int per,
                   const char *what) {
    for (int o = 0; o < Z; o += per) {
        int rc = rf_cu_gemm_lists(c, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, X + o, ldx, Y + o, T,
                                  1.0f, G + o, ldc, per, what);
        if (rc) return rc;
    }
    return RF_OK;
}

// scratch (B*NH*T floats by the slot's contract) is not needed by the
// unfused path: the score gradients, B*NH*T*T floats, live in the context's
// dprobs. The fused one (after the fused recompute: att holds the rows'
// log-sum-exp) keeps each row's dout . out there, and needs no dprobs.
int rf_cu_causal_attention_bwd(const rf_backend *be, float *dqkv, float *scratch, const float *dout,
                               const float *qkv, const float *att, const float *out,
                               const uint8_t *valid, const int32_t *seg, int B, int T, int NH,
                               int NKV, int hs) {
    int rc = check_shape(NH, NKV, hs, "causal_attention_bwd");
    if (rc || B <= 0 || T <= 0) return rc;
    rf_cuda_ctx *c = cu_ctx(be);
    if (rf_cu_flash_on(c, hs)) {
        if (!out)
            return rf_fail(RF_ERR_INVALID,
                           "cuda fused causal attention backward: no forward output");
        return rf_cu_flash_causal_bwd(c, dqkv, scratch, att, qkv, out, dout, valid, seg, B, T, NH,
                                      NKV, hs);
    }
    int A = NH * hs, W = A + 2 * NKV * hs, Z = B * NH, per = B * NKV;
    size_t rows = (size_t)Z * T;
    if ((rc = rf_cuda_grow(&c->dprobs, &c->dprobs_n, rows * T, "causal attention (dP)"))) return rc;
    float *ds = c->dprobs;
    long long sx = (long long)T * W, sa = (long long)NH * T * T, ha = (long long)T * T;
    const float *kq = qkv + A, *vq = qkv + A + NKV * hs;
    float *dk = dqkv + A, *dv = dqkv + A + NKV * hs;
    enum { Q, K, V, DO, P, S, DQ, DK, DV, NL };
    rf_cu_att_lists L = {{qkv, kq, vq, dout, att, ds, dqkv, dk, dv},
                         {sx, sx, sx, (long long)T * A, sa, sa, sx, sx, sx},
                         {hs, 0, 0, hs, ha, ha, hs, 0, 0},
                         {0, hs, hs, 0, 0, 0, 0, hs, hs}};
    const float **l;
    if ((rc = rf_cu_att_fill(c, &L, NL, B, NH, NKV, &l))) return rc;
    // dv (T x hs) += P^T dout: column-major dv^T (hs x T) = dout^T (hs x T) P
    if ((rc = kv_grad(c, l + DO * Z, A, l + P * Z, l + DV * Z, W, hs, T, Z, per,
                      "causal_attention_bwd (values)")))
        return rc;
    // dP (T x T) = dout v^T: column-major dP^T = v (T x hs) dout^T
    if ((rc =
             rf_cu_gemm_lists(c, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, l + V * Z, W, l + DO * Z,
                              A, 0.0f, l + S * Z, T, Z, "causal_attention_bwd (probabilities)")))
        return rc;
    causal_softmax_bwd_rows_kernel<<<cu_blocks(rows, CA_WARPS), CA_WARPS * 32, 0, c->stream>>>(
        ds, att, T, rows, 1.0f / sqrtf((float)hs));
    if ((rc = cu_launched("causal_attention_bwd (softmax)"))) return rc;
    // dq (T x hs) += ds k: column-major dq^T (hs x T) = k^T (hs x T) ds^T
    if ((rc = rf_cu_gemm_lists(c, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, l + K * Z, W, l + S * Z,
                               T, 1.0f, l + DQ * Z, W, Z, "causal_attention_bwd (queries)")))
        return rc;
    // dk (T x hs) += ds^T q: column-major dk^T (hs x T) = q^T (hs x T) ds
    return kv_grad(c, l + Q * Z, W, l + S * Z, l + DK * Z, W, hs, T, Z, per,
                   "causal_attention_bwd (keys)");
}

// Inference: n new queries over a key/value cache (twin of
// rf_op_kv_attention_fwd). A warp per (query head, new token t) at position
// len + t: its scores against keys 0..len+t into the scores scratch (global
// memory, so the cache may be any length), the softmax with the sum in
// double, then the weighted values with lanes over channels, keys in order.
__global__ static void kv_attention_kernel(float *out, float *scores, const float *qkv,
                                           const float *kc, const float *vc, int n, int len, int NH,
                                           int NKV, int hd) {
    int w = blockIdx.x * CA_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= NH * n) return;
    int h = w / n, t = w % n, g = h / (NH / NKV), KW = NKV * hd, A = NH * hd, W = A + 2 * KW;
    int nk = len + t + 1;
    float *S = scores + ((size_t)h * n + t) * (len + n);
    const float *q = qkv + (size_t)t * W + (size_t)h * hd;
    float scale = 1.0f / sqrtf((float)hd), mx = -INFINITY;
    for (int j = lane; j < nk; j += 32) {
        const float *k = kc + (size_t)j * KW + (size_t)g * hd;
        float s = 0;
        for (int i = 0; i < hd; i++)
            s += q[i] * k[i];
        s *= scale;
        S[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = warp_max(mx);
    double sum = 0;
    for (int j = lane; j < nk; j += 32) {
        float e = expf(S[j] - mx);
        S[j] = e;
        sum += e;
    }
    sum = warp_sum_d(sum);
    __syncwarp();
    float inv = (float)(1.0 / sum);
    for (int i = lane; i < hd; i += 32) {
        float o = 0;
        for (int j = 0; j < nk; j++)
            o += S[j] * inv * vc[(size_t)j * KW + (size_t)g * hd + i];
        out[(size_t)t * A + (size_t)h * hd + i] = o;
    }
}

int rf_cu_kv_attention_fwd(const rf_backend *be, float *out, float *scores, const float *qkv,
                           const float *kc, const float *vc, int n, int len, int NH, int NKV,
                           int hd) {
    if (n <= 0 || NH <= 0) return RF_OK; // no rows: no launch (a grid of 0 blocks is an error)
    if (hd <= 0) return rf_fail(RF_ERR_INVALID, "cuda kv_attention: head size %d", hd);
    if (NKV <= 0 || NH % NKV)
        return rf_fail(RF_ERR_INVALID, "cuda kv_attention: %d query heads over %d key/value heads",
                       NH, NKV);
    int warps = NH * n;
    kv_attention_kernel<<<(warps + CA_WARPS - 1) / CA_WARPS, CA_WARPS * 32, 0,
                          cu_ctx(be)->stream>>>(out, scores, qkv, kc, vc, n, len, NH, NKV, hd);
    return cu_launched("kv_attention_fwd");
}
