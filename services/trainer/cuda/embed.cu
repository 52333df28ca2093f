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

// One thread per channel visits the rows in order, exactly as the CPU twin:
// a token repeated in ids accumulates in the same order, without atomics, so
// the result is deterministic and equal to the CPU's bit for bit. The channel
// count bounds the parallelism (C threads); the kernel is short beside the
// matmuls of a step.
__global__ static void embed_bwd_kernel(float *dwte, float *dwpe, float *dwtt, const float *dout,
                                        const int32_t *ids, const int32_t *types, int N, int T,
                                        int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int n = 0; n < N; n++) {
        float d = dout[(size_t)n * C + c];
        dwte[(size_t)ids[n] * C + c] += d;
        dwpe[(size_t)(n % T) * C + c] += d;
        dwtt[(size_t)types[n] * C + c] += d;
    }
}

int rf_cu_embed_bwd(const rf_backend *be, float *dwte, float *dwpe, float *dwtt, const float *dout,
                    const int32_t *ids, const int32_t *types, int B, int T, int C, int V, int TV) {
    (void)V;
    (void)TV;
    if (!B || !T || !C) return RF_OK;
    embed_bwd_kernel<<<cu_blocks(C, 64), 64, 0, cu_ctx(be)->stream>>>(dwte, dwpe, dwtt, dout, ids,
                                                                      types, B * T, T, C);
    return cu_launched("embed_bwd");
}
