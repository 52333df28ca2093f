// Causal self-attention with grouped-query heads, padding and packed-document
// masks; twin of rf_op_causal_attention_fwd/bwd (ops_causal.c), same layout:
// qkv[B*T, (NH + 2 NKV) hs], out[B*T, NH*hs], att[B,NH,T,T].
//
// Forward is one kernel: a warp per (sequence, query head, query row) holds
// its score row (keys 0..t) in shared memory, so T is bounded by shared
// memory (CA_MAX_T; no online softmax), takes the masked softmax (the sum in
// double, as the CPU) and the product with V; the probabilities go to att,
// zero above the diagonal and at masked keys, because backward reads them.
// Backward is two kernels without atomics, every sum in a fixed order:
//  1. a warp per query row: dp_j = dout_t . v_j, dot_t = sum_j p_j dp_j (into
//     scratch, B*NH*T floats), ds_j = p_j (dp_j - dot_t) / sqrt(hs), and
//     dq_t += sum_j ds_j k_j;
//  2. a warp per (sequence, kv head, key row j), lanes over channels: for the
//     group's query heads in order and queries t >= j in order, dp is
//     recomputed (a warp sum), ds from the stored dot, dk_j += ds q_t and
//     dv_j += p dout_t. The scratch holds one float per query row, so ds is
//     not stored.
#include "trainer/cuda/ops_cuda.cuh"

#define CA_WARPS  4
#define CA_MAX_T  2048 // CA_WARPS * (T + hs) floats of shared memory: 36 KiB at most
#define CA_MAX_HS 256  // channels per head: CA_MAX_HS / 32 registers per lane in backward
#define CA_REGS   (CA_MAX_HS / 32)

static_assert(CA_WARPS * (CA_MAX_T + CA_MAX_HS) * sizeof(float) <= 48 * 1024,
              "causal attention: shared memory above the default 48 KiB");

// Whether query t (segment st) sees key j of its sequence: valid and seg
// already point at the sequence's row (NULL: no such mask).
__device__ __forceinline__ static bool ca_sees(const uint8_t *valid, const int32_t *seg, int st,
                                               int t, int j) {
    return j <= t && (!valid || valid[j]) && (!seg || seg[j] == st);
}

__global__ static void causal_attention_fwd_kernel(float *out, float *att, const float *qkv,
                                                   const uint8_t *valid, const int32_t *seg, int T,
                                                   int NH, int NKV, int hs) {
    extern __shared__ float sh[];
    int W = (NH + 2 * NKV) * hs, grp = NH / NKV, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.x, b = bh / NH, h = bh % NH, g = h / grp, t = blockIdx.y * CA_WARPS + warp;
    float *row = sh + (size_t)warp * (T + hs), *sq = row + T;
    if (t >= T) return;
    const uint8_t *vb = valid ? valid + (size_t)b * T : NULL;
    const int32_t *sb = seg ? seg + (size_t)b * T : NULL;
    int st = sb ? sb[t] : 0;
    const float *q = qkv + ((size_t)b * T + t) * W + (size_t)h * hs;
    for (int i = lane; i < hs; i += 32)
        sq[i] = q[i];
    __syncwarp();
    float scale = 1.0f / sqrtf((float)hs), mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) {
        float s = 0;
        if (ca_sees(vb, sb, st, t, j)) {
            const float *k = qkv + ((size_t)b * T + j) * W + (size_t)(NH + g) * hs;
            for (int i = 0; i < hs; i++)
                s += sq[i] * k[i];
            s *= scale;
            mx = fmaxf(mx, s);
        }
        row[j] = s;
    }
    mx = warp_max(mx); // the same on every lane
    float *a = att + ((size_t)bh * T + t) * T;
    float *o = out + ((size_t)b * T + t) * NH * hs + (size_t)h * hs;
    if (mx == -INFINITY) { // no key to attend to: zero probabilities and output
        for (int j = lane; j < T; j += 32)
            a[j] = 0.0f;
        for (int i = lane; i < hs; i += 32)
            o[i] = 0.0f;
        return;
    }
    double sum = 0;
    for (int j = lane; j <= t; j += 32) {
        float e = ca_sees(vb, sb, st, t, j) ? expf(row[j] - mx) : 0.0f;
        row[j] = e;
        sum += e;
    }
    float inv = (float)(1.0 / warp_sum_d(sum));
    for (int j = lane; j < T; j += 32) {
        float p = j <= t ? row[j] * inv : 0.0f;
        if (j <= t) row[j] = p;
        a[j] = p;
    }
    __syncwarp();
    for (int i = lane; i < hs; i += 32) {
        const float *v = qkv + (size_t)b * T * W + (size_t)(NH + NKV + g) * hs + i;
        float acc = 0;
        for (int j = 0; j <= t; j++)
            acc += row[j] * v[(size_t)j * W];
        o[i] = acc;
    }
}

