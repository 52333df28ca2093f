/* CPU kernels: OpenBLAS sgemm for the linear layers, OpenMP loops elsewhere.
 * Parallel loops only ever split independent outputs, never a sum.
 *
 * Matrix products are cut into a fixed number of pieces along an output
 * dimension (never the summed one), each a single-threaded sgemm, handed out
 * dynamically to the OpenMP threads: an element is computed by the same call
 * whatever the thread count, one region replaces OpenBLAS's own threading and
 * its spinning hand-offs, and a thread descheduled on a busy machine leaves
 * its pieces to the others. OpenBLAS's OpenMP build (see module.mk) runs a
 * call made inside a parallel region on the calling thread, so every sgemm is
 * issued from one (also for a single piece: OpenBLAS's own threading would
 * block the summed dimension differently), and results do not depend on the
 * thread count. */
#include "trainer/ops.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define OMP_MIN    4096 /* below this many elements a loop stays serial */
#define ROW_PIECES 8    /* pieces of the N rows of a product; rows per piece >= PIECE_MIN */
#define W_PIECES   4    /* pieces of a weight gradient */
#define PIECE_MIN  128

static int pieces(int n, int want) {
    int p = n / PIECE_MIN;
    return p < 1 ? 1 : p < want ? p : want;
}

void rf_op_embed_fwd(float *out, const int32_t *ids, const int32_t *types, const float *wte,
                     const float *wpe, const float *wtt, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (B * T * C > OMP_MIN)
    for (int n = 0; n < B * T; n++) {
        const float *w = wte + (size_t)ids[n] * C, *p = wpe + (size_t)(n % T) * C,
                    *y = wtt + (size_t)types[n] * C;
        float *o = out + (size_t)n * C;
#pragma omp simd
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
#pragma omp simd
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
#pragma omp simd
        for (int i = 0; i < C; i++)
            o[i] = (x[i] - m) * r * w[i] + b[i];
        mean[n] = m;
        rstd[n] = r;
    }
}

void rf_op_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                         const float *w, const float *mean, const float *rstd, int N, int C) {
    const int blk = 16, Cw = dw ? C : 0; /* dw, db NULL: a frozen LayerNorm */
#pragma omp parallel if ((size_t)N * C > OMP_MIN)
    {
#pragma omp for schedule(static) nowait
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
#pragma omp simd
            for (int i = 0; i < C; i++) {
                float norm = (x[i] - m) * r;
                di[i] += (d[i] * w[i] - md - norm * mdn) * r;
            }
        }
#pragma omp for schedule(static)
        for (int c0 = 0; c0 < Cw; c0 += blk) {
            int c1 = c0 + blk < C ? c0 + blk : C;
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
                float m = mean[n], r = rstd[n];
#pragma omp simd
                for (int i = c0; i < c1; i++) {
                    dw[i] += d[i] * (x[i] - m) * r;
                    db[i] += d[i];
                }
            }
        }
    }
}

/* The linear layer with row strides (ldo, ldi, ldw, ...: tensor parallelism's
 * views, ops.h); rf_op_linear_fwd/bwd are these with packed rows. */
void rf_op_linear_ld_fwd(float *out, int ldo, const float *inp, int ldi, const float *w, int ldw,
                         const float *b, int N, int IC, int OC) {
    int np = pieces(N, ROW_PIECES);
#pragma omp parallel for schedule(dynamic, 1) /* even for one piece: see the top */
    for (int i = 0; i < np; i++) {
        int r0 = (int)((long)N * i / np), r1 = (int)((long)N * (i + 1) / np);
        float *o = out + (size_t)r0 * ldo;
        for (int n = 0; b && n < r1 - r0; n++)
            memcpy(o + (size_t)n * ldo, b, sizeof(float) * OC);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, OC, IC, 1.0f,
                    inp + (size_t)r0 * ldi, ldi, w, ldw, b ? 1.0f : 0.0f, o, ldo);
    }
}

