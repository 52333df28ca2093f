// The attentions' forwards fused on tensor cores (flash-attention style):
// out = softmax(q k^T scale over the keys a query sees) v, dropped as the
// unfused path drops it, with no T x T matrix in memory; a twin of
// rf_op_attention_fwd's and rf_op_causal_attention_fwd's output.
// attention.cu and causal_attention.cu call it on cuda-bf16 when the
// forward wants out alone (the probabilities not kept: the models' forward,
// whose backward recomputes them; evaluation), for head sizes up to 64
// (padded with zeros to a multiple of 16). Attention dropout uses the
// unfused path's masks (rf_keep over the same element indices). Both
// backwards are fused as well (below: their recompute is the first pass
// alone). REFINERY_FUSED_ATTENTION=0 turns it all off (the unfused path, to
// compare).
//
// The products are bf16 wmma tiles (16 x 16 x 16, float accumulators): q,
// k, v and the probabilities rounded to bf16, as CUBLAS_COMPUTE_32F_FAST_16BF
// rounds the unfused path's inputs; scores and softmax in float. A block
// takes 64 query rows of one (sequence, head), a warp 16 of them, and walks
// the keys in tiles of 32 through shared memory (each tile converted to bf16
// once per pass), twice: the first pass finds each row's maximum and sum of
// exponentials from the scores alone, the second makes the normalised
// probabilities and adds P v into the warp's accumulators. Computing the
// scores twice (1.5 times one pass's products) spares what a one-pass
// version needs: a per-row rescale of the running output at every tile,
// which a fragment's unspecified layout would send through shared memory;
// and the probabilities are rounded after their normalisation, as in the
// unfused path. Deterministic: no atomics, a fixed order everywhere.
#include <cuda_bf16.h>
#include <mma.h>

#include "trainer/cuda/ops_cuda.cuh"

using namespace nvcuda;

#define FA_ROWS  16                   // a warp's query rows: one tile
#define FA_WARPS 4                    // warps a block
#define FA_BM    (FA_ROWS * FA_WARPS) // a block's query rows
#define FA_BN    32                   // keys a tile: a lane per key in the softmax

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_kt;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_v;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

// Rows [t0, t0 + n) of one head's hs columns of src (row stride W) as a
// bf16 tile of row stride HS >= hs; rows at or past `rows`, and columns
// [hs, HS), are zero (zeros add nothing to a product). The whole block.
template <int HS>
__device__ static void load_tile(__nv_bfloat16 *dst, const float *src, int t0, int n, int rows,
                                 int hs, int W) {
    for (int i = threadIdx.x; i < n * HS; i += blockDim.x) {
        int r = i / HS, d = i % HS, t = t0 + r;
        dst[i] = __float2bfloat16(t < rows && d < hs ? src[(size_t)t * W + d] : 0.0f);
    }
}

// The warp's FA_ROWS x FA_BN raw scores q k^T into s (row stride FA_BN):
// q the warp's rows and k the key tile, both of row stride HS.
template <int HS>
__device__ static void tile_scores(float *s, const __nv_bfloat16 *q, const __nv_bfloat16 *k) {
    for (int n = 0; n < FA_BN / 16; n++) {
        frag_c acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int d = 0; d < HS; d += 16) {
            frag_a a;
            frag_kt b; // k^T: key n * 16 + j, channel d + i at k[(n * 16 + j) * HS + d + i]
            wmma::load_matrix_sync(a, q + d, HS);
            wmma::load_matrix_sync(b, k + (size_t)n * 16 * HS + d, HS);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(s + n * 16, acc, FA_BN, wmma::mem_row_major);
    }
    __syncwarp(); // every lane's part of the scores is there before any lane reads
}

// Whether query t sees key j: ok (j is a valid key of the sequence), and in
// the causal attention j <= t, the same document (sg NULL: one), and t a row
// of the sequence (a row past its end, whose result is dropped, sees none).
template <bool CAUSAL>
__device__ __forceinline__ static bool fa_sees(bool ok, int j, int t, int T, const int32_t *sg) {
    return ok && (!CAUSAL || (j <= t && t < T && (!sg || sg[j] == sg[t])));
}

