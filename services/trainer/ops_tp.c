/* CPU kernels of tensor parallelism (ops.h: rf_op_linear_ld_*, rf_op_embed_rows_*,
 * rf_op_embed_add_fwd): the pieces of tp.h's ops that touch model memory,
 * which the CPU backend's table points at and a device backend supplies
 * twins of. The products follow ops.c's scheme: a fixed number of pieces
 * along an output dimension, each a single-threaded sgemm issued from inside
 * one OpenMP region (see the top of ops.c), here with leading dimensions so
 * that a rank's slice of a tensor is a view, not a copy. */
#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "trainer/ops.h"

#define ROW_PIECES 8 /* as ops.c */
#define W_PIECES   4
#define PIECE_MIN  128
#define OMP_MIN    4096

static int pieces(int n, int want) {
    int p = n / PIECE_MIN;
    return p < 1 ? 1 : p < want ? p : want;
}

void rf_op_linear_ld_fwd(float *out, int ldo, const float *inp, int ldi, const float *w, int ldw,
                         const float *b, int N, int IC, int OC) {
    int np = pieces(N, ROW_PIECES);
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < np; i++) {
        int r0 = (int)((long)N * i / np), r1 = (int)((long)N * (i + 1) / np);
        float *o = out + (size_t)r0 * ldo;
        for (int n = 0; b && n < r1 - r0; n++)
            memcpy(o + (size_t)n * ldo, b, sizeof(float) * OC);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, OC, IC, 1.0f,
                    inp + (size_t)r0 * ldi, ldi, w, ldw, b ? 1.0f : 0.0f, o, ldo);
    }
}

void rf_op_linear_ld_bwd(float *dinp, int lddi, float *dw, int lddw, float *db, const float *dout,
                         int ldd, const float *inp, int ldi, const float *w, int ldw, int N, int IC,
                         int OC) {
    int np = dinp ? pieces(N, ROW_PIECES) : 0, wp = pieces(N, W_PIECES), nt = np + wp + !!db;
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

void rf_op_embed_rows_fwd(float *out, const int32_t *ids, const float *w, int lo, int hi, int N,
                          int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > OMP_MIN)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        if (ids[n] >= lo && ids[n] < hi)
            memcpy(o, w + (size_t)(ids[n] - lo) * C, sizeof(float) * C);
        else
            memset(o, 0, sizeof(float) * C);
    }
}

void rf_op_embed_add_fwd(float *out, const int32_t *pos, const int32_t *types, const float *wpe,
                         const float *wtt, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (B * T * C > OMP_MIN)
    for (int n = 0; n < B * T; n++) {
        const float *p = wpe + (size_t)(pos ? pos[n] : n % T) * C;
        float *o = out + (size_t)n * C;
        if (wtt) {
            const float *y = wtt + (size_t)types[n] * C;
#pragma omp simd
            for (int i = 0; i < C; i++)
                o[i] = o[i] + p[i] + y[i]; /* (w + p) + y, as rf_op_embed_fwd */
        } else {
#pragma omp simd
            for (int i = 0; i < C; i++)
                o[i] = o[i] + p[i];
        }
    }
}

/* As rf_op_embed_bwd: per channel block, rows in order. */
void rf_op_embed_rows_bwd(float *dw, float *dwpe, float *dwtt, const float *dout,
                          const int32_t *ids, const int32_t *types, int lo, int hi, int B, int T,
                          int C) {
    const int blk = 16;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += blk) {
        int c1 = c0 + blk < C ? c0 + blk : C;
        for (int n = 0; n < B * T; n++) {
            const float *d = dout + (size_t)n * C;
            if (ids[n] >= lo && ids[n] < hi) {
                float *w = dw + (size_t)(ids[n] - lo) * C;
#pragma omp simd
                for (int i = c0; i < c1; i++)
                    w[i] += d[i];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)(n % T) * C;
#pragma omp simd
                for (int i = c0; i < c1; i++)
                    p[i] += d[i];
            }
            if (dwtt) {
                float *y = dwtt + (size_t)types[n] * C;
#pragma omp simd
                for (int i = c0; i < c1; i++)
                    y[i] += d[i];
            }
        }
    }
}

/* The vocabulary-parallel cross-entropy's local steps (tp.c runs them around
 * its all-reduces): each row in order, exp and log in double. */
void rf_op_vxent_stats(float *mx, float *tl, const float *logits, int ldz, const int32_t *tgt,
                       int lo, int hi, int N) {
    for (int r = 0; r < N; r++) {
        const float *z = logits + (size_t)r * ldz;
        float m = -INFINITY;
        for (int k = 0; k < hi - lo; k++)
            m = z[k] > m ? z[k] : m;
        mx[r] = m;
        tl[r] = tgt[r] >= lo && tgt[r] < hi ? z[tgt[r] - lo] : 0.0f;
    }
}

void rf_op_vxent_sumexp(double *se, const float *logits, int ldz, const float *mx, int lo, int hi,
                        int N) {
    for (int r = 0; r < N; r++) {
        const float *z = logits + (size_t)r * ldz;
        double s = 0;
        for (int k = 0; k < hi - lo; k++)
            s += exp((double)z[k] - mx[r]);
        se[r] = s;
    }
}

void rf_op_vxent_loss(float *loss, float *losses, const float *mx, const double *se,
                      const int32_t *tgt, int N) {
    double total = 0;
    int counted = 0;
    for (int r = 0; r < N; r++) {
        if (tgt[r] < 0) {
            losses[r] = 0;
            continue;
        }
        losses[r] = (float)(log(se[r]) + mx[r] - losses[r]);
        total += losses[r];
        counted++;
    }
    *loss = counted ? (float)(total / counted) : 0.0f;
}

void rf_op_vxent_bwd(float *dlogits, int ldd, const float *logits, int ldz, const float *mx,
                     const double *se, const int32_t *tgt, int lo, int hi, int N, float scale) {
    int counted = 0;
    for (int r = 0; r < N; r++)
        counted += tgt[r] >= 0;
    if (!counted) return;
    float s = scale / counted;
    for (int r = 0; r < N; r++) {
        if (tgt[r] < 0) continue;
        const float *z = logits + (size_t)r * ldz;
        float *d = dlogits + (size_t)r * ldd;
        for (int k = 0; k < hi - lo; k++) {
            float p = (float)(exp((double)z[k] - mx[r]) / se[r]);
            d[k] += s * (p - (k + lo == tgt[r]));
        }
    }
}
