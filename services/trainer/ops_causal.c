/* CPU kernels of the causal language models (see ops_causal.h). Products are
 * cut into a fixed number of pieces along an output dimension, each one
 * single-threaded sgemm issued from inside a parallel region, as in ops.c, so
 * no element depends on the thread count. The other loops split independent
 * outputs only. Sums that decide a softmax or a norm run in double. */
#include "trainer/ops_causal.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "trainer/ops.h"

#define OMP_MIN    4096 /* below this many elements a loop stays serial */
#define ROW_PIECES 8
#define W_PIECES   4
#define PIECE_MIN  128

static int pieces(int n, int want) {
    int p = n / PIECE_MIN;
    return p < 1 ? 1 : p < want ? p : want;
}

void rf_op_tokpos_fwd(float *out, const int32_t *ids, const int32_t *pos, const float *wte,
                      const float *wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > OMP_MIN)
    for (int n = 0; n < B * T; n++) {
        const float *w = wte + (size_t)ids[n] * C;
        float *o = out + (size_t)n * C;
        if (wpe) {
            const float *p = wpe + (size_t)(pos ? pos[n] : n % T) * C;
#pragma omp simd
            for (int i = 0; i < C; i++)
                o[i] = w[i] + p[i];
        } else {
            memcpy(o, w, sizeof(float) * C);
        }
    }
}

/* Split by channel block, each block visiting rows in order. */
void rf_op_tokpos_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *ids,
                      const int32_t *pos, int B, int T, int C) {
    const int blk = 16;
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > OMP_MIN)
    for (int c0 = 0; c0 < C; c0 += blk) {
        int c1 = c0 + blk < C ? c0 + blk : C;
        for (int n = 0; n < B * T; n++) {
            const float *d = dout + (size_t)n * C;
            if (dwte) {
                float *w = dwte + (size_t)ids[n] * C;
                for (int i = c0; i < c1; i++)
                    w[i] += d[i];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)(pos ? pos[n] : n % T) * C;
                for (int i = c0; i < c1; i++)
                    p[i] += d[i];
            }
        }
    }
}

void rf_op_conv1d_fwd(float *out, const float *inp, const float *w, const float *b, int N, int IC,
                      int OC) {
    int np = pieces(N, ROW_PIECES);
#pragma omp parallel for schedule(dynamic, 1) /* even for one piece: see ops.c */
    for (int i = 0; i < np; i++) {
        int r0 = (int)((long)N * i / np), r1 = (int)((long)N * (i + 1) / np);
        float *o = out + (size_t)r0 * OC;
        for (int n = 0; b && n < r1 - r0; n++)
            memcpy(o + (size_t)n * OC, b, sizeof(float) * OC);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, OC, IC, 1.0f,
                    inp + (size_t)r0 * IC, IC, w, OC, b ? 1.0f : 0.0f, o, OC);
    }
}

/* Tasks: the row pieces of dinp, the pieces of dw (cut along its longer
 * side), then db (each column summed in row order). */
void rf_op_conv1d_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                      const float *w, int N, int IC, int OC) {
    int np = dinp ? pieces(N, ROW_PIECES) : 0, wp = dw ? pieces(N, W_PIECES) : 0,
        nt = np + wp + !!db;
    bool by_in = IC >= OC;
    int wlen = by_in ? IC : OC;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < nt; i++) {
        if (i < np) {
            int r0 = (int)((long)N * i / np), r1 = (int)((long)N * (i + 1) / np);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, IC, OC, 1.0f,
                        dout + (size_t)r0 * OC, OC, w, OC, 1.0f, dinp + (size_t)r0 * IC, IC);
        } else if (i < np + wp) {
            int j = i - np, c0 = (int)((long)wlen * j / wp), c1 = (int)((long)wlen * (j + 1) / wp);
            if (by_in)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, OC, N, 1.0f, inp + c0,
                            IC, dout, OC, 1.0f, dw + (size_t)c0 * OC, OC);
            else
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, IC, c1 - c0, N, 1.0f, inp, IC,
                            dout + c0, OC, 1.0f, dw + c0, OC);
        } else {
            for (int n = 0; n < N; n++)
#pragma omp simd
                for (int o = 0; o < OC; o++)
                    db[o] += dout[(size_t)n * OC + o];
        }
    }
}