// A block's shared memory (28 KiB at HS 64); wmma wants 32-byte aligned tiles.
template <int HS> struct fa_smem {
    alignas(32) __nv_bfloat16 q[FA_BM * HS];                // the block's queries
    alignas(32) __nv_bfloat16 k[FA_BN * HS];                // a key tile
    alignas(32) __nv_bfloat16 v[FA_BN * HS];                // its values
    alignas(32) float s[FA_WARPS][FA_ROWS * FA_BN];         // a warp's scores
    alignas(32) __nv_bfloat16 p[FA_WARPS][FA_ROWS * FA_BN]; // a warp's probabilities
};

// The key tile at k0 into ks (and its values into vs, vb not NULL), by the
// whole block. False for a warp whose rows all lie above the tile (the
// causal attention: it skips it); else the warp's scores q k^T are in sw
// and *ok says whether the lane's key k0 + lane is a valid key of the
// sequence.
template <int HS, bool CAUSAL>
__device__ static bool
key_tile(__nv_bfloat16 *ks, __nv_bfloat16 *vs, float *sw, const __nv_bfloat16 *qw, const float *kb,
         const float *vb, const uint8_t *vm, int k0, int T, int hs, int W, int tlast, bool *ok) {
    __syncthreads(); // the previous tile is no longer read (and q is loaded)
    load_tile<HS>(ks, kb, k0, FA_BN, T, hs, W);
    if (vb) load_tile<HS>(vs, vb, k0, FA_BN, T, hs, W);
    __syncthreads();
    if (CAUSAL && k0 > tlast) return false;
    tile_scores<HS>(sw, qw, ks);
    int j = k0 + threadIdx.x % 32;
    *ok = j < T && (!vm || vm[j]);
    return true;
}

