// Causal-LM cross-entropy with Hugging Face's shift; twin of
// rf_op_causal_xent_fwd/bwd (ops_causal.c): row (b, t) predicts
// labels[b, t+1]; the last position of each sequence and negative labels
// (-100) are not counted. Rows are vocabulary-wide (50257 for GPT-2, 49152
// for SmolLM), so a block per row: the row maximum and the sum of exponentials
// (in double, as the CPU) reduced by a fixed tree in shared memory; the mean
// over counted rows is summed by one thread in row order, the CPU's order, so
// the loss is deterministic and, given the same per-row losses, the CPU's.
#include "trainer/cuda/ops_cuda.cuh"

#define XE_THREADS 256

__device__ __forceinline__ static int xe_target(const int32_t *labels, int T, int n) {
    return n % T == T - 1 ? -1 : labels[n + 1];
}

__global__ static void causal_xent_rows_kernel(float *lse, float *losses, const float *logits,
                                               const int32_t *labels, int T, int V) {
    __shared__ double sd[XE_THREADS];
    __shared__ float sf[XE_THREADS];
    int n = blockIdx.x, tid = threadIdx.x;
    const float *z = logits + (size_t)n * V;
    float mx = -INFINITY;
    for (int k = tid; k < V; k += XE_THREADS)
        mx = fmaxf(mx, z[k]);
    sf[tid] = mx;
    __syncthreads();
    for (int w = XE_THREADS / 2; w > 0; w >>= 1) {
        if (tid < w) sf[tid] = fmaxf(sf[tid], sf[tid + w]);
        __syncthreads();
    }
    mx = sf[0];
    double s = 0;
    for (int k = tid; k < V; k += XE_THREADS)
        s += exp((double)z[k] - mx);
    sd[tid] = s;
    __syncthreads();
    for (int w = XE_THREADS / 2; w > 0; w >>= 1) {
        if (tid < w) sd[tid] += sd[tid + w];
        __syncthreads();
    }
    if (tid) return;
    double l = log(sd[0]) + mx;
    lse[n] = (float)l;
    int y = xe_target(labels, T, n);
    losses[n] = y >= 0 && y < V ? (float)(l - z[y]) : 0.0f;
}

// red[0] = the mean over counted rows (0 when none), red[1] = their number.
__global__ static void causal_xent_mean_kernel(double *red, const float *losses,
                                               const int32_t *labels, int N, int T, int V) {
    double total = 0;
    int c = 0;
    for (int n = 0; n < N; n++) {
        int y = xe_target(labels, T, n);
        if (y < 0 || y >= V) continue;
        total += losses[n];
        c++;
    }
    red[0] = c ? (double)(float)(total / c) : 0.0;
    red[1] = c;
}

int rf_cu_causal_xent_fwd(const rf_backend *be, float *loss, int *counted, float *lse,
                          float *losses, const float *logits, const int32_t *labels, int B, int T,
                          int V) {
    rf_cuda_ctx *c = cu_ctx(be);
    *loss = 0;
    if (counted) *counted = 0;
    if (B <= 0 || T <= 0) return RF_OK;
    if (V <= 0) return rf_fail(RF_ERR_INVALID, "cuda causal_xent_fwd: vocabulary of %d", V);
    int N = B * T;
    causal_xent_rows_kernel<<<N, XE_THREADS, 0, c->stream>>>(lse, losses, logits, labels, T, V);
    int rc = cu_launched("causal_xent_fwd");
    if (rc) return rc;
    causal_xent_mean_kernel<<<1, 1, 0, c->stream>>>(c->red, losses, labels, N, T, V);
    if ((rc = cu_launched("causal_xent_fwd (mean)")) ||
        (rc = rf_cuda_check(cudaMemcpyAsync(c->red_host, c->red, 2 * sizeof(double),
                                            cudaMemcpyDeviceToHost, c->stream),
                            "causal_xent_fwd (loss)")) ||
        (rc = rf_cuda_check(cudaStreamSynchronize(c->stream), "causal_xent_fwd")))
        return rc;
    *loss = (float)c->red_host[0];
    if (counted) *counted = (int)c->red_host[1];
    return RF_OK;
}

