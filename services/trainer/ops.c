/* CPU kernels: OpenBLAS sgemm for the linear layers, OpenMP loops elsewhere.
 * Parallel loops only ever split independent outputs, never a sum. */
#include "trainer/ops.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OMP_MIN 4096 /* below this many elements a loop stays serial */

void rf_op_embed_fwd(float *out, const int32_t *ids, const int32_t *types, const float *wte,
                     const float *wpe, const float *wtt, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (B * T * C > OMP_MIN)
    for (int n = 0; n < B * T; n++) {
        const float *w = wte + (size_t)ids[n] * C, *p = wpe + (size_t)(n % T) * C,
                    *y = wtt + (size_t)types[n] * C;
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = w[i] + p[i] + y[i];
    }
}

/* Scatter-adds run per channel block, each visiting rows in order, so a row
 * repeated in ids accumulates in the same order every time. */
void rf_op_embed_bwd(float *dwte, float *dwpe, float *dwtt, const float *dout, const int32_t *ids,
                     const int32_t *types, int B, int T, int C, int V, int TV) {
    (void)V;
    (void)TV;
    const int blk = 16;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += blk) {
        int c1 = c0 + blk < C ? c0 + blk : C;
        for (int n = 0; n < B * T; n++) {
            const float *d = dout + (size_t)n * C;
            float *w = dwte + (size_t)ids[n] * C, *p = dwpe + (size_t)(n % T) * C,
                  *y = dwtt + (size_t)types[n] * C;
            for (int i = c0; i < c1; i++) {
                w[i] += d[i];
                p[i] += d[i];
                y[i] += d[i];
            }
        }
    }
}

void rf_op_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > OMP_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        double s = 0, v = 0;
        for (int i = 0; i < C; i++)
            s += x[i];
        float m = (float)(s / C);
        for (int i = 0; i < C; i++)
            v += (double)(x[i] - m) * (x[i] - m);
        float r = (float)(1.0 / sqrt(v / C + eps));
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = (x[i] - m) * r * w[i] + b[i];
        mean[n] = m;
        rstd[n] = r;
    }
}

void rf_op_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                         const float *w, const float *mean, const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > OMP_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        float m = mean[n], r = rstd[n];
        double sd = 0, sdn = 0;
        for (int i = 0; i < C; i++) {
            float dn = d[i] * w[i];
            sd += dn;
            sdn += dn * (x[i] - m) * r;
        }
        float md = (float)(sd / C), mdn = (float)(sdn / C);
        float *di = dinp + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * r;
            di[i] += (d[i] * w[i] - md - norm * mdn) * r;
        }
    }
    const int blk = 16;
#pragma omp parallel for schedule(static) if ((size_t)N * C > OMP_MIN)
    for (int c0 = 0; c0 < C; c0 += blk) {
        int c1 = c0 + blk < C ? c0 + blk : C;
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            for (int i = c0; i < c1; i++) {
                dw[i] += d[i] * (x[i] - mean[n]) * rstd[n];
                db[i] += d[i];
            }
        }
    }
}

void rf_op_linear_fwd(float *out, const float *inp, const float *w, const float *b, int N, int IC,
                      int OC) {
    if (b) {
#pragma omp parallel for schedule(static) if ((size_t)N * OC > OMP_MIN)
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, b, sizeof(float) * OC);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, w, IC,
                b ? 1.0f : 0.0f, out, OC);
}

void rf_op_linear_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                      const float *w, int N, int IC, int OC) {
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC,
                    1.0f, dinp, IC);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f,
                dw, IC);
    if (db) {
        const int blk = 32;
#pragma omp parallel for schedule(static) if ((size_t)N * OC > OMP_MIN)
        for (int o0 = 0; o0 < OC; o0 += blk) {
            int o1 = o0 + blk < OC ? o0 + blk : OC;
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * OC;
                for (int o = o0; o < o1; o++)
                    db[o] += d[o];
            }
        }
    }
}

/* splitmix64 finaliser: a good 64-bit mix of (seed, index). */
static inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* One splitmix round over a scrambled counter: enough to decorrelate masks. */
static inline int keep(uint64_t seed, uint64_t i, float p) {
    uint64_t h = mix64(seed + i * 0xd1342543de82ef95ull);
    return (float)(h >> 40) * (1.0f / 16777216.0f) >= p;
}

int rf_op_dropout_keep(uint64_t seed, uint64_t i, float p) {
    return keep(seed, i, p);
}

void rf_op_attention_fwd(float *out, float *att, const float *qkv, const uint8_t *valid, int B,
                         int T, int C, int NH, float pdrop, uint64_t seed) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs), keep_scale = pdrop > 0 ? 1.0f / (1.0f - pdrop) : 1.0f;
    size_t C3 = 3 * (size_t)C;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
            const uint8_t *vmask = valid + (size_t)b * T;
            for (int tq = 0; tq < T; tq++) {
                const float *q = base + tq * C3;
                float *a = att + (((size_t)b * NH + h) * T + tq) * T;
                float mx = -INFINITY;
                for (int tk = 0; tk < T; tk++) {
                    if (!vmask[tk]) continue;
                    const float *k = base + tk * C3 + C;
                    float s = 0;
#pragma omp simd reduction(+ : s)
                    for (int i = 0; i < hs; i++)
                        s += q[i] * k[i];
                    a[tk] = s * scale;
                    if (a[tk] > mx) mx = a[tk];
                }
                float sum = 0;
                for (int tk = 0; tk < T; tk++) {
                    a[tk] = vmask[tk] ? expf(a[tk] - mx) : 0.0f;
                    sum += a[tk];
                }
                float inv = sum > 0 ? 1.0f / sum : 0.0f;
                for (int tk = 0; tk < T; tk++)
                    a[tk] *= inv;
                float *o = out + ((size_t)b * T + tq) * C + (size_t)h * hs;
                memset(o, 0, sizeof(float) * hs);
                uint64_t idx0 = (((uint64_t)b * NH + h) * T + tq) * T;
                for (int tk = 0; tk < T; tk++) {
                    float p = a[tk];
                    if (p == 0.0f) continue;
                    if (pdrop > 0) p = keep(seed, idx0 + tk, pdrop) ? p * keep_scale : 0;
                    const float *v = base + tk * C3 + 2 * C;
#pragma omp simd
                    for (int i = 0; i < hs; i++)
                        o[i] += p * v[i];
                }
            }
        }
}