// One kernel for both attentions' forwards (lse NULL), or for the
// statistics the fused backward reads (lse not NULL: pass 1 only, out not
// written). The encoder's (CAUSAL false): qkv rows of
// W = 3 C, key and value heads at C and 2 C (grp 1), the valid mask on
// keys, dropout. The causal one: query head h reads kv head h / grp at
// columns kofs and vofs, and query t sees key j when j <= t, valid[j], and
// seg[j] == seg[t] (valid, seg NULL: no such mask); key tiles wholly above
// the block's diagonal are skipped, and a warp skips its products on those
// above its own. out rows have NH hs floats.
template <int HS, bool CAUSAL>
__global__ static void __launch_bounds__(FA_WARPS * 32)
    flash_fwd_kernel(float *out, float *lse, const float *qkv, const uint8_t *valid,
                     const int32_t *seg, int T, int Tq, int W, int kofs, int vofs, int NH, int grp,
                     int hs, int h0, int NHall, float scale, float pdrop, uint64_t seed) {
    __shared__ fa_smem<HS> sm;
    __nv_bfloat16 *qs = sm.q, *vs = sm.v;
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH, q0 = blockIdx.x * FA_BM, t0 = q0 + w * FA_ROWS;
    const float *row0 = qkv + (size_t)b * T * W, *qb = row0 + h * hs;
    const float *kb = row0 + kofs + (h / grp) * hs, *vb = row0 + vofs + (h / grp) * hs;
    const uint8_t *vm = valid ? valid + (size_t)b * T : NULL;
    const int32_t *sg = CAUSAL && seg ? seg + (size_t)b * T : NULL;
    const __nv_bfloat16 *qw = qs + w * FA_ROWS * HS;
    float *sw = sm.s[w];
    __nv_bfloat16 *pw = sm.p[w];
    // the keys the block's rows may see, and the warp's last row
    int kend = CAUSAL ? min(T, q0 + FA_BM) : T, tlast = t0 + FA_ROWS - 1;
    load_tile<HS>(qs, qb, q0, FA_BM, Tq, hs, W); // rows past Tq: zero, results dropped

    // pass 1: each row's maximum m and sum of exponentials l over the keys
    // it sees (every lane holds its warp's rows' m and l, all lanes the same)
    float m[FA_ROWS], l[FA_ROWS];
#pragma unroll
    for (int r = 0; r < FA_ROWS; r++)
        m[r] = -INFINITY, l[r] = 0.0f;
    for (int k0 = 0; k0 < kend; k0 += FA_BN) {
        bool ok;
        if (!key_tile<HS, CAUSAL>(sm.k, sm.v, sw, qw, kb, NULL, vm, k0, T, hs, W, tlast, &ok))
            continue;
        int j = k0 + lane;
#pragma unroll
        for (int r = 0; r < FA_ROWS; r++) {
            bool sees = fa_sees<CAUSAL>(ok, j, t0 + r, T, sg);
            float x = sees ? sw[r * FA_BN + lane] * scale : -INFINITY;
            float mx = fmaxf(m[r], warp_max(x));
            if (mx == -INFINITY) continue; // no key seen yet (the same in every lane)
            float e = sees ? expf(x - mx) : 0.0f;
            l[r] = l[r] * expf(m[r] - mx) + warp_sum(e);
            m[r] = mx;
        }
        __syncwarp(); // the scores are read before the next tile's overwrite them
    }

    if (lse) { // the backward's recompute: each row's log-sum-exp alone (+inf: no key)
        float *lr = lse + ((size_t)b * NH + h) * Tq;
#pragma unroll
        for (int r = 0; r < FA_ROWS; r++)
            if (lane == 0 && t0 + r < Tq) lr[t0 + r] = l[r] > 0 ? m[r] + logf(l[r]) : INFINITY;
        return;
    }

    // pass 2: the probabilities (dropped), rounded to bf16, times the value tile
    size_t mb = (((size_t)b * NHall + h0 + h) * Tq + t0) * T; // row 0's dropout masks
    float ks_drop = pdrop > 0 ? 1.0f / (1.0f - pdrop) : 1.0f;
#pragma unroll
    for (int r = 0; r < FA_ROWS; r++)         // l becomes its inverse (registers are dear)
        l[r] = l[r] > 0 ? 1.0f / l[r] : 0.0f; // a row that sees no key: zero
    frag_c o[HS / 16];
#pragma unroll
    for (int j = 0; j < HS / 16; j++)
        wmma::fill_fragment(o[j], 0.0f);
    for (int k0 = 0; k0 < kend; k0 += FA_BN) {
        bool ok;
        if (!key_tile<HS, CAUSAL>(sm.k, sm.v, sw, qw, kb, vb, vm, k0, T, hs, W, tlast, &ok))
            continue;
        int j = k0 + lane;
#pragma unroll
        for (int r = 0; r < FA_ROWS; r++) {
            bool sees = fa_sees<CAUSAL>(ok, j, t0 + r, T, sg);
            float p = sees ? expf(sw[r * FA_BN + lane] * scale - m[r]) * l[r] : 0.0f;
            if (pdrop > 0) // the mask of element (b, h0 + h, t, key) of the layer's att
                p = rf_keep(seed, (mb + (size_t)r * T) + j, pdrop) ? p * ks_drop : 0.0f;
            pw[r * FA_BN + lane] = __float2bfloat16(p);
        }
        __syncwarp();
#pragma unroll
        for (int c = 0; c < HS / 16; c++)
            for (int n = 0; n < FA_BN / 16; n++) {
                frag_a a;
                frag_v v;
                wmma::load_matrix_sync(a, pw + n * 16, FA_BN);
                wmma::load_matrix_sync(v, vs + (size_t)n * 16 * HS + c * 16, HS);
                wmma::mma_sync(o[c], a, v, o[c]);
            }
        __syncwarp(); // the probabilities are read before the next tile's overwrite them
    }

    // the output, 16 columns at a time through the warp's score tile (rows
    // past Tq and the padding's columns not written)
#pragma unroll
    for (int c = 0; c < HS / 16; c++) {
        wmma::store_matrix_sync(sw, o[c], 16, wmma::mem_row_major);
        __syncwarp();
        for (int i = lane; i < FA_ROWS * 16; i += 32) {
            int t = t0 + i / 16, d = c * 16 + i % 16;
            if (t < Tq && d < hs) out[((size_t)b * Tq + t) * NH * hs + h * hs + d] = sw[i];
        }
        __syncwarp();
    }
}