/* Tasks: the row pieces of dinp, the pieces of dw, then db. dw is cut along
 * its longer side, so the operand every piece packs again is the smaller. */
void rf_op_linear_ld_bwd(float *dinp, int lddi, float *dw, int lddw, float *db, const float *dout,
                         int ldd, const float *inp, int ldi, const float *w, int ldw, int N, int IC,
                         int OC) {
    int np = dinp ? pieces(N, ROW_PIECES) : 0, wp = dw ? pieces(N, W_PIECES) : 0,
        nt = np + wp + !!db;
    bool by_out = OC >= IC;
    int wlen = by_out ? OC : IC;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < nt; i++) {
        if (i < np) {
            int r0 = (int)((long)N * i / np), r1 = (int)((long)N * (i + 1) / np);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, IC, OC, 1.0f,
                        dout + (size_t)r0 * ldd, ldd, w, ldw, 1.0f, dinp + (size_t)r0 * lddi, lddi);
        } else if (i < np + wp) {
            int j = i - np, c0 = (int)((long)wlen * j / wp), c1 = (int)((long)wlen * (j + 1) / wp);
            if (by_out)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, IC, N, 1.0f,
                            dout + c0, ldd, inp, ldi, 1.0f, dw + (size_t)c0 * lddw, lddw);
            else
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, c1 - c0, N, 1.0f, dout,
                            ldd, inp + c0, ldi, 1.0f, dw + c0, lddw);
        } else {
            for (int n = 0; n < N; n++) /* each column summed in row order */
#pragma omp simd
                for (int o = 0; o < OC; o++)
                    db[o] += dout[(size_t)n * ldd + o];
        }
    }
}

void rf_op_linear_fwd(float *out, const float *inp, const float *w, const float *b, int N, int IC,
                      int OC) {
    rf_op_linear_ld_fwd(out, OC, inp, IC, w, IC, b, N, IC, OC);
}

void rf_op_linear_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                      const float *w, int N, int IC, int OC) {
    rf_op_linear_ld_bwd(dinp, IC, dw, IC, db, dout, OC, inp, IC, w, IC, N, IC, OC);
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

/* e^x without a libm call, so loops over it vectorize: x = n ln2 + r with
 * |r| <= ln2/2, e^r by a degree-6 polynomial, 2^n by exponent bits. Relative
 * error about 2 ulp on [-87, 88]; beyond it the result saturates (e^-87 is
 * 1.6e-38, far below anything a softmax or the GELU pdf adds to); NaN stays NaN. */
static inline float exp_fast(float x) {
    float xc = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f; /* NaN -> -87, see return */
    float n = xc * 1.44269504f + 12582912.0f; /* round to nearest: add and drop 1.5 * 2^23 */
    n -= 12582912.0f;
    float r = xc - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } two_n = {.i = ((int32_t)n + 127) << 23};
    return x == x ? p * two_n.f : x;
}

/* erf(x) as a rational function of x (the approximation Eigen and XLA use):
 * no branches or calls, so loops over it vectorize; within a few ulp of erff. */
static inline float erf_fast(float x) {
    x = x < -4.0f ? -4.0f : x > 4.0f ? 4.0f : x;
    float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 - 2.10102402082508e-06f;
    p = p * x2 - 5.69250639462346e-05f;
    p = p * x2 - 7.34990630326855e-04f;
    p = p * x2 - 2.95459980854025e-03f;
    p = p * x2 - 1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 - 2.13374055278905e-04f;
    q = q * x2 - 1.68282697438203e-03f;
    q = q * x2 - 7.37332916720468e-03f;
    q = q * x2 - 1.42647390514189e-02f;
    return x * p / q;
}

