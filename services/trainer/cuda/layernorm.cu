// Fused LayerNorm forward and backward; twin of rf_op_layernorm_fwd/bwd.
// Row statistics are summed in double (as the CPU twin), one warp per row;
// the weight gradients are column sums in a fixed order (see below).
#include "trainer/cuda/ops_cuda.cuh"

__global__ static void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *inp,
                                            const float *w, const float *b, int N, int C,
                                            float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    double s = 0;
    for (int i = lane; i < C; i += 32)
        s += x[i];
    float m = (float)(warp_sum_d(s) / C);
    double v = 0;
    for (int i = lane; i < C; i += 32)
        v += (double)(x[i] - m) * (x[i] - m);
    float r = (float)(1.0 / sqrt(warp_sum_d(v) / C + eps));
    float *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32)
        o[i] = (x[i] - m) * r * w[i] + b[i];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

int rf_cu_layernorm_fwd(const rf_backend *be, float *out, float *mean, float *rstd,
                        const float *inp, const float *w, const float *b, int N, int C, float eps) {
    if (N <= 0) return RF_OK;
    layernorm_fwd_kernel<<<cu_blocks(N, 4), 128, 0, cu_ctx(be)->stream>>>(out, mean, rstd, inp, w,
                                                                          b, N, C, eps);
    return cu_launched("layernorm_fwd");
}

__global__ static void layernorm_bwd_inp_kernel(float *dinp, const float *dout, const float *inp,
                                                const float *w, const float *mean,
                                                const float *rstd, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    double sd = 0, sdn = 0;
    for (int i = lane; i < C; i += 32) {
        float dn = d[i] * w[i];
        sd += dn;
        sdn += dn * (x[i] - m) * r;
    }
    float md = (float)(warp_sum_d(sd) / C), mdn = (float)(warp_sum_d(sdn) / C);
    float *di = dinp + (size_t)row * C;
    for (int i = lane; i < C; i += 32) {
        float norm = (x[i] - m) * r;
        di[i] += (d[i] * w[i] - md - norm * mdn) * r;
    }
}

// The weight gradients in two passes: LN_CHUNKS fixed chunks of rows, one
// thread per (channel, chunk) summing its rows in order into part, then one
// thread per channel adding the chunks in order: deterministic, and C x
// LN_CHUNKS threads instead of C.
#define LN_CHUNKS 64

__global__ static void layernorm_bwd_w_part_kernel(float *part, const float *dout, const float *inp,
                                                   const float *mean, const float *rstd, int N,
                                                   int C, int per) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
    if (c >= C) return;
    int n0 = k * per, n1 = n0 + per < N ? n0 + per : N;
    float gw = 0, gb = 0;
    for (int n = n0; n < n1; n++) {
        float d = dout[(size_t)n * C + c];
        gw += d * (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
        gb += d;
    }
    part[(size_t)k * 2 * C + c] = gw;
    part[(size_t)k * 2 * C + C + c] = gb;
}

__global__ static void layernorm_bwd_w_sum_kernel(float *dw, float *db, const float *part, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float gw = 0, gb = 0;
    for (int k = 0; k < LN_CHUNKS; k++) {
        gw += part[(size_t)k * 2 * C + c];
        gb += part[(size_t)k * 2 * C + C + c];
    }
    if (dw) dw[c] += gw;
    if (db) db[c] += gb;
}

int rf_cu_layernorm_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean, const float *rstd,
                        int N, int C) {
    if (N <= 0) return RF_OK;
    cudaStream_t s = cu_ctx(be)->stream;
    layernorm_bwd_inp_kernel<<<cu_blocks(N, 4), 128, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
    int rc = cu_launched("layernorm_bwd");
    if (rc || (!dw && !db)) return rc; // dw, db NULL: a frozen LayerNorm (LoRA)
    rf_cuda_ctx *c = cu_ctx(be);
    if ((rc = rf_cuda_part(c, (size_t)LN_CHUNKS * 2 * C))) return rc;
    int per = (N + LN_CHUNKS - 1) / LN_CHUNKS;
    layernorm_bwd_w_part_kernel<<<dim3(cu_blocks(C, 128), LN_CHUNKS), 128, 0, s>>>(
        c->part, dout, inp, mean, rstd, N, C, per);
    if ((rc = cu_launched("layernorm_bwd (weight partials)"))) return rc;
    layernorm_bwd_w_sum_kernel<<<cu_blocks(C, 128), 128, 0, s>>>(dw, db, c->part, C);
    return cu_launched("layernorm_bwd (weights)");
}
