// Token + position embedding of the causal models; twin of
// rf_op_tokpos_fwd/bwd (ops_causal.c). pos NULL is position n % T; wpe NULL
// (Llama) adds no position.
#include "trainer/cuda/ops_cuda.cuh"

__global__ static void tokpos_fwd_kernel(float *out, const int32_t *ids, const int32_t *pos,
                                         const float *wte, const float *wpe, int T, int C,
                                         size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / C;
    int c = (int)(i % C);
    float v = wte[(size_t)ids[n] * C + c];
    if (wpe) v += wpe[(size_t)(pos ? pos[n] : (int)(n % T)) * C + c];
    out[i] = v;
}

int rf_cu_tokpos_fwd(const rf_backend *be, float *out, const int32_t *ids, const int32_t *pos,
                     const float *wte, const float *wpe, int B, int T, int C) {
    if (B <= 0 || T <= 0 || C <= 0) return RF_OK;
    size_t total = (size_t)B * T * C;
    tokpos_fwd_kernel<<<cu_blocks(total, 256), 256, 0, cu_ctx(be)->stream>>>(out, ids, pos, wte,
                                                                             wpe, T, C, total);
    return cu_launched("tokpos_fwd");
}

// Without atomics and bit for bit the CPU's sums, as embed.cu: a thread owns
// one channel of the destination rows in one of TP_BUCKETS buckets (row index
// % TP_BUCKETS) and visits the batch's rows in order, adding those that land
// in its bucket, so each element of dwte and dwpe is summed by one thread in
// row order.
#define TP_BUCKETS 32

__global__ static void tokpos_bwd_kernel(float *dwte, float *dwpe, const float *dout,
                                         const int32_t *ids, const int32_t *pos, int N, int T,
                                         int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (c >= C) return;
    for (int n = 0; n < N; n++) {
        int id = ids[n], p = pos ? pos[n] : n % T;
        bool w = dwte && id % TP_BUCKETS == h, q = dwpe && p % TP_BUCKETS == h;
        if (!(w || q)) continue;
        float d = dout[(size_t)n * C + c];
        if (w) dwte[(size_t)id * C + c] += d;
        if (q) dwpe[(size_t)p * C + c] += d;
    }
}

int rf_cu_tokpos_bwd(const rf_backend *be, float *dwte, float *dwpe, const float *dout,
                     const int32_t *ids, const int32_t *pos, int B, int T, int C, int V, int P) {
    (void)V;
    (void)P;
    if (B <= 0 || T <= 0 || C <= 0 || (!dwte && !dwpe)) return RF_OK;
    tokpos_bwd_kernel<<<dim3(cu_blocks(C, 64), TP_BUCKETS), 64, 0, cu_ctx(be)->stream>>>(
        dwte, dwpe, dout, ids, pos, B * T, T, C);
    return cu_launched("tokpos_bwd");
}