// Both attentions' backwards, fused (FlashAttention-2's split, with no
// atomics): the recompute left each query row's log-sum-exp L in att
// (flash_fwd_kernel with lse), so p = exp(s scale - L) is remade tile by
// tile, and with D = dout . out a row (= sum_j p dP, the unfused path's dot)
// ds = p (dP - D) scale, dP = dout v^T through the dropout masks. Two
// kernels: flash_bwd_dq_kernel walks the keys for a block of 64 queries
// (dq += ds k; it also leaves D for the other), flash_bwd_dkv_kernel walks
// the queries for a block of 64 keys (dv += P_dropped^T dout, dk += ds^T
// q). Each computes its own scores and dP: 7 tile products where a
// one-kernel version with atomic dq adds makes 5, in exchange for a fixed
// order of every sum. Products on bf16 wmma tiles, as the forward's.
template <int HS> struct fa_bwd_q_smem {
    alignas(32) __nv_bfloat16 q[FA_BM * HS];                 // the block's queries
    alignas(32) __nv_bfloat16 g[FA_BM * HS];                 // their output gradients
    alignas(32) __nv_bfloat16 k[FA_BN * HS];                 // a key tile
    alignas(32) __nv_bfloat16 v[FA_BN * HS];                 // its values
    alignas(32) float s[FA_WARPS][FA_ROWS * FA_BN];          // a warp's scores
    alignas(32) float dp[FA_WARPS][FA_ROWS * FA_BN];         // ... and dP
    alignas(32) __nv_bfloat16 ds[FA_WARPS][FA_ROWS * FA_BN]; // ... and ds
};

// acc (16 x 16 of a warp's rows) added into global rows t0.. (row stride
// ldo, columns c16..) through the warp's float tile sw, rows below n and
// columns below hs.
__device__ static void add_out(float *o, size_t ldo, const frag_c &acc, float *sw, int t0, int n,
                               int c16, int hs) {
    wmma::store_matrix_sync(sw, acc, 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = threadIdx.x % 32; i < FA_ROWS * 16; i += 32) {
        int t = t0 + i / 16, d = c16 + i % 16;
        if (t < n && d < hs) o[(size_t)t * ldo + d] += sw[i];
    }
    __syncwarp();
}

// Where an attention's tensors lie, for the backward's kernels: qkv rows of
// W floats, query head h at column h hs and its kv head h / grp at kofs and
// vofs; out and dout rows of NH hs; the dropout masks of global head h0 + h
// of NHall (pdrop 0: none).
struct fa_geom {
    int T, Tq, W, kofs, vofs, NH, grp, hs, h0, NHall;
    float scale, pdrop;
    uint64_t seed;
};