void rf_op_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                       float eps) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > OMP_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        double ss = 0;
        for (int i = 0; i < C; i++)
            ss += (double)x[i] * x[i];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = w[i] * (x[i] * r);
        rstd[n] = r;
    }
}

void rf_op_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                       const float *rstd, int N, int C) {
    const int blk = 16, Cw = dw ? C : 0; /* dw NULL: a frozen norm */
#pragma omp parallel if ((size_t)N * C > OMP_MIN)
    {
#pragma omp for schedule(static) nowait
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float r = rstd[n];
            double s = 0;
            for (int i = 0; i < C; i++)
                s += (double)d[i] * w[i] * x[i];
            float k = (float)(s / C) * r * r;
            float *di = dinp + (size_t)n * C;
            for (int i = 0; i < C; i++)
                di[i] += r * (d[i] * w[i] - x[i] * k);
        }
#pragma omp for schedule(static)
        for (int c0 = 0; c0 < Cw; c0 += blk) {
            int c1 = c0 + blk < C ? c0 + blk : C;
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
                float r = rstd[n];
                for (int i = c0; i < c1; i++)
                    dw[i] += d[i] * (x[i] * r);
            }
        }
    }
}

/* cos/sin of angle p * f_i as Hugging Face computes it: f_i = 1 / theta^(2i/hs)
 * and the angle in float, the trigonometry on that float angle. */
static inline void rope_cs(int p, int i, int hs, float theta, float *c, float *s) {
    float f = (float)(1.0 / pow((double)theta, (double)(2 * i) / hs));
    float a = (float)p * f;
    *c = (float)cos((double)a);
    *s = (float)sin((double)a);
}

static void rope(float *out, const float *inp, const int32_t *pos, int N, int T, int nh, int hs,
                 int stride, float theta, float sign, bool acc) {
    int half = hs / 2;
#pragma omp parallel for schedule(static) if ((size_t)N * nh * hs > OMP_MIN)
    for (int n = 0; n < N; n++) {
        int p = pos ? pos[n] : n % T;
        for (int i = 0; i < half; i++) {
            float c, s;
            rope_cs(p, i, hs, theta, &c, &s);
            s *= sign;
            for (int h = 0; h < nh; h++) {
                const float *x = inp + (size_t)n * stride + (size_t)h * hs;
                float *o = out + (size_t)n * stride + (size_t)h * hs;
                float a = x[i], b = x[i + half];
                float oa = a * c - b * s, ob = b * c + a * s;
                if (acc) {
                    o[i] += oa;
                    o[i + half] += ob;
                } else {
                    o[i] = oa;
                    o[i + half] = ob;
                }
            }
        }
    }
}

void rf_op_rope_fwd(float *out, const float *inp, const int32_t *pos, int N, int T, int nh, int hs,
                    int stride, float theta) {
    rope(out, inp, pos, N, T, nh, hs, stride, theta, 1.0f, false);
}

void rf_op_rope_bwd(float *dinp, const float *dout, const int32_t *pos, int N, int T, int nh,
                    int hs, int stride, float theta) {
    rope(dinp, dout, pos, N, T, nh, hs, stride, theta, -1.0f, true);
}

static inline float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

void rf_op_swiglu_fwd(float *out, const float *gu, int N, int F) {
#pragma omp parallel for schedule(static) if ((size_t)N * F > OMP_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * F, *u = g + F;
        float *o = out + (size_t)n * F;
        for (int i = 0; i < F; i++)
            o[i] = g[i] * sigmoid(g[i]) * u[i];
    }
}

void rf_op_swiglu_bwd(float *dgu, const float *dout, const float *gu, int N, int F) {
#pragma omp parallel for schedule(static) if ((size_t)N * F > OMP_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * F, *u = g + F, *d = dout + (size_t)n * F;
        float *dg = dgu + (size_t)n * 2 * F, *du = dg + F;
        for (int i = 0; i < F; i++) {
            float sg = sigmoid(g[i]);
            dg[i] += d[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
            du[i] += d[i] * g[i] * sg;
        }
    }
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

void rf_op_gelu_tanh_fwd(float *out, const float *inp, size_t n) {
#pragma omp parallel for schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

void rf_op_gelu_tanh_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float t = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float dt = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dt);
    }
}