/* Softmax of each of the rows [rows, T] over the valid keys; masked keys get 0. */
static void softmax_rows(float *a, const uint8_t *valid, int rows, int T) {
    for (int t = 0; t < rows; t++, a += T) {
        float mx = -INFINITY, sum = 0;
        for (int k = 0; k < T; k++)
            if (valid[k] && a[k] > mx) mx = a[k];
#pragma omp simd reduction(+ : sum)
        for (int k = 0; k < T; k++) {
            a[k] = valid[k] ? exp_fast(a[k] - mx) : 0.0f;
            sum += a[k];
        }
        float inv = sum > 0 ? 1.0f / sum : 0.0f;
#pragma omp simd
        for (int k = 0; k < T; k++)
            a[k] *= inv;
    }
}

/* dst = src with attention dropout applied; element i of the n-element block
 * is mask index idx0 + i, the same in forward and backward. */
static void dropout_block(float *dst, const float *src, size_t n, float p, uint64_t seed,
                          uint64_t idx0) {
    float s = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++)
        dst[i] = keep(seed, idx0 + i, p) ? src[i] * s : 0.0f;
}

/* Each (sequence, head) is an independent task of small sgemms on strided
 * views of qkv; OpenBLAS runs single-threaded inside the parallel loop. */
void rf_op_attention_fwd(float *out, float *att, float *scratch, const float *qkv,
                         const uint8_t *valid, int B, int T, int Tq, int C, int NH, float pdrop,
                         uint64_t seed) {
    rf_op_attention_heads_fwd(out, att, scratch, qkv, valid, B, T, Tq, C, NH, 0, NH, pdrop, seed);
}

void rf_op_attention_heads_fwd(float *out, float *att, float *scratch, const float *qkv,
                               const uint8_t *valid, int B, int T, int Tq, int C, int NH, int h0,
                               int NHall, float pdrop, uint64_t seed) {
    int hs = C / NH, ld = 3 * C;
    size_t blk = (size_t)Tq * T;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
        float *a = (att ? att : scratch) + bh * blk, *p = a; /* att NULL: not kept */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, T, hs, scale, q, ld, k, ld, 0.0f,
                    a, T);
        softmax_rows(a, valid + (size_t)b * T, Tq, T);
        if (pdrop > 0) { /* in place when att is NULL */
            p = scratch + bh * blk;
            dropout_block(p, a, blk, pdrop, seed, ((size_t)b * NHall + h0 + h) * blk);
        }
        if (out) /* NULL: the backward's recompute, which needs the probabilities only */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, hs, T, 1.0f, p, T, v, ld,
                        0.0f, out + (size_t)b * Tq * C + (size_t)h * hs, C);
    }
}

/* Masked keys have p = 0, so their gradients vanish without looking at the mask. */
void rf_op_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                         const float *att, int B, int T, int Tq, int C, int NH, float pdrop,
                         uint64_t seed) {
    rf_op_attention_heads_bwd(dqkv, scratch, dout, qkv, att, B, T, Tq, C, NH, 0, NH, pdrop, seed);
}

void rf_op_attention_heads_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int Tq, int C, int NH, int h0,
                               int NHall, float pdrop, uint64_t seed) {
    int hs = C / NH, ld = 3 * C;
    size_t blk = (size_t)Tq * T;
    float scale = 1.0f / sqrtf((float)hs), keep_scale = pdrop > 0 ? 1.0f / (1.0f - pdrop) : 1.0f;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t off = (size_t)b * T * ld + (size_t)h * hs;
        const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
        const float *a = att + bh * blk, *d = dout + (size_t)b * Tq * C + (size_t)h * hs;
        float *s = scratch + bh * blk;
        /* dv += p_dropped^T d (the forward left p_dropped in scratch), then
         * s = d v^T = d(p_dropped) */
        const float *pd = pdrop > 0 ? s : a;
        size_t mask0 = ((size_t)b * NHall + h0 + h) * blk; /* the global head's masks */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, Tq, 1.0f, pd, T, d, C, 1.0f, dv,
                    ld);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, T, hs, 1.0f, d, C, v, ld, 0.0f, s,
                    T);
        /* through dropout and softmax: ds = p * (dp - sum(p * dp)) * scale (0 on masked keys) */
        for (int t = 0; t < Tq; t++) {
            const float *pr = a + (size_t)t * T;
            float *sr = s + (size_t)t * T, dot = 0;
            if (pdrop > 0)
                for (int j = 0; j < T; j++)
                    sr[j] =
                        keep(seed, mask0 + (size_t)t * T + j, pdrop) ? sr[j] * keep_scale : 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j < T; j++)
                dot += pr[j] * sr[j];
