// Rotary position embedding (Hugging Face Llama's rotate_half); twin of
// rf_op_rope_fwd/bwd (ops_causal.c). A thread per (row, head, pair): it reads
// both channels of its pair before writing them, so out may alias inp (the
// q and k parts of a fused qkv buffer rotated in place). The angle is
// computed as on the CPU (the frequency in double rounded to float, the
// angle in float, cos and sin in double), so both devices rotate alike.
// Backward applies the inverse rotation and accumulates.
#include "trainer/cuda/ops_cuda.cuh"

__global__ static void rope_kernel(float *out, const float *inp, const int32_t *pos, int T, int nh,
                                   int hs, int stride, float theta, float sign, bool acc,
                                   size_t total) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    int half = hs / 2, i = (int)(idx % half);
    size_t nhh = idx / half;
    int h = (int)(nhh % nh);
    size_t n = nhh / nh;
    int p = pos ? pos[n] : (int)(n % T);
    float f = (float)(1.0 / pow((double)theta, (double)(2 * i) / hs));
    float a = (float)p * f;
    float c = (float)cos((double)a), s = (float)sin((double)a) * sign;
    size_t off = n * (size_t)stride + (size_t)h * hs;
    float x = inp[off + i], y = inp[off + i + half];
    float ox = x * c - y * s, oy = y * c + x * s;
    if (acc) {
        out[off + i] += ox;
        out[off + i + half] += oy;
    } else {
        out[off + i] = ox;
        out[off + i + half] = oy;
    }
}

static int rope(const rf_backend *be, float *out, const float *inp, const int32_t *pos, int N,
                int T, int nh, int hs, int stride, float theta, float sign, bool acc,
                const char *what) {
    if (N <= 0 || nh <= 0 || hs < 2) return RF_OK;
    if (T <= 0 && !pos)
        return rf_fail(RF_ERR_INVALID, "cuda %s: T = %d without positions", what, T);
    size_t total = (size_t)N * nh * (hs / 2);
    rope_kernel<<<cu_blocks(total, 256), 256, 0, cu_ctx(be)->stream>>>(
        out, inp, pos, T, nh, hs, stride, theta, sign, acc, total);
    return cu_launched(what);
}

int rf_cu_rope_fwd(const rf_backend *be, float *out, const float *inp, const int32_t *pos, int N,
                   int T, int nh, int hs, int stride, float theta) {
    return rope(be, out, inp, pos, N, T, nh, hs, stride, theta, 1.0f, false, "rope_fwd");
}

int rf_cu_rope_bwd(const rf_backend *be, float *dinp, const float *dout, const int32_t *pos, int N,
                   int T, int nh, int hs, int stride, float theta) {
    return rope(be, dinp, dout, pos, N, T, nh, hs, stride, theta, -1.0f, true, "rope_bwd");
}
