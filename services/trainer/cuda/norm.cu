// The global gradient norm's sum of squares and the clipping scale; twins of
// rf_op_sumsq (and the CPU's sumsq_spans) and rf_op_scale. The sum is
// deterministic: fixed pieces of the spans' concatenation (one block each, a
// fixed tree inside the block), then one block adds the pieces by a fixed
// tree. Not bitwise the CPU's (other order), within double rounding of it.
// One wait for the device per call, however many spans; none for
// sumsq_into, whose sum stays in device memory (AdamW's clipping and a
// device group's all-reduce read it there), once its span table is there.
#include <limits.h>

#include "trainer/cuda/ops_cuda.cuh"
#include "trainer/ops.h"

#define NORM_THREADS 256
// Blocks of the sum's first pass: at most enough to keep a GPU's memory busy
// (a few per SM), fewer for a small sum; a function of the element count
// only, so the sum does not depend on the device.
#define SUMSQ_BLOCKS  1024
#define SUMSQ_MIN_PER 8

// The sum of the block's NORM_THREADS values s by a fixed tree, returned to
// thread 0 (the others get a partial sum). Every thread of the block calls it.
__device__ static double block_sum(double s) {
    __shared__ double part[NORM_THREADS];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = NORM_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    return part[threadIdx.x];
}

// The spans as one virtual vector: tab holds (offset, numel, start) per
// span, start the span's first index in the concatenation, increasing (tab
// NULL: x[0, total) itself). Block b sums the virtual indices [b * per, (b +
// 1) * per), each thread a fixed stride of them, then a fixed tree; red[b]
// gets the block's sum.
__global__ static void sumsq_spans_kernel(double *red, const float *x, const size_t *tab, int nsp,
                                          size_t total, size_t per) {
    size_t a = (size_t)blockIdx.x * per, e = a + per < total ? a + per : total;
    if (!tab) {
        double s = 0;
        for (size_t i = a + threadIdx.x; i < e; i += NORM_THREADS)
            s += (double)x[i] * x[i];
        s = block_sum(s);
        if (threadIdx.x == 0) red[blockIdx.x] = s;
        return;
    }
    int lo = 0, hi = nsp - 1; // the last span starting at or before a
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tab[3 * mid + 2] <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    double s = 0;
    for (int k = lo; k < nsp && a < e; k++) {
        size_t off = tab[3 * k], n = tab[3 * k + 1], at = tab[3 * k + 2];
        size_t b = at + n < e ? at + n : e; // this span's part of [a, e)
        for (size_t i = a + threadIdx.x; i < b; i += NORM_THREADS) {
            float v = x[off + (i - at)];
            s += (double)v * v;
        }
        a = b;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) red[blockIdx.x] = s;
}

// *out = the sum of red[0, n): one block, each thread its stride in order,
// then the fixed tree.
__global__ static void sum_total_kernel(double *out, const double *red, int n) {
    double s = 0;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS)
        s += red[i];
    s = block_sum(s);
    if (threadIdx.x == 0) *out = s;
}

// Blocks of the first pass over `total` elements (at least SUMSQ_MIN_PER a
// thread: a small sum takes few blocks), and the elements per block.
static int sumsq_blocks(size_t total, size_t *per) {
    size_t want = (total + NORM_THREADS * SUMSQ_MIN_PER - 1) / (NORM_THREADS * SUMSQ_MIN_PER);
    int blocks = want < SUMSQ_BLOCKS ? (int)want : SUMSQ_BLOCKS;
    *per = (total + blocks - 1) / blocks;
    return blocks;
}

// The spans' table on the device (see sumsq_spans_kernel), empty spans left
// out; *nsp its entries. c->spans_host keeps what was last uploaded, so the
// same table again (a mesh's or ZeRO's own pieces, every step) costs
// nothing. A new one is written there and copied; the pinned source must
// outlive the copy, so with `wait` the copy is waited for (without, the
// caller waits before it returns). cudaFree and cudaFreeHost, when the table
// grows, wait for the device first.
static int span_table(rf_cuda_ctx *c, const rf_param_span *spans, size_t nspans, int *nsp,
                      bool wait) {
    size_t n = 0, total = 0;
    bool same = true;
    for (size_t k = 0; k < nspans; k++) {
        if (!spans[k].numel) continue;
        same = same && n < c->spans_len && c->spans_host[3 * n] == spans[k].offset &&
               c->spans_host[3 * n + 1] == spans[k].numel && c->spans_host[3 * n + 2] == total;
        total += spans[k].numel;
        n++;
    }
    *nsp = (int)n;
    if (same && n == c->spans_len) return RF_OK;
    c->spans_len = 0;
    if (n > c->spans_n) {
        if (c->spans) cudaFree(c->spans);
        if (c->spans_host) cudaFreeHost(c->spans_host);
        c->spans = c->spans_host = NULL;
        c->spans_n = 0;
        size_t bytes = 3 * n * sizeof(size_t);
        int rc = rf_cuda_check(cudaMalloc((void **)&c->spans, bytes), "sumsq span table");
        if (!rc)
            rc = rf_cuda_check(cudaMallocHost((void **)&c->spans_host, bytes),
                               "sumsq span table (pinned)");
        if (rc) return rc;
        c->spans_n = n;
    }
    n = total = 0;
    for (size_t k = 0; k < nspans; k++) {
        if (!spans[k].numel) continue;
        c->spans_host[3 * n] = spans[k].offset;
        c->spans_host[3 * n + 1] = spans[k].numel;
        c->spans_host[3 * n + 2] = total;
        total += spans[k].numel;
        n++;
    }
    int rc = rf_cuda_check(cudaMemcpyAsync(c->spans, c->spans_host, 3 * n * sizeof(size_t),
                                           cudaMemcpyHostToDevice, c->stream),
                           "sumsq (spans)");
    if (!rc && wait) rc = rf_cuda_check(cudaStreamSynchronize(c->stream), "sumsq (spans)");
    if (!rc) c->spans_len = n;
    return rc;
}

// Queues the spans' sum of squares into *dst (device memory). One span is
// summed in place, with no table; `wait` as span_table's.
static int queue_sumsq(rf_cuda_ctx *c, double *dst, const float *x, const rf_param_span *spans,
                       size_t nspans, bool wait) {
    static_assert(SUMSQ_BLOCKS + 1 <= RF_CUDA_RED, "reduction scratch too small");
    if (nspans > INT_MAX) return rf_fail(RF_ERR_INVALID, "sumsq: %zu spans", nspans);
    size_t total = 0, nonempty = 0, first = 0;
    for (size_t k = 0; k < nspans; k++) {
        if (!spans[k].numel) continue;
        if (!nonempty++) first = k;
        total += spans[k].numel;
    }
    int rc, blocks = 0;
    if (total) {
        size_t per;
        blocks = sumsq_blocks(total, &per);
        const size_t *tab = nullptr;
        int nsp = 1;
        if (nonempty == 1)
            x += spans[first].offset;
        else if ((rc = span_table(c, spans, nspans, &nsp, wait)))
            return rc;
        else
            tab = c->spans;
        sumsq_spans_kernel<<<blocks, NORM_THREADS, 0, c->stream>>>(c->red, x, tab, nsp, total, per);
        if ((rc = cu_launched("sumsq"))) return rc;
    }
    sum_total_kernel<<<1, NORM_THREADS, 0, c->stream>>>(dst, c->red, blocks); // 0 for nothing
    return cu_launched("sumsq (total)");
}

int rf_cu_sumsq_spans(const rf_backend *be, double *out, const float *x, const rf_param_span *spans,
                      size_t nspans) {
    rf_cuda_ctx *c = cu_ctx(be);
    *out = 0;
    size_t total = 0;
    for (size_t k = 0; k < nspans; k++)
        total += spans[k].numel;
    if (!total) return RF_OK; // nothing to wait for
    double *dst = c->red + SUMSQ_BLOCKS;
    int rc;
    if ((rc = queue_sumsq(c, dst, x, spans, nspans, false)) || // the wait below covers the table
        (rc = rf_cuda_check(
             cudaMemcpyAsync(c->red_host, dst, sizeof(double), cudaMemcpyDeviceToHost, c->stream),
             "sumsq (to host)")) ||
        (rc = rf_cuda_check(cudaStreamSynchronize(c->stream), "sumsq")))
        return rc;
    *out = c->red_host[0];
    return RF_OK;
}

int rf_cu_sumsq_into(const rf_backend *be, double *dst, const float *x, const rf_param_span *spans,
                     size_t nspans) {
    return queue_sumsq(cu_ctx(be), dst, x, spans, nspans, true);
}

int rf_cu_sumsq(const rf_backend *be, double *out, const float *x, size_t n) {
    rf_param_span whole = {0, n, false};
    return rf_cu_sumsq_spans(be, out, x, &whole, 1);
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