static int check_shape(int T, int NH, int NKV, int hs, const char *what) {
    if (NH <= 0 || NKV <= 0 || NH % NKV || hs <= 0)
        return rf_fail(RF_ERR_INVALID, "cuda %s: %d query heads, %d kv heads, head size %d", what,
                       NH, NKV, hs);
    if (T > CA_MAX_T)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "cuda %s: sequence length %d above %d (a score row must fit in shared "
                       "memory; no tiled kernel yet)",
                       what, T, CA_MAX_T);
    if (hs > CA_MAX_HS)
        return rf_fail(RF_ERR_UNSUPPORTED, "cuda %s: head size %d above %d", what, hs, CA_MAX_HS);
    return RF_OK;
}

int rf_cu_causal_attention_fwd(const rf_backend *be, float *out, float *att, const float *qkv,
                               const uint8_t *valid, const int32_t *seg, int B, int T, int NH,
                               int NKV, int hs) {
    int rc = check_shape(T, NH, NKV, hs, "causal_attention_fwd");
    if (rc || B <= 0 || T <= 0) return rc;
    dim3 grid((unsigned)B * NH, cu_blocks(T, CA_WARPS));
    size_t shmem = (size_t)CA_WARPS * (T + hs) * sizeof(float);
    causal_attention_fwd_kernel<<<grid, CA_WARPS * 32, shmem, cu_ctx(be)->stream>>>(
        out, att, qkv, valid, seg, T, NH, NKV, hs);
    return cu_launched("causal_attention_fwd");
}

__global__ static void causal_attention_bwd_q_kernel(float *dqkv, float *scratch, const float *dout,
                                                     const float *qkv, const float *att, int T,
                                                     int NH, int NKV, int hs) {
    extern __shared__ float sh[];
    int W = (NH + 2 * NKV) * hs, grp = NH / NKV, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.x, b = bh / NH, h = bh % NH, g = h / grp, t = blockIdx.y * CA_WARPS + warp;
    float *row = sh + (size_t)warp * (T + hs), *sd = row + T;
    if (t >= T) return;
    const float *d = dout + ((size_t)b * T + t) * NH * hs + (size_t)h * hs;
    for (int i = lane; i < hs; i += 32)
        sd[i] = d[i];
    __syncwarp();
    const float *a = att + ((size_t)bh * T + t) * T;
    double dot = 0;
    for (int j = lane; j <= t; j += 32) {
        float p = a[j], s = 0;
        if (p != 0.0f) {
            const float *v = qkv + ((size_t)b * T + j) * W + (size_t)(NH + NKV + g) * hs;
            for (int i = 0; i < hs; i++)
                s += sd[i] * v[i];
        }
        row[j] = s;
        dot += (double)p * s;
    }
    float fdot = (float)warp_sum_d(dot), scale = 1.0f / sqrtf((float)hs);
    if (lane == 0) scratch[(size_t)bh * T + t] = fdot;
    for (int j = lane; j <= t; j += 32) {
        float p = a[j];
        row[j] = p != 0.0f ? p * (row[j] - fdot) * scale : 0.0f;
    }
    __syncwarp();
    float *dq = dqkv + ((size_t)b * T + t) * W + (size_t)h * hs;
    for (int i = lane; i < hs; i += 32) {
        const float *k = qkv + (size_t)b * T * W + (size_t)(NH + g) * hs + i;
        float acc = 0;
        for (int j = 0; j <= t; j++)
            acc += row[j] * k[(size_t)j * W];
        dq[i] += acc;
    }
}

