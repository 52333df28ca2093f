/* Tensor-parallel ops (tp.h). The products follow ops.c's scheme: a fixed
 * number of pieces along an output dimension, each a single-threaded sgemm
 * issued from inside one OpenMP region (see the top of ops.c), here with
 * leading dimensions so that a rank's slice of a tensor is a view, not a
 * copy. */
#include "trainer/tp.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"

#define ROW_PIECES 8 /* as ops.c */
#define W_PIECES   4
#define PIECE_MIN  128

static int pieces(int n, int want) {
    int p = n / PIECE_MIN;
    return p < 1 ? 1 : p < want ? p : want;
}

void rf_tp_linear_fwd(float *out, int ldo, const float *inp, int ldi, const float *w, int ldw,
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

void rf_tp_linear_bwd(float *dinp, int lddi, float *dw, int lddw, float *db, const float *dout,
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

/* Megatron's g in backward: the replicated input's gradient is the sum of the
 * ranks' parts. Ranks other than 0 drop the (replicated) value dinp held so
 * that the sum counts it once. */
static void drop_replica(rf_comm *tp, float *dinp, size_t n) {
    if (dinp && rf_comm_rank(tp) != 0) memset(dinp, 0, n * sizeof(float));
}

/* Every all-reduce of these ops, timed and counted (rf_tp_comm_stats). */
static double comm_seconds;
static uint64_t comm_bytes, comm_calls;

static int allreduce(rf_comm *tp, void *x, size_t n, rf_comm_dtype t, rf_comm_op op) {
    int w = rf_comm_world(tp);
    double t0 = rf_now();
    int rc = rf_comm_allreduce(tp, x, x, n, t, op);
    comm_seconds += rf_now() - t0;
    comm_bytes += 2 * (uint64_t)(w - 1) * n * rf_comm_dtype_size(t) / (uint64_t)w;
    comm_calls++;
    return rc;
}

void rf_tp_comm_stats(double *seconds, uint64_t *bytes, uint64_t *calls) {
    if (seconds) *seconds = comm_seconds;
    if (bytes) *bytes = comm_bytes;
    if (calls) *calls = comm_calls;
}

static int sum_over(rf_comm *tp, float *x, size_t n) {
    return x ? allreduce(tp, x, n, RF_COMM_F32, RF_COMM_SUM) : RF_OK;
}

int rf_tp_sum(rf_comm *tp, float *x, size_t n) {
    return sum_over(tp, x, n);
}

int rf_tp_colpar_fwd(float *out, int ldo, const float *inp, const float *w, int ldw, const float *b,
                     int N, int IC, int OCl) {
    rf_tp_linear_fwd(out, ldo, inp, IC, w, ldw, b, N, IC, OCl);
    return RF_OK;
}

int rf_tp_colpar_bwd(rf_comm *tp, float *dinp, float *dw, float *db, int ldw, const float *dout,
                     int ldd, const float *inp, const float *w, int N, int IC, int OCl) {
    drop_replica(tp, dinp, (size_t)N * IC);
    rf_tp_linear_bwd(dinp, IC, dw, ldw, db, dout, ldd, inp, IC, w, ldw, N, IC, OCl);
    return sum_over(tp, dinp, (size_t)N * IC);
}

int rf_tp_rowpar_fwd(rf_comm *tp, float *out, const float *inp, int ldi, const float *w, int ldw,
                     const float *b, int N, int ICl, int OC) {
    rf_tp_linear_fwd(out, OC, inp, ldi, w, ldw, rf_comm_rank(tp) == 0 ? b : NULL, N, ICl, OC);
    return sum_over(tp, out, (size_t)N * OC);
}

int rf_tp_rowpar_bwd(float *dinp, int ldi, float *dw, int ldw, float *db, const float *dout,
                     const float *inp, const float *w, int N, int ICl, int OC) {
    rf_tp_linear_bwd(dinp, ldi, dw, ldw, db, dout, OC, inp, ldi, w, ldw, N, ICl, OC);
    return RF_OK;
}

int rf_tp_qkv_fwd(float *out, const float *inp, const float *w, const float *b, int wstride, int N,
                  int C, int Cl) {
    for (int j = 0; j < 3; j++) /* q, k, v: each Cl output columns of out */
        rf_tp_linear_fwd(out + (size_t)j * Cl, 3 * Cl, inp, C, w + (size_t)j * wstride * C, C,
                         b ? b + (size_t)j * wstride : NULL, N, C, Cl);
    return RF_OK;
}

int rf_tp_qkv_bwd(rf_comm *tp, float *dinp, float *dw, float *db, int wstride, const float *dout,
                  const float *inp, const float *w, int N, int C, int Cl) {
    drop_replica(tp, dinp, (size_t)N * C);
    for (int j = 0; j < 3; j++)
        rf_tp_linear_bwd(dinp, C, dw + (size_t)j * wstride * C, C,
                         db ? db + (size_t)j * wstride : NULL, dout + (size_t)j * Cl, 3 * Cl, inp,
                         C, w + (size_t)j * wstride * C, C, N, C, Cl);
    return sum_over(tp, dinp, (size_t)N * C);
}

int rf_tp_embed_fwd(rf_comm *tp, float *out, const int32_t *ids, const int32_t *types,
                    const float *wte_local, const rf_tp_vocab *v, const float *wpe,
                    const float *wtt, int B, int T, int C) {
    for (int n = 0; n < B * T; n++)
        if (ids[n] < 0 || ids[n] >= v->V)
            return rf_fail(RF_ERR_RANGE, "vocab-parallel embedding: id %d at %d is outside [0, %d)",
                           ids[n], n, v->V);
#pragma omp parallel for schedule(static) if (B * T * C > 4096)
    for (int n = 0; n < B * T; n++) {
        float *o = out + (size_t)n * C;
        if (ids[n] >= v->lo && ids[n] < v->hi)
            memcpy(o, wte_local + (size_t)(ids[n] - v->lo) * C, sizeof(float) * C);
        else
            memset(o, 0, sizeof(float) * C);
    }
    int rc = sum_over(tp, out, (size_t)B * T * C); /* one rank's row + zeros: exact */
    if (rc || (!wpe && !wtt)) return rc;
#pragma omp parallel for schedule(static) if (B * T * C > 4096)
    for (int n = 0; n < B * T; n++) {
        const float *p = wpe + (size_t)(n % T) * C, *y = wtt + (size_t)types[n] * C;
        float *o = out + (size_t)n * C;
#pragma omp simd
        for (int i = 0; i < C; i++)
            o[i] = o[i] + p[i] + y[i]; /* (w + p) + y, as rf_op_embed_fwd */
    }
    return RF_OK;
}

/* As rf_op_embed_bwd: per channel block, rows in order. */
void rf_tp_embed_bwd(float *dwte_local, float *dwpe, float *dwtt, const float *dout,
                     const int32_t *ids, const int32_t *types, const rf_tp_vocab *v, int B, int T,
                     int C) {
    const int blk = 16;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += blk) {
        int c1 = c0 + blk < C ? c0 + blk : C;
        for (int n = 0; n < B * T; n++) {
            const float *d = dout + (size_t)n * C;
            if (ids[n] >= v->lo && ids[n] < v->hi) {
                float *w = dwte_local + (size_t)(ids[n] - v->lo) * C;
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

int rf_tp_xent_fwd(rf_comm *tp, float *loss, float *losses, float *mx, double *se,
                   const float *logits, int ldz, const int32_t *labels, const rf_tp_vocab *v,
                   int N) {
    int nl = v->hi - v->lo, rc;
    for (int r = 0; r < N; r++) {
        const float *z = logits + (size_t)r * ldz;
        float m = -INFINITY;
        for (int k = 0; k < nl; k++)
            m = z[k] > m ? z[k] : m;
        mx[r] = m;
    }
    if ((rc = allreduce(tp, mx, N, RF_COMM_F32, RF_COMM_MAX))) return rc;
    for (int r = 0; r < N; r++) { /* losses holds the target logit for now */
        int y = labels[r];
        losses[r] = y >= v->lo && y < v->hi ? logits[(size_t)r * ldz + (y - v->lo)] : 0.0f;
    }
    if ((rc = allreduce(tp, losses, N, RF_COMM_F32, RF_COMM_SUM))) return rc;
    for (int r = 0; r < N; r++) {
        const float *z = logits + (size_t)r * ldz;
        double s = 0;
        for (int k = 0; k < nl; k++)
            s += exp((double)z[k] - mx[r]);
        se[r] = s;
    }
    if ((rc = allreduce(tp, se, N, RF_COMM_F64, RF_COMM_SUM))) return rc;
    double total = 0;
    int counted = 0;
    for (int r = 0; r < N; r++) {
        if (labels[r] < 0) {
            losses[r] = 0;
            continue;
        }
        losses[r] = (float)(log(se[r]) + mx[r] - losses[r]);
        total += losses[r];
        counted++;
    }
    *loss = counted ? (float)(total / counted) : 0.0f;
    return RF_OK;
}

void rf_tp_xent_bwd(float *dlogits, int ldd, const float *logits, int ldz, const float *mx,
                    const double *se, const int32_t *labels, const rf_tp_vocab *v, int N,
                    float scale) {
    int counted = 0, nl = v->hi - v->lo;
    for (int r = 0; r < N; r++)
        counted += labels[r] >= 0;
    if (!counted) return;
    float s = scale / counted;
    for (int r = 0; r < N; r++) {
        if (labels[r] < 0) continue;
        const float *z = logits + (size_t)r * ldz;
        float *d = dlogits + (size_t)r * ldd;
        for (int k = 0; k < nl; k++) {
            float p = (float)(exp((double)z[k] - mx[r]) / se[r]);
            d[k] += s * (p - (k + v->lo == labels[r]));
        }
    }
}