/* Whether query t of sequence b may attend to key j. */
static inline bool sees(const uint8_t *valid, const int32_t *seg, int b, int T, int t, int j) {
    return j <= t && (!valid || valid[b * T + j]) && (!seg || seg[b * T + j] == seg[b * T + t]);
}

void rf_op_causal_attention_fwd(float *out, float *att, const float *qkv, const uint8_t *valid,
                                const int32_t *seg, int B, int T, int NH, int NKV, int hs) {
    int W = (NH + 2 * NKV) * hs, grp = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * NH * T * T * hs > OMP_MIN)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int g = h / grp;
            for (int t = 0; t < T; t++) {
                const float *q = qkv + (size_t)(b * T + t) * W + (size_t)h * hs;
                float *a = att + (((size_t)b * NH + h) * T + t) * T;
                float *o = out ? out + (size_t)(b * T + t) * NH * hs + (size_t)h * hs : NULL;
                float mx = -INFINITY;
                for (int j = 0; j < T; j++) {
                    a[j] = 0;
                    if (!sees(valid, seg, b, T, t, j)) continue;
                    const float *k = qkv + (size_t)(b * T + j) * W + (size_t)(NH + g) * hs;
                    float s = 0;
                    for (int i = 0; i < hs; i++)
                        s += q[i] * k[i];
                    a[j] = s * scale;
                    mx = a[j] > mx ? a[j] : mx;
                }
                if (o) memset(o, 0, sizeof(float) * hs);
                if (mx == -INFINITY) continue; /* no key to attend to */
                double sum = 0;
                for (int j = 0; j <= t; j++) {
                    if (!sees(valid, seg, b, T, t, j)) continue;
                    a[j] = expf(a[j] - mx);
                    sum += a[j];
                }
                float inv = (float)(1.0 / sum);
                for (int j = 0; j <= t; j++) {
                    if (!sees(valid, seg, b, T, t, j)) continue;
                    a[j] *= inv;
                    if (!o) continue; /* the probabilities only */
                    const float *v = qkv + (size_t)(b * T + j) * W + (size_t)(NH + NKV + g) * hs;
                    for (int i = 0; i < hs; i++)
                        o[i] += a[j] * v[i];
                }
            }
        }
}

/* One task per (sequence, kv head): it alone writes that head's key and value
 * gradients (summed over its query heads in head order, then rows in order)
 * and the query gradients of its query heads. */
void rf_op_causal_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                const float *att, int B, int T, int NH, int NKV, int hs) {
    int W = (NH + 2 * NKV) * hs, grp = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(static) collapse(2) if ((size_t)B * NH * T * T * hs > OMP_MIN)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++)
            for (int h = g * grp; h < (g + 1) * grp; h++) {
                float *dp = scratch + ((size_t)b * NH + h) * T;
                for (int t = 0; t < T; t++) {
                    const float *a = att + (((size_t)b * NH + h) * T + t) * T;
                    const float *d = dout + (size_t)(b * T + t) * NH * hs + (size_t)h * hs;
                    const float *q = qkv + (size_t)(b * T + t) * W + (size_t)h * hs;
                    float *dq = dqkv + (size_t)(b * T + t) * W + (size_t)h * hs;
                    double dot = 0;
                    for (int j = 0; j <= t; j++) {
                        dp[j] = 0;
                        if (a[j] == 0) continue;
                        const float *v =
                            qkv + (size_t)(b * T + j) * W + (size_t)(NH + NKV + g) * hs;
                        float *dv = dqkv + (size_t)(b * T + j) * W + (size_t)(NH + NKV + g) * hs;
                        float s = 0;
                        for (int i = 0; i < hs; i++) {
                            s += d[i] * v[i];
                            dv[i] += a[j] * d[i];
                        }
                        dp[j] = s;
                        dot += (double)a[j] * s;
                    }
                    for (int j = 0; j <= t; j++) {
                        if (a[j] == 0) continue;
                        float ds = a[j] * (dp[j] - (float)dot) * scale;
                        const float *k = qkv + (size_t)(b * T + j) * W + (size_t)(NH + g) * hs;
                        float *dk = dqkv + (size_t)(b * T + j) * W + (size_t)(NH + g) * hs;
                        for (int i = 0; i < hs; i++) {
                            dq[i] += ds * k[i];
                            dk[i] += ds * q[i];
                        }
                    }
                }
            }
}