// red[1] = the counted rows, as the mean kernel.
__global__ static void causal_xent_count_kernel(double *red, const int32_t *labels, int N, int T,
                                                int V) {
    int c = 0;
    for (int n = 0; n < N; n++) {
        int y = xe_target(labels, T, n);
        c += y >= 0 && y < V;
    }
    red[1] = c;
}

// A block per row; uncounted rows return at once (the whole block alike).
__global__ static void causal_xent_bwd_kernel(float *dlogits, const float *logits, const float *lse,
                                              const int32_t *labels, const double *red, int T,
                                              int V, float scale) {
    int n = blockIdx.x, y = xe_target(labels, T, n), c = (int)red[1];
    if (y < 0 || y >= V || c == 0) return;
    float s = scale / (float)c; // the CPU twin's float arithmetic
    const float *z = logits + (size_t)n * V;
    float *d = dlogits + (size_t)n * V;
    double l = lse[n];
    for (int k = threadIdx.x; k < V; k += blockDim.x)
        d[k] += s * ((float)exp((double)z[k] - l) - (k == y));
}

int rf_cu_causal_xent_bwd(const rf_backend *be, float *dlogits, const float *logits,
                          const float *lse, const int32_t *labels, int B, int T, int V,
                          float scale) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (B <= 0 || T <= 0 || V <= 0) return RF_OK;
    int N = B * T;
    causal_xent_count_kernel<<<1, 1, 0, c->stream>>>(c->red, labels, N, T, V);
    int rc = cu_launched("causal_xent_bwd (count)");
    if (rc) return rc;
    causal_xent_bwd_kernel<<<N, XE_THREADS, 0, c->stream>>>(dlogits, logits, lse, labels, c->red, T,
                                                            V, scale);
    return cu_launched("causal_xent_bwd");
}

// The vocabulary-parallel cross-entropy's local steps (tensor parallelism);
// twins of rf_op_vxent_* (ops_tp.c). A rank holds logit columns [lo, hi) of
// each row (row stride ldz) and tgt the rows' global targets (< 0: ignored);
// tp.c all-reduces mx, the target logits and se between the steps. Row
// reductions by the fixed tree above; the mean, as causal_xent_fwd's, by one
// thread in row order.
__global__ static void vxent_stats_kernel(float *mx, float *tl, const float *logits, int ldz,
                                          const int32_t *tgt, int lo, int hi) {
    __shared__ float sf[XE_THREADS];
    int r = blockIdx.x, tid = threadIdx.x, nl = hi - lo;
    const float *z = logits + (size_t)r * ldz;
    float m = -INFINITY;
    for (int k = tid; k < nl; k += XE_THREADS)
        m = fmaxf(m, z[k]);
    sf[tid] = m;
    __syncthreads();
    for (int w = XE_THREADS / 2; w > 0; w >>= 1) {
        if (tid < w) sf[tid] = fmaxf(sf[tid], sf[tid + w]);
        __syncthreads();
    }
    if (tid) return;
    mx[r] = sf[0];
    int y = tgt[r];
    tl[r] = y >= lo && y < hi ? z[y - lo] : 0.0f;
}

int rf_cu_vxent_stats(const rf_backend *be, float *mx, float *tl, const float *logits, int ldz,
                      const int32_t *tgt, int lo, int hi, int N) {
    if (N <= 0) return RF_OK;
    vxent_stats_kernel<<<N, XE_THREADS, 0, cu_ctx(be)->stream>>>(mx, tl, logits, ldz, tgt, lo, hi);
    return cu_launched("vxent_stats");
}

