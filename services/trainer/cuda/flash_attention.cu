// The encoder attention's forward fused on tensor cores (flash-attention
// style): out = softmax(q k^T scale over the valid keys) v, dropped as the
// unfused path drops it, with no T x T matrix in memory; a twin of
// rf_op_attention_fwd's output. attention.cu calls it on cuda-bf16 when the
// forward wants out alone (the probabilities not kept: the model's forward,
// whose backward recomputes them by the unfused path, which leaves them and
// their dropout where the backward reads them; evaluation), for head sizes
// up to 64 (padded with zeros to a multiple of 16). Attention dropout uses
// the unfused path's masks (rf_keep over the same element indices).
// REFINERY_FUSED_ATTENTION=0 turns it off (the unfused path, to compare).
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

// The key tile at k0 (and its values, vb not NULL) into shared memory, by
// the whole block. False for a warp whose rows all lie above the tile (the
// causal attention: it skips it); else the warp's scores are in sw and *ok
// says whether the lane's key k0 + lane is a valid key of the sequence.
template <int HS, bool CAUSAL>
__device__ static bool key_tile(fa_smem<HS> &sm, float *sw, const __nv_bfloat16 *qw,
                                const float *kb, const float *vb, const uint8_t *vm, int k0, int T,
                                int hs, int W, int tlast, bool *ok) {
    __syncthreads(); // the previous tile is no longer read (and q is loaded)
    load_tile<HS>(sm.k, kb, k0, FA_BN, T, hs, W);
    if (vb) load_tile<HS>(sm.v, vb, k0, FA_BN, T, hs, W);
    __syncthreads();
    if (CAUSAL && k0 > tlast) return false;
    tile_scores<HS>(sw, qw, sm.k);
    int j = k0 + threadIdx.x % 32;
    *ok = j < T && (!vm || vm[j]);
    return true;
}

// One kernel for both attentions. The encoder's (CAUSAL false): qkv rows of
// W = 3 C, key and value heads at C and 2 C (grp 1), the valid mask on
// keys, dropout. The causal one: query head h reads kv head h / grp at
// columns kofs and vofs, and query t sees key j when j <= t, valid[j], and
// seg[j] == seg[t] (valid, seg NULL: no such mask); key tiles wholly above
// the block's diagonal are skipped, and a warp skips its products on those
// above its own. out rows have NH hs floats.
template <int HS, bool CAUSAL>
__global__ static void __launch_bounds__(FA_WARPS * 32)
    flash_fwd_kernel(float *out, const float *qkv, const uint8_t *valid, const int32_t *seg, int T,
                     int Tq, int W, int kofs, int vofs, int NH, int grp, int hs, int h0, int NHall,
                     float scale, float pdrop, uint64_t seed) {
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
        if (!key_tile<HS, CAUSAL>(sm, sw, qw, kb, NULL, vm, k0, T, hs, W, tlast, &ok)) continue;
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
        if (!key_tile<HS, CAUSAL>(sm, sw, qw, kb, vb, vm, k0, T, hs, W, tlast, &ok)) continue;
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

bool rf_cu_flash_fits(int hs) {
    return hs >= 1 && hs <= 64;
}

// The launch for either attention, the head padded to whole tiles.
template <bool CAUSAL>
static int flash_launch(rf_cuda_ctx *c, float *out, const float *qkv, const uint8_t *valid,
                        const int32_t *seg, int B, int T, int Tq, int W, int kofs, int vofs, int NH,
                        int grp, int hs, int h0, int NHall, float pdrop, uint64_t seed) {
    if (!rf_cu_flash_fits(hs))
        return rf_fail(RF_ERR_INVALID, "cuda fused attention: head size %d", hs);
    if ((long long)B * NH > 65535)
        return rf_fail(RF_ERR_INVALID, "cuda fused attention: %d sequences x %d heads", B, NH);
    dim3 grid((unsigned)((Tq + FA_BM - 1) / FA_BM), (unsigned)(B * NH));
    float scale = 1.0f / sqrtf((float)hs);
#define FA_LAUNCH(P)                                                                               \
    flash_fwd_kernel<P, CAUSAL><<<grid, FA_WARPS * 32, 0, c->stream>>>(                            \
        out, qkv, valid, seg, T, Tq, W, kofs, vofs, NH, grp, hs, h0, NHall, scale, pdrop, seed)
    switch ((hs + 15) / 16) {
    case 1:
        FA_LAUNCH(16);
        break;
    case 2:
        FA_LAUNCH(32);
        break;
    case 3:
        FA_LAUNCH(48);
        break;
    default:
        FA_LAUNCH(64);
        break;
    }
#undef FA_LAUNCH
    return cu_launched(CAUSAL ? "causal_attention_fwd (fused)" : "attention_fwd (fused)");
}

int rf_cu_flash_fwd(rf_cuda_ctx *c, float *out, const float *qkv, const uint8_t *valid, int B,
                    int T, int Tq, int C, int NH, int h0, int NHall, float pdrop, uint64_t seed) {
    return flash_launch<false>(c, out, qkv, valid, NULL, B, T, Tq, 3 * C, C, 2 * C, NH, 1, C / NH,
                               h0, NHall, pdrop, seed);
}

int rf_cu_flash_causal_fwd(rf_cuda_ctx *c, float *out, const float *qkv, const uint8_t *valid,
                           const int32_t *seg, int B, int T, int NH, int NKV, int hs) {
    int A = NH * hs;
    return flash_launch<true>(c, out, qkv, valid, seg, B, T, T, A + 2 * NKV * hs, A, A + NKV * hs,
                              NH, NH / NKV, hs, 0, NH, 0.0f, 0);
}