void rf_op_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *att,
                         const uint8_t *valid, int B, int T, int C, int NH, float pdrop,
                         uint64_t seed) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs), keep_scale = pdrop > 0 ? 1.0f / (1.0f - pdrop) : 1.0f;
    size_t C3 = 3 * (size_t)C;
#pragma omp parallel
    {
        float *datt = malloc(sizeof(float) * (size_t)T);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++) {
                const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
                float *dbase = dqkv + (size_t)b * T * C3 + (size_t)h * hs;
                const uint8_t *vmask = valid + (size_t)b * T;
                for (int tq = 0; tq < T; tq++) {
                    const float *a = att + (((size_t)b * NH + h) * T + tq) * T;
                    const float *d = dout + ((size_t)b * T + tq) * C + (size_t)h * hs;
                    const float *q = base + tq * C3;
                    float *dq = dbase + tq * C3;
                    uint64_t idx0 = (((uint64_t)b * NH + h) * T + tq) * T;
                    float dot = 0;
                    for (int tk = 0; tk < T; tk++) {
                        datt[tk] = 0;
                        if (!vmask[tk]) continue;
                        float m = 1.0f;
                        if (pdrop > 0) m = keep(seed, idx0 + tk, pdrop) ? keep_scale : 0.0f;
                        if (m == 0.0f) continue;
                        const float *v = base + tk * C3 + 2 * C;
                        float *dv = dbase + tk * C3 + 2 * C;
                        float s = 0, pm = a[tk] * m;
#pragma omp simd reduction(+ : s)
                        for (int i = 0; i < hs; i++)
                            s += d[i] * v[i];
#pragma omp simd
                        for (int i = 0; i < hs; i++)
                            dv[i] += pm * d[i];
                        datt[tk] = s * m;
                        dot += a[tk] * datt[tk];
                    }
                    for (int tk = 0; tk < T; tk++) {
                        if (!vmask[tk]) continue;
                        float dpre = a[tk] * (datt[tk] - dot) * scale;
                        const float *k = base + tk * C3 + C;
                        float *dk = dbase + tk * C3 + C;
#pragma omp simd
                        for (int i = 0; i < hs; i++) {
                            dq[i] += dpre * k[i];
                            dk[i] += dpre * q[i];
                        }
                    }
                }
            }
        free(datt);
    }
}

void rf_op_gelu_fwd(float *out, const float *inp, size_t n) {
#pragma omp parallel for schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * (float)M_SQRT1_2));
}

void rf_op_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
    const float inv_sqrt_2pi = 0.3989422804014327f;
#pragma omp parallel for schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cdf = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
        float pdf = inv_sqrt_2pi * expf(-0.5f * x * x);
        dinp[i] += dout[i] * (cdf + x * pdf);
    }
}

void rf_op_tanh_fwd(float *out, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = tanhf(inp[i]);
}

void rf_op_tanh_bwd(float *dinp, const float *out, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++)
        dinp[i] += dout[i] * (1.0f - out[i] * out[i]);
}

void rf_op_dropout_fwd(float *out, const float *inp, size_t n, float p, uint64_t seed) {
    if (p <= 0) {
        if (out != inp) memcpy(out, inp, n * sizeof(float));
        return;
    }
    float s = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = keep(seed, i, p) ? inp[i] * s : 0.0f;
}

void rf_op_dropout_bwd(float *dinp, const float *dout, size_t n, float p, uint64_t seed) {
    float s = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
#pragma omp parallel for schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++)
        if (p <= 0 || keep(seed, i, p)) dinp[i] += dout[i] * s;
}

void rf_op_residual_fwd(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void rf_op_residual_bwd(float *da, float *db, const float *dout, size_t n) {
#pragma omp parallel for schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++) {
        da[i] += dout[i];
        if (db) db[i] += dout[i];
    }
}

float rf_op_xent_fwd(float *probs, float *losses, const float *logits, const int32_t *labels, int B,
                     int K) {
    double total = 0;
    int counted = 0;
    for (int b = 0; b < B; b++) {
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
        losses[b] = 0;
        if (labels[b] < 0) continue;
        losses[b] = (float)(log(sum) + mx - z[labels[b]]);
        total += losses[b];
        counted++;
    }
    return counted ? (float)(total / counted) : 0.0f;
}

void rf_op_xent_bwd(float *dlogits, const float *probs, const int32_t *labels, int B, int K,
                    float scale) {
    int counted = 0;
    for (int b = 0; b < B; b++)
        counted += labels[b] >= 0;
    if (!counted) return;
    float s = scale / counted;
    for (int b = 0; b < B; b++) {
        if (labels[b] < 0) continue;
        for (int k = 0; k < K; k++)
            dlogits[(size_t)b * K + k] += s * (probs[(size_t)b * K + k] - (k == labels[b]));
    }
}