__global__ static void vxent_sumexp_kernel(double *se, const float *logits, int ldz,
                                           const float *mx, int nl) {
    __shared__ double sd[XE_THREADS];
    int r = blockIdx.x, tid = threadIdx.x;
    const float *z = logits + (size_t)r * ldz;
    double s = 0;
    for (int k = tid; k < nl; k += XE_THREADS)
        s += exp((double)z[k] - mx[r]);
    sd[tid] = s;
    __syncthreads();
    for (int w = XE_THREADS / 2; w > 0; w >>= 1) {
        if (tid < w) sd[tid] += sd[tid + w];
        __syncthreads();
    }
    if (!tid) se[r] = sd[0];
}

int rf_cu_vxent_sumexp(const rf_backend *be, double *se, const float *logits, int ldz,
                       const float *mx, int lo, int hi, int N) {
    if (N <= 0) return RF_OK;
    vxent_sumexp_kernel<<<N, XE_THREADS, 0, cu_ctx(be)->stream>>>(se, logits, ldz, mx, hi - lo);
    return cu_launched("vxent_sumexp");
}

// losses holds the group's target logits on entry; red[0] = the mean.
__global__ static void vxent_loss_kernel(double *red, float *losses, const float *mx,
                                         const double *se, const int32_t *tgt, int N) {
    double total = 0;
    int c = 0;
    for (int r = 0; r < N; r++) {
        if (tgt[r] < 0) {
            losses[r] = 0;
            continue;
        }
        losses[r] = (float)(log(se[r]) + mx[r] - losses[r]);
        total += losses[r];
        c++;
    }
    red[0] = c ? (double)(float)(total / c) : 0.0;
}

int rf_cu_vxent_loss(const rf_backend *be, float *loss, float *losses, const float *mx,
                     const double *se, const int32_t *tgt, int N) {
    rf_cuda_ctx *c = cu_ctx(be);
    *loss = 0;
    if (N <= 0) return RF_OK;
    vxent_loss_kernel<<<1, 1, 0, c->stream>>>(c->red, losses, mx, se, tgt, N);
    int rc;
    if ((rc = cu_launched("vxent_loss")) ||
        (rc = rf_cuda_check(cudaMemcpyAsync(c->red_host, c->red, sizeof(double),
                                            cudaMemcpyDeviceToHost, c->stream),
                            "vxent_loss (loss)")) ||
        (rc = rf_cuda_check(cudaStreamSynchronize(c->stream), "vxent_loss")))
        return rc;
    *loss = (float)c->red_host[0];
    return RF_OK;
}

// red[1] = the counted rows.
__global__ static void vxent_count_kernel(double *red, const int32_t *tgt, int N) {
    int c = 0;
    for (int r = 0; r < N; r++)
        c += tgt[r] >= 0;
    red[1] = c;
}

__global__ static void vxent_bwd_kernel(float *dlogits, int ldd, const float *logits, int ldz,
                                        const float *mx, const double *se, const int32_t *tgt,
                                        const double *red, int lo, int hi, float scale) {
    int r = blockIdx.x, y = tgt[r], c = (int)red[1];
    if (y < 0 || c == 0) return;
    float s = scale / (float)c; // the CPU twin's float arithmetic
    const float *z = logits + (size_t)r * ldz;
    float *d = dlogits + (size_t)r * ldd;
    for (int k = threadIdx.x; k < hi - lo; k += blockDim.x) {
        float p = (float)(exp((double)z[k] - mx[r]) / se[r]);
        d[k] += s * (p - (k + lo == y));
    }
}

int rf_cu_vxent_bwd(const rf_backend *be, float *dlogits, int ldd, const float *logits, int ldz,
                    const float *mx, const double *se, const int32_t *tgt, int lo, int hi, int N,
                    float scale) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0) return RF_OK;
    vxent_count_kernel<<<1, 1, 0, c->stream>>>(c->red, tgt, N);
    int rc = cu_launched("vxent_bwd (count)");
    if (rc) return rc;
    vxent_bwd_kernel<<<N, XE_THREADS, 0, c->stream>>>(dlogits, ldd, logits, ldz, mx, se, tgt,
                                                      c->red, lo, hi, scale);
    return cu_launched("vxent_bwd");
}