__global__ static void causal_attention_bwd_kv_kernel(float *dqkv, const float *scratch,
                                                      const float *dout, const float *qkv,
                                                      const float *att, int T, int NH, int NKV,
                                                      int hs) {
    int W = (NH + 2 * NKV) * hs, grp = NH / NKV, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int b = blockIdx.x / NKV, g = blockIdx.x % NKV, j = blockIdx.y * CA_WARPS + warp;
    if (j >= T) return;
    float scale = 1.0f / sqrtf((float)hs);
    float v[CA_REGS], dk[CA_REGS], dv[CA_REGS];
    const float *vj = qkv + ((size_t)b * T + j) * W + (size_t)(NH + NKV + g) * hs;
#pragma unroll
    for (int r = 0; r < CA_REGS; r++) {
        int i = lane + 32 * r;
        v[r] = i < hs ? vj[i] : 0.0f;
        dk[r] = dv[r] = 0.0f;
    }
    for (int h = g * grp; h < (g + 1) * grp; h++) {
        size_t bh = (size_t)b * NH + h;
        for (int t = j; t < T; t++) {
            float p = att[(bh * T + t) * T + j]; // the same on every lane
            if (p == 0.0f) continue;
            const float *d = dout + ((size_t)b * T + t) * NH * hs + (size_t)h * hs;
            const float *q = qkv + ((size_t)b * T + t) * W + (size_t)h * hs;
            float part = 0;
#pragma unroll
            for (int r = 0; r < CA_REGS; r++) {
                int i = lane + 32 * r;
                if (i < hs) part += d[i] * v[r];
            }
            float dp = warp_sum(part); // the same on every lane
            float ds = p * (dp - scratch[bh * T + t]) * scale;
#pragma unroll
            for (int r = 0; r < CA_REGS; r++) {
                int i = lane + 32 * r;
                if (i < hs) {
                    dk[r] += ds * q[i];
                    dv[r] += p * d[i];
                }
            }
        }
    }
    float *dkj = dqkv + ((size_t)b * T + j) * W + (size_t)(NH + g) * hs;
    float *dvj = dqkv + ((size_t)b * T + j) * W + (size_t)(NH + NKV + g) * hs;
#pragma unroll
    for (int r = 0; r < CA_REGS; r++) {
        int i = lane + 32 * r;
        if (i < hs) {
            dkj[i] += dk[r];
            dvj[i] += dv[r];
        }
    }
}

int rf_cu_causal_attention_bwd(const rf_backend *be, float *dqkv, float *scratch, const float *dout,
                               const float *qkv, const float *att, int B, int T, int NH, int NKV,
                               int hs) {
    int rc = check_shape(T, NH, NKV, hs, "causal_attention_bwd");
    if (rc || B <= 0 || T <= 0) return rc;
    cudaStream_t s = cu_ctx(be)->stream;
    size_t shmem = (size_t)CA_WARPS * (T + hs) * sizeof(float);
    causal_attention_bwd_q_kernel<<<dim3((unsigned)B * NH, cu_blocks(T, CA_WARPS)), CA_WARPS * 32,
                                    shmem, s>>>(dqkv, scratch, dout, qkv, att, T, NH, NKV, hs);
    if ((rc = cu_launched("causal_attention_bwd (queries)"))) return rc;
    causal_attention_bwd_kv_kernel<<<dim3((unsigned)B * NKV, cu_blocks(T, CA_WARPS)), CA_WARPS * 32,
                                     0, s>>>(dqkv, scratch, dout, qkv, att, T, NH, NKV, hs);
    return cu_launched("causal_attention_bwd (keys)");
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
    if (n <= 0) return RF_OK;
    if (NKV <= 0 || NH % NKV)
        return rf_fail(RF_ERR_INVALID, "cuda kv_attention: %d query heads over %d key/value heads",
                       NH, NKV);
    int warps = NH * n;
    kv_attention_kernel<<<(warps + CA_WARPS - 1) / CA_WARPS, CA_WARPS * 32, 0,
                          cu_ctx(be)->stream>>>(out, scores, qkv, kc, vc, n, len, NH, NKV, hd);
    return cu_launched("kv_attention_fwd");
}