#pragma omp simd
            for (int j = 0; j < T; j++)
                sr[j] = pr[j] * (sr[j] - dot) * scale;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, hs, T, 1.0f, s, T, k, ld, 1.0f,
                    dq, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, Tq, 1.0f, s, T, q, ld, 1.0f, dk,
                    ld);
    }
}

void rf_op_gelu_fwd(float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = 0.5f * inp[i] * (1.0f + erf_fast(inp[i] * (float)M_SQRT1_2));
}

void rf_op_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
    const float inv_sqrt_2pi = 0.3989422804014327f;
#pragma omp parallel for simd schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cdf = 0.5f * (1.0f + erf_fast(x * (float)M_SQRT1_2));
        float pdf = inv_sqrt_2pi * exp_fast(-0.5f * x * x);
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

void rf_op_residual_fwd(float *out, const float *a, const float *b, size_t n, float p,
                        uint64_t seed) {
    float s = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
#pragma omp parallel for schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = (p <= 0 ? a[i] : keep(seed, i, p) ? a[i] * s : 0.0f) + b[i];
}

void rf_op_residual_bwd(float *da, float *db, const float *dout, size_t n, float p, uint64_t seed) {
    float s = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
#pragma omp parallel for schedule(static) if (n > OMP_MIN)
    for (size_t i = 0; i < n; i++) {
        if (p <= 0 || keep(seed, i, p)) da[i] += dout[i] * s;
        if (db) db[i] += dout[i];
    }
}

float rf_op_xent_fwd(float *probs, float *losses, const float *logits, const int32_t *labels,
                     const float *weights, int B, int K) {
    double total = 0, wsum = 0;
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
        counted++;
        if (weights) {
            total += (double)weights[labels[b]] * losses[b];
            wsum += weights[labels[b]];
        } else {
            total += losses[b];
        }
    }
    if (!weights) return counted ? (float)(total / counted) : 0.0f;
    return wsum > 0 ? (float)(total / wsum) : 0.0f;
}

void rf_op_xent_bwd(float *dlogits, const float *probs, const int32_t *labels, const float *weights,
                    int B, int K, float scale) {
    if (!weights) { /* kept as it was so that unweighted training is bitwise unchanged */
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
        return;
    }
    double wsum = 0;
    for (int b = 0; b < B; b++)
        if (labels[b] >= 0) wsum += weights[labels[b]];
    if (!(wsum > 0)) return;
    for (int b = 0; b < B; b++) {
        if (labels[b] < 0) continue;
        float s = (float)((double)scale * weights[labels[b]] / wsum);
        for (int k = 0; k < K; k++)
            dlogits[(size_t)b * K + k] += s * (probs[(size_t)b * K + k] - (k == labels[b]));
    }
}

void rf_op_softmax_argmax(int32_t *pred, float *probs, const float *logits, int B, int K) {
    for (int b = 0; b < B; b++) {
        const float *z = logits + (size_t)b * K;
        int best = 0;
        for (int k = 1; k < K; k++)
            if (z[k] > z[best]) best = k;
        pred[b] = best;
        if (!probs) continue;
        float *p = probs + (size_t)b * K;
        double sum = 0;
        for (int k = 0; k < K; k++)
            sum += exp((double)z[k] - z[best]);
        for (int k = 0; k < K; k++)
            p[k] = (float)(exp((double)z[k] - z[best]) / sum);
    }
}
