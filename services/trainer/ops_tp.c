/* CPU kernels of tensor parallelism (ops.h: rf_op_embed_rows_*,
 * rf_op_embed_add_fwd, rf_op_vxent_*; the strided linear layer is ops.c's
 * rf_op_linear_ld_*): the pieces of tp.h's ops that touch model memory,
 * which the CPU backend's table points at and a device backend supplies
 * twins of. */
#include <math.h>
#include <string.h>

#include "trainer/ops.h"

#define OMP_MIN 4096 /* as ops.c */

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
