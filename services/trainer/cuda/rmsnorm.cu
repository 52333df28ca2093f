// RMSNorm (Llama) forward and backward; twin of rf_op_rmsnorm_fwd/bwd
// (ops_causal.c). One warp per row, the row sums in double as on the CPU;
// the weight gradient is a column sum in RMS_CHUNKS fixed chunks of rows
// (each chunk in row order, then the chunks in order), as layernorm.cu:
// deterministic without atomics.
#include "trainer/cuda/ops_cuda.cuh"

__global__ static void rmsnorm_fwd_kernel(float *out, float *rstd, const float *inp, const float *w,
                                          int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    double ss = 0;
    for (int i = lane; i < C; i += 32)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(warp_sum_d(ss) / C + eps));
    float *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32)
        o[i] = w[i] * (x[i] * r);
    if (lane == 0) rstd[row] = r;
}

int rf_cu_rmsnorm_fwd(const rf_backend *be, float *out, float *rstd, const float *inp,
                      const float *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return RF_OK;
    rmsnorm_fwd_kernel<<<cu_blocks(N, 4), 128, 0, cu_ctx(be)->stream>>>(out, rstd, inp, w, N, C,
                                                                        eps);
    return cu_launched("rmsnorm_fwd");
}

__global__ static void rmsnorm_bwd_inp_kernel(float *dinp, const float *dout, const float *inp,
                                              const float *w, const float *rstd, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float r = rstd[row];
    double s = 0;
    for (int i = lane; i < C; i += 32)
        s += (double)d[i] * w[i] * x[i];
    float k = (float)(warp_sum_d(s) / C) * r * r;
    float *di = dinp + (size_t)row * C;
    for (int i = lane; i < C; i += 32)
        di[i] += r * (d[i] * w[i] - x[i] * k);
}

#define RMS_CHUNKS 64

__global__ static void rmsnorm_bwd_w_part_kernel(float *part, const float *dout, const float *inp,
                                                 const float *rstd, int N, int C, int per) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
    if (c >= C) return;
    int n0 = k * per, n1 = n0 + per < N ? n0 + per : N;
    float g = 0;
    for (int n = n0; n < n1; n++)
        g += dout[(size_t)n * C + c] * (inp[(size_t)n * C + c] * rstd[n]);
    part[(size_t)k * C + c] = g;
}

__global__ static void rmsnorm_bwd_w_sum_kernel(float *dw, const float *part, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float g = 0;
    for (int k = 0; k < RMS_CHUNKS; k++)
        g += part[(size_t)k * C + c];
    dw[c] += g;
}

int rf_cu_rmsnorm_bwd(const rf_backend *be, float *dinp, float *dw, const float *dout,
                      const float *inp, const float *w, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return RF_OK;
    rf_cuda_ctx *c = cu_ctx(be);
    rmsnorm_bwd_inp_kernel<<<cu_blocks(N, 4), 128, 0, c->stream>>>(dinp, dout, inp, w, rstd, N, C);
    int rc = cu_launched("rmsnorm_bwd");
    if (rc || !dw) return rc; // dw NULL: a frozen norm
    if ((rc = rf_cuda_part(c, (size_t)RMS_CHUNKS * C))) return rc;
    // chunks past N (N < RMS_CHUNKS) write zeros: the sum kernel reads them all
    int per = (N + RMS_CHUNKS - 1) / RMS_CHUNKS;
    rmsnorm_bwd_w_part_kernel<<<dim3(cu_blocks(C, 128), RMS_CHUNKS), 128, 0, c->stream>>>(
        c->part, dout, inp, rstd, N, C, per);
    if ((rc = cu_launched("rmsnorm_bwd (weight partials)"))) return rc;
    rmsnorm_bwd_w_sum_kernel<<<cu_blocks(C, 128), 128, 0, c->stream>>>(dw, c->part, C);
    return cu_launched("rmsnorm_bwd (weights)");
}
