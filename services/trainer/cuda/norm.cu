// The global gradient norm's sum of squares and the clipping scale; twins of
// rf_op_sumsq and rf_op_scale. The sum is deterministic: RF_OP_SUMSQ_CHUNKS
// fixed chunks (one block each, a fixed tree inside the block), then one
// thread adds the chunks in order. Not bitwise the CPU's (other tree), within
// double rounding of it.
#include "trainer/cuda/ops_cuda.cuh"
#include "trainer/ops.h"

#define NORM_THREADS 256

__global__ static void sumsq_chunks_kernel(double *red, const float *x, size_t n, size_t per) {
    __shared__ double part[NORM_THREADS];
    size_t a = (size_t)blockIdx.x * per, e = a + per < n ? a + per : n;
    double s = 0;
    for (size_t i = a + threadIdx.x; i < e; i += NORM_THREADS)
        s += (double)x[i] * x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = NORM_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) red[blockIdx.x] = part[0];
}

__global__ static void sumsq_total_kernel(double *red, int chunks) {
    double s = 0;
    for (int c = 0; c < chunks; c++)
        s += red[c];
    red[chunks] = s;
}

int rf_cu_sumsq(const rf_backend *be, double *out, const float *x, size_t n) {
    rf_cuda_ctx *c = cu_ctx(be);
    *out = 0;
    if (!n) return RF_OK;
    const int chunks = RF_OP_SUMSQ_CHUNKS;
    static_assert(RF_OP_SUMSQ_CHUNKS + 1 <= RF_CUDA_RED, "reduction scratch too small");
    size_t per = (n + chunks - 1) / chunks;
    sumsq_chunks_kernel<<<chunks, NORM_THREADS, 0, c->stream>>>(c->red, x, n, per);
    int rc = cu_launched("sumsq");
    if (rc) return rc;
    sumsq_total_kernel<<<1, 1, 0, c->stream>>>(c->red, chunks);
    if ((rc = cu_launched("sumsq (total)")) ||
        (rc = rf_cuda_check(cudaMemcpyAsync(c->red_host, c->red + chunks, sizeof(double),
                                            cudaMemcpyDeviceToHost, c->stream),
                            "sumsq (to host)")) ||
        (rc = rf_cuda_check(cudaStreamSynchronize(c->stream), "sumsq")))
        return rc;
    *out = c->red_host[0];
    return RF_OK;
}

__global__ static void scale_kernel(float *x, size_t n, float s) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

int rf_cu_scale(const rf_backend *be, float *x, size_t n, float s) {
    if (!n) return RF_OK;
    scale_kernel<<<cu_blocks(n, 256), 256, 0, cu_ctx(be)->stream>>>(x, n, s);
    return cu_launched("scale");
}
