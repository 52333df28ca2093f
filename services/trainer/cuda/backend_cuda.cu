// The CUDA backend: its context (device, stream, cuBLAS handle, reduction
// scratch), device memory, and the table of the kernels in this folder.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/cuda/ops_cuda.cuh"

int rf_cuda_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return RF_OK;
    return rf_fail(RF_ERR_INTERNAL, "cuda: %s: %s", what, cudaGetErrorString(e));
}

int rf_cublas_check(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return RF_OK;
    return rf_fail(RF_ERR_INTERNAL, "cuda: %s: cuBLAS status %d", what, (int)s);
}

__global__ static void fill_kernel(float *x, size_t n, float v) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

int rf_cuda_ones(rf_cuda_ctx *c, size_t n) {
    if (n <= c->ones_n) return RF_OK;
    cudaFree(c->ones);
    c->ones = NULL;
    c->ones_n = 0;
    int rc = rf_cuda_check(cudaMalloc((void **)&c->ones, n * sizeof(float)), "ones");
    if (rc) return rc;
    fill_kernel<<<cu_blocks(n, 256), 256, 0, c->stream>>>(c->ones, n, 1.0f);
    if ((rc = cu_launched("ones"))) return rc;
    c->ones_n = n;
    return RF_OK;
}

int rf_cuda_grow(float **buf, size_t *cap, size_t n, const char *what) {
    if (n <= *cap) return RF_OK;
    cudaFree(*buf); // waits for the device: no queued kernel still reads it
    *buf = NULL;
    *cap = 0;
    int rc = rf_cuda_check(cudaMalloc((void **)buf, n * sizeof(float)), what);
    if (!rc) *cap = n;
    return rc;
}

int rf_cuda_part(rf_cuda_ctx *c, size_t n) {
    return rf_cuda_grow(&c->part, &c->part_n, n, "partial sums");
}

static int cu_alloc(const rf_backend *be, void **out, size_t bytes) {
    *out = NULL;
    void *p = NULL;
    int rc = rf_cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    if (rc)
        return rf_fail(RF_ERR_NOMEM, "cuda: no device memory for %zu bytes (%s)", bytes,
                       rf_errmsg());
    if ((rc = rf_cuda_check(cudaMemsetAsync(p, 0, bytes, cu_ctx(be)->stream), "memset")) ||
        (rc = rf_cuda_check(cudaStreamSynchronize(cu_ctx(be)->stream), "alloc"))) {
        cudaFree(p);
        return rc;
    }
    *out = p;
    return RF_OK;
}

static int cu_free(const rf_backend *be, void *p) {
    if (!p) return RF_OK;
    // queued kernels may still read p: cudaFree waits for the device
    (void)be;
    return rf_cuda_check(cudaFree(p), "cudaFree");
}

static int cu_zero(const rf_backend *be, void *p, size_t bytes) {
    if (!bytes) return RF_OK;
    return rf_cuda_check(cudaMemsetAsync(p, 0, bytes, cu_ctx(be)->stream), "memset");
}

// Host memory the caller may reuse as soon as this returns: copies wait.
// cudaMemcpyDefault also takes host-to-host (a checkpoint's gathered moments).
static int cu_to_host(const rf_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return RF_OK;
    cudaStream_t s = cu_ctx(be)->stream;
    int rc = rf_cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "to_host");
    return rc ? rc : rf_cuda_check(cudaStreamSynchronize(s), "to_host");
}

static int cu_to_device(const rf_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return RF_OK;
    cudaStream_t s = cu_ctx(be)->stream;
    int rc = rf_cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "to_device");
    return rc ? rc : rf_cuda_check(cudaStreamSynchronize(s), "to_device");
}

static int cu_copy(const rf_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return RF_OK;
    return rf_cuda_check(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cu_ctx(be)->stream), "copy");
}

static int cu_copy2d(const rf_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch,
                     size_t width, size_t rows) {
    if (!width || !rows) return RF_OK;
    return rf_cuda_check(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                           cudaMemcpyDeviceToDevice, cu_ctx(be)->stream),
                         "copy2d");
}

