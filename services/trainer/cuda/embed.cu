// Embedding forward and backward; twin of rf_op_embed_fwd/bwd (ops.c).
#include "trainer/cuda/ops_cuda.cuh"

__global__ static void embed_fwd_kernel(float *out, const int32_t *ids, const int32_t *types,
                                        const float *wte, const float *wpe, const float *wtt, int T,
                                        int C, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / C;
    int c = (int)(i % C);
    out[i] =
        wte[(size_t)ids[n] * C + c] + wpe[(size_t)(n % T) * C + c] + wtt[(size_t)types[n] * C + c];
}

int rf_cu_embed_fwd(const rf_backend *be, float *out, const int32_t *ids, const int32_t *types,
                    const float *wte, const float *wpe, const float *wtt, int B, int T, int C) {
    size_t total = (size_t)B * T * C;
    if (!total) return RF_OK;
    embed_fwd_kernel<<<cu_blocks(total, 256), 256, 0, cu_ctx(be)->stream>>>(out, ids, types, wte,
                                                                            wpe, wtt, T, C, total);
    return cu_launched("embed_fwd");
}

// Deterministic without atomics, and equal to the CPU twin bit for bit: a
// thread owns one channel of the destination rows in one of EMB_BUCKETS
// buckets (row id % EMB_BUCKETS) and visits the batch's rows in order, adding
// those that land in its bucket; so every destination element is summed by
// one thread in row order, the CPU's order, while C x EMB_BUCKETS threads
// work. Positions and token types are bucketed the same way.
#define EMB_BUCKETS 32

__global__ static void embed_bwd_kernel(float *dwte, float *dwpe, float *dwtt, const float *dout,
                                        const int32_t *ids, const int32_t *types, int N, int T,
                                        int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (c >= C) return;
    for (int n = 0; n < N; n++) {
        int id = ids[n], t = n % T, ty = types[n];
        bool w = id % EMB_BUCKETS == h, p = t % EMB_BUCKETS == h, y = ty % EMB_BUCKETS == h;
        if (!(w || p || y)) continue;
        float d = dout[(size_t)n * C + c];
        if (w) dwte[(size_t)id * C + c] += d;
        if (p) dwpe[(size_t)t * C + c] += d;
        if (y) dwtt[(size_t)ty * C + c] += d;
    }
}

int rf_cu_embed_bwd(const rf_backend *be, float *dwte, float *dwpe, float *dwtt, const float *dout,
                    const int32_t *ids, const int32_t *types, int B, int T, int C, int V, int TV) {
    (void)V;
    (void)TV;
    if (!B || !T || !C) return RF_OK;
    embed_bwd_kernel<<<dim3(cu_blocks(C, 64), EMB_BUCKETS), 64, 0, cu_ctx(be)->stream>>>(
        dwte, dwpe, dwtt, dout, ids, types, B * T, T, C);
    return cu_launched("embed_bwd");
}

// Tensor parallelism's vocabulary-parallel embedding; twins of
// rf_op_embed_rows_fwd, rf_op_embed_add_fwd and rf_op_embed_rows_bwd.
__global__ static void embed_rows_fwd_kernel(float *out, const int32_t *ids, const float *w, int lo,
                                             int hi, int C, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / C;
    int id = ids[n];
    out[i] = id >= lo && id < hi ? w[(size_t)(id - lo) * C + i % C] : 0.0f;
}

int rf_cu_embed_rows_fwd(const rf_backend *be, float *out, const int32_t *ids, const float *w,
                         int lo, int hi, int N, int C) {
    size_t total = (size_t)N * C;
    if (!total) return RF_OK;
    embed_rows_fwd_kernel<<<cu_blocks(total, 256), 256, 0, cu_ctx(be)->stream>>>(out, ids, w, lo,
                                                                                 hi, C, total);
    return cu_launched("embed_rows_fwd");
}

__global__ static void embed_add_fwd_kernel(float *out, const int32_t *pos, const int32_t *types,
                                            const float *wpe, const float *wtt, int T, int C,
                                            size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / C;
    int c = (int)(i % C);
    float o = out[i] + wpe[(size_t)(pos ? pos[n] : (int)(n % T)) * C + c];
    out[i] = wtt ? o + wtt[(size_t)types[n] * C + c] : o;
}

int rf_cu_embed_add_fwd(const rf_backend *be, float *out, const int32_t *pos, const int32_t *types,
                        const float *wpe, const float *wtt, int B, int T, int C) {
    size_t total = (size_t)B * T * C;
    if (!total) return RF_OK;
    embed_add_fwd_kernel<<<cu_blocks(total, 256), 256, 0, cu_ctx(be)->stream>>>(
        out, pos, types, wpe, wtt, T, C, total);
    return cu_launched("embed_add_fwd");
}

// embed_bwd_kernel's scheme (a thread per channel and bucket, rows in order)
// on the rank's rows [lo, hi); positions and types when their gradients are
// wanted.
__global__ static void embed_rows_bwd_kernel(float *dw, float *dwpe, float *dwtt, const float *dout,
                                             const int32_t *ids, const int32_t *types, int lo,
                                             int hi, int N, int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (c >= C) return;
    for (int n = 0; n < N; n++) {
        int id = ids[n], t = n % T, ty = dwtt ? types[n] : 0; // types NULL without dwtt
        bool w = id >= lo && id < hi && (id - lo) % EMB_BUCKETS == h,
             p = dwpe && t % EMB_BUCKETS == h, y = dwtt && ty % EMB_BUCKETS == h;
        if (!(w || p || y)) continue;
        float d = dout[(size_t)n * C + c];
        if (w) dw[(size_t)(id - lo) * C + c] += d;
        if (p) dwpe[(size_t)t * C + c] += d;
        if (y) dwtt[(size_t)ty * C + c] += d;
    }
}

int rf_cu_embed_rows_bwd(const rf_backend *be, float *dw, float *dwpe, float *dwtt,
                         const float *dout, const int32_t *ids, const int32_t *types, int lo,
                         int hi, int B, int T, int C) {
    if (!B || !T || !C) return RF_OK;
    embed_rows_bwd_kernel<<<dim3(cu_blocks(C, 64), EMB_BUCKETS), 64, 0, cu_ctx(be)->stream>>>(
        dw, dwpe, dwtt, dout, ids, types, lo, hi, B * T, T, C);
    return cu_launched("embed_rows_bwd");
}
