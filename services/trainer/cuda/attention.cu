// Multi-head self-attention with padding masks, fused; twin of
// rf_op_attention_fwd/bwd (same layout: qkv[B*T, 3C], att[B,NH,Tq,T]).
//
// Forward is one kernel: a warp per query row computes its scores against all
// T keys into shared memory (T <= 512, so a whole row fits and no online
// softmax is needed), the masked softmax, the dropout mask (the hash of
// ops.c, element index bh*Tq*T + t*T + j as on the CPU) and the product with
// V, without writing the score matrix; the softmax probabilities go to att
// because the backend's backward contract reads them (as the CPU twin).
// Backward is two kernels without atomics: per query row (ds into scratch,
// dq), then per key row (dk, dv), every sum in a fixed order, so results are
// deterministic.
#include "trainer/cuda/ops_cuda.cuh"

#define ATT_WARPS 4
#define ATT_MAX_T 512

__global__ static void attention_fwd_kernel(float *out, float *att, const float *qkv,
                                            const uint8_t *valid, int T, int Tq, int C, int NH,
                                            float pdrop, uint64_t seed) {
    extern __shared__ float sh[];
    int hs = C / NH, ld = 3 * C, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.x, b = bh / NH, h = bh % NH, t = blockIdx.y * ATT_WARPS + warp;
    float *row = sh + (size_t)warp * (T + hs), *sq = row + T;
    if (t >= Tq) return;
    const float *q = qkv + ((size_t)b * T + t) * ld + (size_t)h * hs;
    for (int d = lane; d < hs; d += 32)
        sq[d] = q[d];
    __syncwarp();
    const uint8_t *vb = valid + (size_t)b * T;
    float scale = 1.0f / sqrtf((float)hs), mx = -INFINITY;
    for (int j = lane; j < T; j += 32) {
        const float *k = qkv + ((size_t)b * T + j) * ld + C + (size_t)h * hs;
        float s = 0;
        for (int d = 0; d < hs; d++)
            s += sq[d] * k[d];
        s *= scale;
        row[j] = s;
        if (vb[j] && s > mx) mx = s;
    }
    mx = warp_max(mx);
    float sum = 0;
    for (int j = lane; j < T; j += 32) {
        float e = vb[j] ? expf(row[j] - mx) : 0.0f;
        row[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    float inv = sum > 0 ? 1.0f / sum : 0.0f, ks = pdrop > 0 ? 1.0f / (1.0f - pdrop) : 1.0f;
    size_t base = (size_t)bh * Tq * T + (size_t)t * T;
    for (int j = lane; j < T; j += 32) {
        float p = row[j] * inv;
        att[base + j] = p;
        row[j] = pdrop > 0 ? (rf_keep(seed, base + j, pdrop) ? p * ks : 0.0f) : p;
    }
    __syncwarp();
    float *o = out + ((size_t)b * Tq + t) * C + (size_t)h * hs;
    for (int d = lane; d < hs; d += 32) {
        const float *v = qkv + (size_t)b * T * ld + 2 * C + (size_t)h * hs + d;
        float acc = 0;
        for (int j = 0; j < T; j++)
            acc += row[j] * v[(size_t)j * ld];
        o[d] = acc;
    }
}

static int check_shape(int T, int C, int NH) {
    if (T > ATT_MAX_T)
        return rf_fail(RF_ERR_UNSUPPORTED, "cuda attention: sequence length %d above %d", T,
                       ATT_MAX_T);
    if (NH <= 0 || C % NH)
        return rf_fail(RF_ERR_INVALID, "cuda attention: %d channels in %d heads", C, NH);
    return RF_OK;
}

int rf_cu_attention_fwd(const rf_backend *be, float *out, float *att, float *scratch,
                        const float *qkv, const uint8_t *valid, int B, int T, int Tq, int C, int NH,
                        float pdrop, uint64_t seed) {
    (void)scratch;
    int rc = check_shape(T, C, NH);
    if (rc || B <= 0 || Tq <= 0) return rc;
    dim3 grid(B * NH, cu_blocks(Tq, ATT_WARPS));
    size_t shmem = (size_t)ATT_WARPS * (T + C / NH) * sizeof(float);
    attention_fwd_kernel<<<grid, ATT_WARPS * 32, shmem, cu_ctx(be)->stream>>>(
        out, att, qkv, valid, T, Tq, C, NH, pdrop, seed);
    return cu_launched("attention_fwd");
}

// Per query row t: dp[j] = dout_t . v_j through dropout, ds = p (dp - p.dp)
// scale into scratch, and dq_t += sum_j ds[j] k_j.
__global__ static void attention_bwd_q_kernel(float *dqkv, float *scratch, const float *dout,
                                              const float *qkv, const float *att, int T, int Tq,
                                              int C, int NH, float pdrop, uint64_t seed) {
    extern __shared__ float sh[];
    int hs = C / NH, ld = 3 * C, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.x, b = bh / NH, h = bh % NH, t = blockIdx.y * ATT_WARPS + warp;
    float *row = sh + (size_t)warp * (T + hs), *sd = row + T;
    if (t >= Tq) return;
    const float *d = dout + ((size_t)b * Tq + t) * C + (size_t)h * hs;
    for (int i = lane; i < hs; i += 32)
        sd[i] = d[i];
    __syncwarp();
    size_t base = (size_t)bh * Tq * T + (size_t)t * T;
    float scale = 1.0f / sqrtf((float)hs), ks = pdrop > 0 ? 1.0f / (1.0f - pdrop) : 1.0f;
    float dot = 0;
    for (int j = lane; j < T; j += 32) {
        const float *v = qkv + ((size_t)b * T + j) * ld + 2 * C + (size_t)h * hs;
        float s = 0;
        for (int i = 0; i < hs; i++)
            s += sd[i] * v[i];
        if (pdrop > 0) s = rf_keep(seed, base + j, pdrop) ? s * ks : 0.0f;
        row[j] = s;
        dot += att[base + j] * s;
    }
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) {
        float ds = att[base + j] * (row[j] - dot) * scale;
        row[j] = ds;
        scratch[base + j] = ds;
    }
    __syncwarp();
    float *dq = dqkv + ((size_t)b * T + t) * ld + (size_t)h * hs;
    for (int i = lane; i < hs; i += 32) {
        const float *k = qkv + (size_t)b * T * ld + C + (size_t)h * hs + i;
        float acc = 0;
        for (int j = 0; j < T; j++)
            acc += row[j] * k[(size_t)j * ld];
        dq[i] += acc;
    }
}

// Per key row j: dk_j += sum_t ds[t][j] q_t, dv_j += sum_t p_dropped[t][j] dout_t.
__global__ static void attention_bwd_kv_kernel(float *dqkv, const float *scratch, const float *dout,
                                               const float *qkv, const float *att, int T, int Tq,
                                               int C, int NH, float pdrop, uint64_t seed) {
    int hs = C / NH, ld = 3 * C, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.x, b = bh / NH, h = bh % NH, j = blockIdx.y * ATT_WARPS + warp;
    if (j >= T) return;
    size_t blk = (size_t)bh * Tq * T;
    float ks = pdrop > 0 ? 1.0f / (1.0f - pdrop) : 1.0f;
    float *dk = dqkv + ((size_t)b * T + j) * ld + C + (size_t)h * hs, *dv = dk + C;
    for (int i = lane; i < hs; i += 32) {
        float ak = 0, av = 0;
        for (int t = 0; t < Tq; t++) {
            size_t e = blk + (size_t)t * T + j;
            const float *q = qkv + ((size_t)b * T + t) * ld + (size_t)h * hs;
            const float *d = dout + ((size_t)b * Tq + t) * C + (size_t)h * hs;
            float p = att[e];
            if (pdrop > 0) p = rf_keep(seed, e, pdrop) ? p * ks : 0.0f;
            ak += scratch[e] * q[i];
            av += p * d[i];
        }
        dk[i] += ak;
        dv[i] += av;
    }
}

int rf_cu_attention_bwd(const rf_backend *be, float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *att, int B, int T, int Tq, int C, int NH,
                        float pdrop, uint64_t seed) {
    int rc = check_shape(T, C, NH);
    if (rc || B <= 0 || Tq <= 0) return rc;
    cudaStream_t s = cu_ctx(be)->stream;
    size_t shmem = (size_t)ATT_WARPS * (T + C / NH) * sizeof(float);
    attention_bwd_q_kernel<<<dim3(B * NH, cu_blocks(Tq, ATT_WARPS)), ATT_WARPS * 32, shmem, s>>>(
        dqkv, scratch, dout, qkv, att, T, Tq, C, NH, pdrop, seed);
    if ((rc = cu_launched("attention_bwd (queries)"))) return rc;
    attention_bwd_kv_kernel<<<dim3(B * NH, cu_blocks(T, ATT_WARPS)), ATT_WARPS * 32, 0, s>>>(
        dqkv, scratch, dout, qkv, att, T, Tq, C, NH, pdrop, seed);
    return cu_launched("attention_bwd (keys)");
}