// The two backends of the process, fp32 and bf16 matmuls, each with its own
// context, created on first use (see backend_cuda.h).
static rf_cuda_ctx ctx_storage[2];
static rf_backend cuda_backend[2];
static int init_rc[2];
static char init_msg[2][512];
static pthread_once_t once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

// The GPU of this process, by the comm layer's rule (comm_nccl.c), so that a
// rank's backend and its NCCL communicator sit on the same GPU and the ranks
// of a group on one node take one GPU each (NCCL refuses two ranks on one):
// the local rank (OMPI_COMM_WORLD_LOCAL_RANK, LOCAL_RANK), else the rank,
// modulo the visible devices; device 0 for a single process.
static int pick_device(int *out) {
    *out = 0;
    int n = 0;
    int rc = rf_cuda_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (rc) return rc;
    rf_comm_env e;
    if ((rc = rf_comm_env_read(&e))) return rf_fail_ctx(rc, "cuda: choosing the GPU");
    if (e.launch != RF_COMM_LAUNCH_SINGLE && n > 0)
        *out = (e.local_rank >= 0 ? e.local_rank : e.rank) % n;
    return RF_OK;
}

static int make_ctx(rf_cuda_ctx *c, bool bf16) {
    int rc = rf_cuda_device_check();
    if (!rc) rc = pick_device(&c->device);
    if (rc) return rc;
    c->bf16 = bf16;
    const char *fa = getenv("REFINERY_FUSED_ATTENTION"); // 0: the unfused path, to compare
    c->fused_att = bf16 && !(fa && !strcmp(fa, "0"));
    if (pthread_mutex_init(&c->lt_mu, NULL))
        return rf_fail(RF_ERR_INTERNAL, "cuda: cannot make the cuBLASLt lock");
    if ((rc = rf_cuda_check(cudaSetDevice(c->device), "cudaSetDevice")) ||
        (rc = rf_cuda_check(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                            "stream")) ||
        (rc = rf_cublas_check(cublasCreate(&c->blas), "cublasCreate")) ||
        (rc = rf_cublas_check(cublasSetStream(c->blas, c->stream), "cublasSetStream")) ||
        // fp32 mode: no TF32 tensor cores, so products match the CPU's within 1e-5;
        // bf16 mode asks for its compute type in each call (matmul.cu)
        (rc = rf_cublas_check(
             cublasSetMathMode(c->blas, bf16 ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH),
             "math mode")) ||
        (rc = rf_cuda_check(cudaMalloc((void **)&c->red, RF_CUDA_RED * sizeof(double)),
                            "reduction scratch")) ||
        (rc = rf_cuda_check(cudaMallocHost((void **)&c->red_host, RF_CUDA_RED * sizeof(double)),
                            "pinned scratch")))
        return rc;
    return RF_OK;
}