template <int HS, bool CAUSAL>
__global__ static void __launch_bounds__(FA_WARPS * 32)
    flash_bwd_dq_kernel(float *dqkv, float *Dout, const float *qkv, const float *out,
                        const float *dout, const float *lse, const uint8_t *valid,
                        const int32_t *seg, fa_geom g) {
    __shared__ fa_bwd_q_smem<HS> sm;
    int T = g.T, Tq = g.Tq, W = g.W, hs = g.hs, ldo = g.NH * hs;
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int b = blockIdx.y / g.NH, h = blockIdx.y % g.NH, q0 = blockIdx.x * FA_BM,
        t0 = q0 + w * FA_ROWS;
    const float *row0 = qkv + (size_t)b * T * W, *kb = row0 + g.kofs + (h / g.grp) * hs,
                *vb = row0 + g.vofs + (h / g.grp) * hs;
    size_t og = (size_t)b * Tq * ldo + h * hs; // the head's output (gradient) rows
    const uint8_t *vm = valid ? valid + (size_t)b * T : NULL;
    const int32_t *sg = CAUSAL && seg ? seg + (size_t)b * T : NULL;
    const __nv_bfloat16 *qw = sm.q + w * FA_ROWS * HS, *gw = sm.g + w * FA_ROWS * HS;
    float *sw = sm.s[w], *dpw = sm.dp[w];
    __nv_bfloat16 *dsw = sm.ds[w];
    load_tile<HS>(sm.q, row0 + h * hs, q0, FA_BM, Tq, hs, W);
    load_tile<HS>(sm.g, dout + og, q0, FA_BM, Tq, hs, ldo);
    // each row's L and D (every lane holds them; rows past Tq: p = 0)
    float L[FA_ROWS], D[FA_ROWS];
    const float *lr = lse + ((size_t)b * g.NH + h) * Tq;
#pragma unroll
    for (int r = 0; r < FA_ROWS; r++) {
        int t = t0 + r;
        float x = 0;
        for (int d = lane; t < Tq && d < hs; d += 32)
            x += dout[og + (size_t)t * ldo + d] * out[og + (size_t)t * ldo + d];
        D[r] = warp_sum(x);
        L[r] = t < Tq ? lr[t] : INFINITY;
        if (lane == 0 && t < Tq) Dout[((size_t)b * g.NH + h) * Tq + t] = D[r];
    }
    size_t mb = (((size_t)b * g.NHall + g.h0 + h) * Tq + t0) * T; // row 0's dropout masks
    float ks_drop = g.pdrop > 0 ? 1.0f / (1.0f - g.pdrop) : 1.0f;
    frag_c dq[HS / 16];
#pragma unroll
    for (int c = 0; c < HS / 16; c++)
        wmma::fill_fragment(dq[c], 0.0f);
    int kend = CAUSAL ? min(T, q0 + FA_BM) : T; // the keys the block's rows may see
    for (int k0 = 0; k0 < kend; k0 += FA_BN) {
        bool ok;
        if (!key_tile<HS, CAUSAL>(sm.k, sm.v, sw, qw, kb, vb, vm, k0, T, hs, W, t0 + FA_ROWS - 1,
                                  &ok))
            continue;
        tile_scores<HS>(dpw, gw, sm.v); // dP (before the dropout masks) = dout v^T
        int j = k0 + lane;
#pragma unroll
        for (int r = 0; r < FA_ROWS; r++) {
            bool sees = fa_sees<CAUSAL>(ok, j, t0 + r, T, sg);
            float p = sees ? expf(sw[r * FA_BN + lane] * g.scale - L[r]) : 0.0f;
            float dp = dpw[r * FA_BN + lane];
            if (g.pdrop > 0)
                dp = rf_keep(g.seed, (mb + (size_t)r * T) + j, g.pdrop) ? dp * ks_drop : 0.0f;
            dsw[r * FA_BN + lane] = __float2bfloat16(p * (dp - D[r]) * g.scale);
        }
        __syncwarp();
#pragma unroll
        for (int c = 0; c < HS / 16; c++)
            for (int n = 0; n < FA_BN / 16; n++) {
                frag_a a;
                frag_v kf; // k as the right operand, row-major: key n * 16 + i, channel c * 16 + j
                wmma::load_matrix_sync(a, dsw + n * 16, FA_BN);
                wmma::load_matrix_sync(kf, sm.k + (size_t)n * 16 * HS + c * 16, HS);
                wmma::mma_sync(dq[c], a, kf, dq[c]);
            }
        __syncwarp(); // ds is read before the next tile's overwrite it
    }
#pragma unroll
    for (int c = 0; c < HS / 16; c++)
        add_out(dqkv + (size_t)b * T * W + h * hs, W, dq[c], sw, t0, Tq, c * 16, hs);
}

template <int HS> struct fa_bwd_kv_smem {
    alignas(32) __nv_bfloat16 k[FA_BM * HS];                 // the block's keys
    alignas(32) __nv_bfloat16 v[FA_BM * HS];                 // their values
    alignas(32) __nv_bfloat16 q[FA_BN * HS];                 // a query tile
    alignas(32) __nv_bfloat16 g[FA_BN * HS];                 // its output gradients
    alignas(32) float s[FA_WARPS][FA_ROWS * FA_BN];          // a warp's S^T, then dP^T
    alignas(32) __nv_bfloat16 p[FA_WARPS][FA_ROWS * FA_BN];  // ... dropped P^T
    alignas(32) __nv_bfloat16 ds[FA_WARPS][FA_ROWS * FA_BN]; // ... and ds^T
    float L[FA_BN], D[FA_BN];                                // the query tile's L and D
};

