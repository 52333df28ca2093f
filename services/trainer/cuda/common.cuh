// Shared by the CUDA kernels: the backend context, error checks, launch
// helpers and the dropout hash (bit for bit the one of ops.c).
#ifndef RF_TR_CUDA_COMMON_CUH
#define RF_TR_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <pthread.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "trainer/backend.h"

struct rf_cu_lt_plan; // matmul.cu

// All device state of one backend: nothing is static in the kernels' files.
struct rf_cuda_ctx {
    int device;
    bool bf16;           // matrix products on bf16 tensor cores (matmul.cu)
    bool fused_att;      // bf16: the fused attention kernels (flash_attention.cu)
    cudaStream_t stream; // every kernel, copy and cuBLAS call goes here
    cublasHandle_t blas; // bound to stream
    double *red;         // device scratch for reductions (RF_CUDA_RED doubles)
    double *red_host;    // pinned host copy of red
    float *ones;         // ones_n ones: column sums as cuBLAS gemv
    size_t ones_n;
    float *part; // part_n floats: per-chunk partial sums of column reductions
    size_t part_n;
    float *deq; // deq_n floats: a quantized weight dequantized (qlinear.cu)
    size_t deq_n;
    float *codes; // NF4's 16 values then the 256 of the dynamic map (qlinear.cu)
    float *ptrs;  // ptrs_n floats: the attentions' pointer lists, 2 floats a pointer
    size_t ptrs_n;
    float *dprobs; // dprobs_n floats: the causal backward's score gradients (causal_attention.cu)
    size_t dprobs_n;
    size_t *spans, *spans_host; // sumsq's span table, on the device and pinned (norm.cu)
    size_t spans_n;             // spans it has room for
    size_t spans_len;           // spans uploaded: spans_host[0, 3 spans_len) is the device's
    // cuBLASLt, for the products with a bias (matmul.cu), set up on first use
    pthread_mutex_t lt_mu;          // guards the fields below and the plans' descriptors
    int lt_state;                   // 0 not yet tried, 1 on, -1 off
    cublasLtHandle_t lt;            // its handle (the stream is given at each call)
    void *lt_ws;                    // its workspace (matmul.cu's RF_CU_LT_WORKSPACE bytes)
    struct rf_cu_lt_plan *lt_plans; // one per product shape and alignment, found once
    int lt_nplans;
    bool lt_full; // the plan table was found full (logged once)
};
#define RF_CUDA_RED 1040

// Every slot starts here. The current device is per host thread: a slot
// called from a thread other than the one that made the context (device
// picked by local rank, backend_cuda.cu) switches to the context's GPU first.
static inline rf_cuda_ctx *cu_ctx(const rf_backend *be) {
    rf_cuda_ctx *c = (rf_cuda_ctx *)be->ctx;
    int cur = 0;
    if (c->device && (cudaGetDevice(&cur) != cudaSuccess || cur != c->device))
        (void)cudaSetDevice(c->device); // a failure shows at the launch that follows
    return c;
}

// RF_OK, or RF_ERR_INTERNAL with the CUDA error named.
int rf_cuda_check(cudaError_t e, const char *what);
int rf_cublas_check(cublasStatus_t s, const char *what);
// *buf (a context scratch of *cap floats) with at least n floats: grown on
// demand, the old buffer freed (cudaFree waits for the kernels using it).
int rf_cuda_grow(float **buf, size_t *cap, size_t n, const char *what);
// ctx->ones with at least n ones / ctx->part with at least n floats.
int rf_cuda_ones(rf_cuda_ctx *c, size_t n);
int rf_cuda_part(rf_cuda_ctx *c, size_t n);
// ctx->deq with at least n floats, and ctx->codes filled (once); qlinear.cu.
int rf_cuda_deq(rf_cuda_ctx *c, size_t n);
// The launch just queued: its configuration error, if any.
static inline int cu_launched(const char *what) {
    return rf_cuda_check(cudaGetLastError(), what);
}

static inline unsigned cu_blocks(size_t n, unsigned per) {
    return (unsigned)((n + per - 1) / per);
}

// splitmix64 finaliser and the keep test of ops.c: the same masks on both devices.
__device__ __forceinline__ uint64_t rf_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ bool rf_keep(uint64_t seed, uint64_t i, float p) {
    uint64_t h = rf_mix64(seed + i * 0xd1342543de82ef95ull);
    return (float)(h >> 40) * (1.0f / 16777216.0f) >= p;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif
