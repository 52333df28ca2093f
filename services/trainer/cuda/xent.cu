// Softmax + cross-entropy with class weights (twin of rf_op_xent_fwd/bwd) and
// the evaluation arg-max (twin of rf_op_softmax_argmax). One thread per row
// with the CPU's double-precision arithmetic; the batch's mean loss is summed
// by one thread in row order, as on the CPU, so the loss is deterministic.
#include "trainer/cuda/ops_cuda.cuh"

__global__ static void xent_rows_kernel(float *probs, float *losses, const float *logits,
                                        const int32_t *labels, int B, int K) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    const float *z = logits + (size_t)b * K;
    float *p = probs + (size_t)b * K;
    float mx = z[0];
    for (int k = 1; k < K; k++)
        mx = z[k] > mx ? z[k] : mx;
    double sum = 0;
    for (int k = 0; k < K; k++)
        sum += exp((double)z[k] - mx);
    for (int k = 0; k < K; k++)
        p[k] = (float)(exp((double)z[k] - mx) / sum);
    losses[b] = labels[b] < 0 ? 0.0f : (float)(log(sum) + mx - z[labels[b]]);
}

// red[0] = the mean loss (as rf_op_xent_fwd), red[1] = its denominator
// (counted rows, or the sum of their weights).
__global__ static void xent_mean_kernel(double *red, const float *losses, const int32_t *labels,
                                        const float *weights, int B) {
    double total = 0, wsum = 0;
    int counted = 0;
    for (int b = 0; b < B; b++) {
        if (labels[b] < 0) continue;
        counted++;
        if (weights) {
            total += (double)weights[labels[b]] * losses[b];
            wsum += weights[labels[b]];
        } else {
            total += losses[b];
        }
    }
    if (!weights) {
        red[0] = counted ? (double)(float)(total / counted) : 0.0;
        red[1] = counted;
    } else {
        red[0] = wsum > 0 ? (double)(float)(total / wsum) : 0.0;
        red[1] = wsum;
    }
}

int rf_cu_xent_fwd(const rf_backend *be, float *loss, float *probs, float *losses,
                   const float *logits, const int32_t *labels, const float *weights, int B, int K) {
    rf_cuda_ctx *c = cu_ctx(be);
    *loss = 0;
    if (B <= 0) return RF_OK;
    xent_rows_kernel<<<cu_blocks(B, 128), 128, 0, c->stream>>>(probs, losses, logits, labels, B, K);
    int rc = cu_launched("xent_fwd");
    if (rc) return rc;
    xent_mean_kernel<<<1, 1, 0, c->stream>>>(c->red, losses, labels, weights, B);
    if ((rc = cu_launched("xent_fwd (mean)")) ||
        (rc = rf_cuda_check(cudaMemcpyAsync(c->red_host, c->red, sizeof(double),
                                            cudaMemcpyDeviceToHost, c->stream),
                            "xent_fwd (loss)")) ||
        (rc = rf_cuda_check(cudaStreamSynchronize(c->stream), "xent_fwd")))
        return rc;
    *loss = (float)c->red_host[0];
    return RF_OK;
}

// red[1] = the loss's denominator, as xent_mean_kernel.
__global__ static void xent_denom_kernel(double *red, const int32_t *labels, const float *weights,
                                         int B) {
    double wsum = 0;
    for (int b = 0; b < B; b++)
        if (labels[b] >= 0) wsum += weights ? (double)weights[labels[b]] : 1.0;
    red[1] = wsum;
}

__global__ static void xent_bwd_kernel(float *dlogits, const float *probs, const int32_t *labels,
                                       const float *weights, const double *red, int B, int K,
                                       float scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * K) return;
    int b = (int)(i / K), k = (int)(i % K), y = labels[b];
    double den = red[1];
    if (y < 0 || !(den > 0)) return;
    // the CPU twin's arithmetic: unweighted scale / counted in float, weighted in double
    float s = weights ? (float)((double)scale * weights[y] / den) : scale / (float)(int)den;
    dlogits[i] += s * (probs[i] - (k == y));
}

int rf_cu_xent_bwd(const rf_backend *be, float *dlogits, const float *probs, const int32_t *labels,
                   const float *weights, int B, int K, float scale) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (B <= 0) return RF_OK;
    xent_denom_kernel<<<1, 1, 0, c->stream>>>(c->red, labels, weights, B);
    int rc = cu_launched("xent_bwd (denominator)");
    if (rc) return rc;
    size_t n = (size_t)B * K;
    xent_bwd_kernel<<<cu_blocks(n, 256), 256, 0, c->stream>>>(dlogits, probs, labels, weights,
                                                              c->red, B, K, scale);
    return cu_launched("xent_bwd");
}

__global__ static void softmax_argmax_kernel(int32_t *pred, float *probs, const float *logits,
                                             int B, int K) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    const float *z = logits + (size_t)b * K;
    int best = 0;
    for (int k = 1; k < K; k++)
        if (z[k] > z[best]) best = k;
    pred[b] = best;
    if (!probs) return;
    float *p = probs + (size_t)b * K;
    double sum = 0;
    for (int k = 0; k < K; k++)
        sum += exp((double)z[k] - z[best]);
    for (int k = 0; k < K; k++)
        p[k] = (float)(exp((double)z[k] - z[best]) / sum);
}

int rf_cu_softmax_argmax(const rf_backend *be, int32_t *pred, float *probs, const float *logits,
                         int B, int K) {
    if (B <= 0) return RF_OK;
    softmax_argmax_kernel<<<cu_blocks(B, 128), 128, 0, cu_ctx(be)->stream>>>(pred, probs, logits, B,
                                                                             K);
    return cu_launched("softmax_argmax");
}