static void init(int k) {
    init_rc[k] = make_ctx(&ctx_storage[k], k == 1);
    if (init_rc[k]) {
        snprintf(init_msg[k], sizeof init_msg[k], "%s", rf_errmsg());
        return;
    }
    rf_backend b = {};
    b.name = k ? "cuda-bf16" : "cuda";
    b.ctx = &ctx_storage[k];
    b.device_memory = true;
    b.queue = ctx_storage[k].stream;
    b.alloc = cu_alloc;
    b.free = cu_free;
    b.zero = cu_zero;
    b.to_host = cu_to_host;
    b.to_device = cu_to_device;
    b.copy = cu_copy;
    b.copy2d = cu_copy2d;
    b.embed_fwd = rf_cu_embed_fwd;
    b.embed_bwd = rf_cu_embed_bwd;
    b.layernorm_fwd = rf_cu_layernorm_fwd;
    b.layernorm_bwd = rf_cu_layernorm_bwd;
    b.linear_fwd = rf_cu_linear_fwd;
    b.linear_bwd = rf_cu_linear_bwd;
    b.attention_fwd = rf_cu_attention_fwd;
    b.attention_bwd = rf_cu_attention_bwd;
    b.gelu_fwd = rf_cu_gelu_fwd;
    b.gelu_bwd = rf_cu_gelu_bwd;
    b.tanh_fwd = rf_cu_tanh_fwd;
    b.tanh_bwd = rf_cu_tanh_bwd;
    b.dropout_fwd = rf_cu_dropout_fwd;
    b.dropout_bwd = rf_cu_dropout_bwd;
    b.residual_fwd = rf_cu_residual_fwd;
    b.residual_bwd = rf_cu_residual_bwd;
    b.xent_fwd = rf_cu_xent_fwd;
    b.xent_bwd = rf_cu_xent_bwd;
    b.linear_ld_fwd = rf_cu_linear_ld_fwd;
    b.linear_ld_bwd = rf_cu_linear_ld_bwd;
    b.embed_rows_fwd = rf_cu_embed_rows_fwd;
    b.embed_add_fwd = rf_cu_embed_add_fwd;
    b.embed_rows_bwd = rf_cu_embed_rows_bwd;
    b.kv_attention_fwd = rf_cu_kv_attention_fwd;
    b.vxent_stats = rf_cu_vxent_stats;
    b.vxent_sumexp = rf_cu_vxent_sumexp;
    b.vxent_loss = rf_cu_vxent_loss;
    b.vxent_bwd = rf_cu_vxent_bwd;
    b.softmax_argmax = rf_cu_softmax_argmax;
    b.tokpos_fwd = rf_cu_tokpos_fwd;
    b.tokpos_bwd = rf_cu_tokpos_bwd;
    b.conv1d_fwd = rf_cu_conv1d_fwd;
    b.conv1d_bwd = rf_cu_conv1d_bwd;
    b.rmsnorm_fwd = rf_cu_rmsnorm_fwd;
    b.rmsnorm_bwd = rf_cu_rmsnorm_bwd;
    b.rope_fwd = rf_cu_rope_fwd;
    b.rope_bwd = rf_cu_rope_bwd;
    b.swiglu_fwd = rf_cu_swiglu_fwd;
    b.swiglu_bwd = rf_cu_swiglu_bwd;
    b.gelu_tanh_fwd = rf_cu_gelu_tanh_fwd;
    b.gelu_tanh_bwd = rf_cu_gelu_tanh_bwd;
    b.causal_attention_fwd = rf_cu_causal_attention_fwd;
    b.causal_attention_bwd = rf_cu_causal_attention_bwd;
    b.attention_stats = rf_cu_attention_stats;
    b.lm_head_fwd = rf_cu_lm_head_fwd;
    b.lm_head_bwd = rf_cu_lm_head_bwd;
    b.causal_xent_fwd = rf_cu_causal_xent_fwd;
    b.causal_xent_bwd = rf_cu_causal_xent_bwd;
    b.lora_fwd = rf_cu_lora_fwd;
    b.lora_bwd = rf_cu_lora_bwd;
    b.qlinear_fwd = rf_cu_qlinear_fwd;
    b.qlinear_bwd = rf_cu_qlinear_bwd;
    b.sumsq = rf_cu_sumsq;
    b.sumsq_spans = rf_cu_sumsq_spans;
    b.sumsq_into = rf_cu_sumsq_into;
    b.scale = rf_cu_scale;
    b.adamw = rf_cu_adamw;
    cuda_backend[k] = b;
}

static void init_fp32(void) {
    init(0);
}

static void init_bf16(void) {
    init(1);
}

extern "C" int rf_cuda_backend(bool bf16, const rf_backend **out) {
    *out = NULL;
    int k = bf16 ? 1 : 0;
    pthread_once(&once[k], k ? init_bf16 : init_fp32);
    if (init_rc[k]) return rf_fail(init_rc[k], "%s", init_msg[k]);
    *out = &cuda_backend[k];
    return RF_OK;
}