// A block takes 64 keys of one (sequence, kv head) and, for each query head
// of its group, walks the query tiles (the causal attention: from the first
// that may see them); a warp takes 16 of the keys, a lane one query of the
// tile.
template <int HS, bool CAUSAL>
__global__ static void __launch_bounds__(FA_WARPS * 32)
    flash_bwd_dkv_kernel(float *dqkv, const float *qkv, const float *dout, const float *lse,
                         const float *Dg, const uint8_t *valid, const int32_t *seg, fa_geom g) {
    __shared__ fa_bwd_kv_smem<HS> sm;
    int T = g.T, Tq = g.Tq, W = g.W, hs = g.hs, ldo = g.NH * hs, NKV = g.NH / g.grp;
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int b = blockIdx.y / NKV, kv = blockIdx.y % NKV, jb = blockIdx.x * FA_BM, j0 = jb + w * FA_ROWS;
    const float *row0 = qkv + (size_t)b * T * W;
    const uint8_t *vm = valid ? valid + (size_t)b * T : NULL;
    const int32_t *sg = CAUSAL && seg ? seg + (size_t)b * T : NULL;
    const __nv_bfloat16 *kw = sm.k + w * FA_ROWS * HS, *vw = sm.v + w * FA_ROWS * HS;
    float *sw = sm.s[w];
    __nv_bfloat16 *pw = sm.p[w], *dsw = sm.ds[w];
    load_tile<HS>(sm.k, row0 + g.kofs + kv * hs, jb, FA_BM, T, hs, W);
    load_tile<HS>(sm.v, row0 + g.vofs + kv * hs, jb, FA_BM, T, hs, W);
    // the warp's keys that are valid keys of the sequence, a bit each
    unsigned okm = 0;
    for (int r = 0; r < FA_ROWS; r++)
        okm |= (unsigned)(j0 + r < T && (!vm || vm[j0 + r])) << r;
    float ks_drop = g.pdrop > 0 ? 1.0f / (1.0f - g.pdrop) : 1.0f;
    frag_c dk[HS / 16], dv[HS / 16];
#pragma unroll
    for (int c = 0; c < HS / 16; c++)
        wmma::fill_fragment(dk[c], 0.0f), wmma::fill_fragment(dv[c], 0.0f);
    for (int h = kv * g.grp; h < (kv + 1) * g.grp; h++) {
        size_t lo = ((size_t)b * g.NH + h) * Tq, mb = ((size_t)b * g.NHall + g.h0 + h) * Tq * T;
        for (int q0 = CAUSAL ? jb / FA_BN * FA_BN : 0; q0 < Tq; q0 += FA_BN) {
            __syncthreads(); // the previous query tile is no longer read (and k, v are loaded)
            load_tile<HS>(sm.q, row0 + h * hs, q0, FA_BN, Tq, hs, W);
            load_tile<HS>(sm.g, dout + (size_t)b * Tq * ldo + h * hs, q0, FA_BN, Tq, hs, ldo);
            for (int i = threadIdx.x; i < FA_BN; i += blockDim.x) {
                bool in = q0 + i < Tq;
                sm.L[i] = in ? lse[lo + q0 + i] : INFINITY; // a row past Tq: p = 0
                sm.D[i] = in ? Dg[lo + q0 + i] : 0.0f;
            }
            __syncthreads();
            if (CAUSAL && j0 > q0 + FA_BN - 1) continue; // the warp's keys all after the tile's
            // the lane's query t = q0 + lane against the warp's 16 keys: S^T
            int t = q0 + lane;
            float Lt = sm.L[lane], Dt = sm.D[lane], pr[FA_ROWS];
            size_t mt = mb + (size_t)t * T + j0; // the mask of (t, key j0)
            unsigned keep = 0;
            tile_scores<HS>(sw, kw, sm.q);
#pragma unroll
            for (int r = 0; r < FA_ROWS; r++) {
                bool sees = fa_sees<CAUSAL>(okm >> r & 1, j0 + r, t, T, sg);
                pr[r] = sees ? expf(sw[r * FA_BN + lane] * g.scale - Lt) : 0.0f;
                bool kp = g.pdrop <= 0 || (t < Tq && rf_keep(g.seed, mt + r, g.pdrop));
                keep |= (unsigned)kp << r;
                pw[r * FA_BN + lane] = __float2bfloat16(kp ? pr[r] * ks_drop : 0.0f);
            }
            __syncwarp();                  // S^T is read before dP^T overwrites it
            tile_scores<HS>(sw, vw, sm.g); // dP^T (before the masks) = v dout^T
#pragma unroll
            for (int r = 0; r < FA_ROWS; r++) {
                float dp = (keep >> r & 1) ? sw[r * FA_BN + lane] * ks_drop : 0.0f;
                dsw[r * FA_BN + lane] = __float2bfloat16(pr[r] * (dp - Dt) * g.scale);
            }
            __syncwarp();
#pragma unroll
            for (int c = 0; c < HS / 16; c++)
                for (int n = 0; n < FA_BN / 16; n++) {
                    frag_a a;
                    frag_v x; // the query tile's rows n * 16.., channels c * 16..
                    wmma::load_matrix_sync(a, pw + n * 16, FA_BN);
                    wmma::load_matrix_sync(x, sm.g + (size_t)n * 16 * HS + c * 16, HS);
                    wmma::mma_sync(dv[c], a, x, dv[c]);
                    wmma::load_matrix_sync(a, dsw + n * 16, FA_BN);
                    wmma::load_matrix_sync(x, sm.q + (size_t)n * 16 * HS + c * 16, HS);
                    wmma::mma_sync(dk[c], a, x, dk[c]);
                }
            __syncwarp(); // P^T and ds^T are read before the next tile's overwrite them
        }
    }
    float *drow = dqkv + (size_t)b * T * W + kv * hs;
#pragma unroll
    for (int c = 0; c < HS / 16; c++) {
        add_out(drow + g.kofs, W, dk[c], sw, j0, T, c * 16, hs);
        add_out(drow + g.vofs, W, dv[c], sw, j0, T, c * 16, hs);
    }
}

bool rf_cu_flash_fits(int hs) {
    return hs >= 1 && hs <= 64;
}

// LAUNCH(HS) for the head size hs rounded up to a multiple of 16.
#define FA_SWITCH(hs, LAUNCH)                                                                      \
    switch (((hs) + 15) / 16) {                                                                    \
    case 1:                                                                                        \
        LAUNCH(16);                                                                                \
        break;                                                                                     \
    case 2:                                                                                        \
        LAUNCH(32);                                                                                \
        break;                                                                                     \
    case 3:                                                                                        \
        LAUNCH(48);                                                                                \
        break;                                                                                     \
    default:                                                                                       \
        LAUNCH(64);                                                                                \
        break;                                                                                     \
    }

static int fa_check(int B, int NH, int hs) {
    if (!rf_cu_flash_fits(hs))
        return rf_fail(RF_ERR_INVALID, "cuda fused attention: head size %d", hs);
    if ((long long)B * NH > 65535)
        return rf_fail(RF_ERR_INVALID, "cuda fused attention: %d sequences x %d heads", B, NH);
    return RF_OK;
}

// The launch for either attention, the head padded to whole tiles; lse not
// NULL: the backward's statistics instead of out.
template <bool CAUSAL>
static int flash_launch(rf_cuda_ctx *c, float *out, float *lse, const float *qkv,
                        const uint8_t *valid, const int32_t *seg, int B, int T, int Tq, int W,
                        int kofs, int vofs, int NH, int grp, int hs, int h0, int NHall, float pdrop,
                        uint64_t seed) {
    int rc = fa_check(B, NH, hs);
    if (rc) return rc;
    dim3 grid((unsigned)((Tq + FA_BM - 1) / FA_BM), (unsigned)(B * NH));
    float scale = 1.0f / sqrtf((float)hs);
#define FA_LAUNCH(P)                                                                               \
    flash_fwd_kernel<P, CAUSAL>                                                                    \
        <<<grid, FA_WARPS * 32, 0, c->stream>>>(out, lse, qkv, valid, seg, T, Tq, W, kofs, vofs,   \
                                                NH, grp, hs, h0, NHall, scale, pdrop, seed)
    FA_SWITCH(hs, FA_LAUNCH)
#undef FA_LAUNCH
    return cu_launched(lse      ? "attention_fwd (fused statistics)"
                       : CAUSAL ? "causal_attention_fwd (fused)"
                                : "attention_fwd (fused)");
}

int rf_cu_flash_fwd(rf_cuda_ctx *c, float *out, float *lse, const float *qkv, const uint8_t *valid,
                    int B, int T, int Tq, int C, int NH, int h0, int NHall, float pdrop,
                    uint64_t seed) {
    return flash_launch<false>(c, out, lse, qkv, valid, NULL, B, T, Tq, 3 * C, C, 2 * C, NH, 1,
                               C / NH, h0, NHall, pdrop, seed);
}

int rf_cu_flash_causal_fwd(rf_cuda_ctx *c, float *out, float *lse, const float *qkv,
                           const uint8_t *valid, const int32_t *seg, int B, int T, int NH, int NKV,
                           int hs) {
    int A = NH * hs;
    return flash_launch<true>(c, out, lse, qkv, valid, seg, B, T, T, A + 2 * NKV * hs, A,
                              A + NKV * hs, NH, NH / NKV, hs, 0, NH, 0.0f, 0);
}

// The backward's two kernels for either attention (g.scale set here).
template <bool CAUSAL>
static int flash_bwd_launch(rf_cuda_ctx *c, float *dqkv, float *D, const float *lse,
                            const float *qkv, const float *out, const float *dout,
                            const uint8_t *valid, const int32_t *seg, int B, fa_geom g) {
    int rc = fa_check(B, g.NH, g.hs);
    if (rc) return rc;
    g.scale = 1.0f / sqrtf((float)g.hs);
    dim3 gq((unsigned)((g.Tq + FA_BM - 1) / FA_BM), (unsigned)(B * g.NH));
    dim3 gk((unsigned)((g.T + FA_BM - 1) / FA_BM), (unsigned)(B * (g.NH / g.grp)));
#define FA_LAUNCH(P)                                                                               \
    flash_bwd_dq_kernel<P, CAUSAL>                                                                 \
        <<<gq, FA_WARPS * 32, 0, c->stream>>>(dqkv, D, qkv, out, dout, lse, valid, seg, g)
    FA_SWITCH(g.hs, FA_LAUNCH)
#undef FA_LAUNCH
    if ((rc = cu_launched(CAUSAL ? "causal_attention_bwd (fused queries)"
                                 : "attention_bwd (fused queries)")))
        return rc;
#define FA_LAUNCH(P)                                                                               \
    flash_bwd_dkv_kernel<P, CAUSAL>                                                                \
        <<<gk, FA_WARPS * 32, 0, c->stream>>>(dqkv, qkv, dout, lse, D, valid, seg, g)
    FA_SWITCH(g.hs, FA_LAUNCH)
#undef FA_LAUNCH
    return cu_launched(CAUSAL ? "causal_attention_bwd (fused keys and values)"
                              : "attention_bwd (fused keys and values)");
}

int rf_cu_flash_bwd(rf_cuda_ctx *c, float *dqkv, float *D, const float *lse, const float *qkv,
                    const float *out, const float *dout, const uint8_t *valid, int B, int T, int Tq,
                    int C, int NH, int h0, int NHall, float pdrop, uint64_t seed) {
    fa_geom g = {T, Tq, 3 * C, C, 2 * C, NH, 1, C / NH, h0, NHall, 0.0f, pdrop, seed};
    return flash_bwd_launch<false>(c, dqkv, D, lse, qkv, out, dout, valid, NULL, B, g);
}

int rf_cu_flash_causal_bwd(rf_cuda_ctx *c, float *dqkv, float *D, const float *lse,
                           const float *qkv, const float *out, const float *dout,
                           const uint8_t *valid, const int32_t *seg, int B, int T, int NH, int NKV,
                           int hs) {
    int A = NH * hs;
    fa_geom g = {T, T, A + 2 * NKV * hs, A, A + NKV * hs, NH, NH / NKV, hs, 0, NH, 0.0f, 0.0f, 0};
    return flash_bwd_launch<true>(c, dqkv, D, lse, qkv, out, dout, valid, seg, B, g);
}