void rf_op_lm_head_fwd(float *logits, const float *h, const float *wte, int N, int C, int V) {
    rf_op_linear_fwd(logits, h, wte, NULL, N, C, V);
}

void rf_op_lm_head_bwd(float *dh, float *dwte, const float *dlogits, const float *h,
                       const float *wte, int N, int C, int V) {
    rf_op_linear_bwd(dh, dwte, NULL, dlogits, h, wte, N, C, V);
}

static inline int target(const int32_t *labels, int T, int n) {
    return n % T == T - 1 ? -1 : labels[n + 1];
}

int rf_causal_targets(int32_t *tgt, const int32_t *labels, int B, int T) {
    int c = 0;
    for (int n = 0; n < B * T; n++) {
        int y = target(labels, T, n);
        tgt[n] = y >= 0 ? y : -1;
        c += y >= 0;
    }
    return c;
}

float rf_op_causal_xent_fwd(float *lse, float *losses, int *counted, const float *logits,
                            const int32_t *labels, int B, int T, int V) {
    int N = B * T;
#pragma omp parallel for schedule(static) if ((size_t)N * V > OMP_MIN)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        float mx = z[0];
        for (int k = 1; k < V; k++)
            mx = z[k] > mx ? z[k] : mx;
        double sum = 0;
        for (int k = 0; k < V; k++)
            sum += exp((double)z[k] - mx);
        double l = log(sum) + mx;
        lse[n] = (float)l;
        int y = target(labels, T, n);
        losses[n] = y >= 0 && y < V ? (float)(l - z[y]) : 0.0f;
    }
    double total = 0;
    int c = 0;
    for (int n = 0; n < N; n++) {
        int y = target(labels, T, n);
        if (y < 0 || y >= V) continue;
        total += losses[n];
        c++;
    }
    if (counted) *counted = c;
    return c ? (float)(total / c) : 0.0f;
}

void rf_op_causal_xent_bwd(float *dlogits, const float *logits, const float *lse,
                           const int32_t *labels, int B, int T, int V, float scale) {
    int N = B * T, c = 0;
    for (int n = 0; n < N; n++) {
        int y = target(labels, T, n);
        c += y >= 0 && y < V;
    }
    if (!c) return;
    float s = scale / c;
#pragma omp parallel for schedule(static) if ((size_t)N * V > OMP_MIN)
    for (int n = 0; n < N; n++) {
        int y = target(labels, T, n);
        if (y < 0 || y >= V) continue;
        const float *z = logits + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        for (int k = 0; k < V; k++)
            d[k] += s * ((float)exp((double)z[k] - lse[n]) - (k == y));
    }
}

#define KV_QB 64 /* new queries per kv_attention task */

void rf_op_kv_attention_fwd(float *out, float *scores, const float *qkv, const float *kc,
                            const float *vc, int n, int len, int NH, int NKV, int hd) {
    int grp = NH / NKV, KW = NKV * hd, A = NH * hd, W = A + 2 * KW, nqb = (n + KV_QB - 1) / KV_QB,
        nkmax = len + n;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < NH * nqb; task++) {
        int h = task / nqb, t0 = task % nqb * KV_QB, t1 = t0 + KV_QB < n ? t0 + KV_QB : n,
            g = h / grp, nq = t1 - t0, nk = len + t1;
        float *S = scores + ((size_t)h * n + t0) * nkmax; /* this task's rows */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hd, scale,
                    qkv + (size_t)t0 * W + (size_t)h * hd, W, kc + (size_t)g * hd, KW, 0.0f, S, nk);
        for (int r = 0; r < nq; r++) {
            float *a = S + (size_t)r * nk;
            int p = len + t0 + r; /* keys 0..p are visible */
            float mx = a[0];
            for (int j = 1; j <= p; j++)
                mx = a[j] > mx ? a[j] : mx;
            double sum = 0;
            for (int j = 0; j <= p; j++) {
                a[j] = expf(a[j] - mx);
                sum += a[j];
            }
            float inv = (float)(1.0 / sum);
            for (int j = 0; j <= p; j++)
                a[j] *= inv;
            for (int j = p + 1; j < nk; j++)
                a[j] = 0;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, S, nk,
                    vc + (size_t)g * hd, KW, 0.0f, out + (size_t)t0 * A + (size_t)h * hd, A);
    }
}
