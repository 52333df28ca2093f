/* Tensor-parallel ops (tp.h): the group's backend's slots (ops.c's and
 * ops_tp.c's kernels on the CPU) and the group's all-reduces. */
#include "trainer/tp.h"

#include <stdbool.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

/* Megatron's g in backward: the replicated input's gradient is the sum of the
 * ranks' parts. Ranks other than 0 drop the (replicated) value dinp held so
 * that the sum counts it once. */
static int drop_replica(const rf_tp_group *g, float *dinp, size_t n) {
    if (dinp && rf_comm_rank(g->c) != 0) return g->be->zero(g->be, dinp, n * sizeof(float));
    return RF_OK;
}

/* Every all-reduce of these ops, timed and counted (rf_tp_comm_stats). */
static double comm_seconds;
static uint64_t comm_bytes, comm_calls;

/* A device's kernels run asynchronously: what they wrote is read by the
 * collective only after they are done: a group ordered after the backend's
 * queue (comm.h) waits for them on the device; any other waits here on the
 * host (to_host waits for the queue; that wait is the kernels' time, not the
 * collective's). */
static int allreduce(const rf_tp_group *g, void *x, size_t n, rf_comm_dtype t, rf_comm_op op) {
    int w = rf_comm_world(g->c);
    float tmp;
    int rc = g->sync && !rf_comm_ordered(g->c) ? g->be->to_host(g->be, &tmp, g->sync, sizeof tmp)
                                               : RF_OK;
    if (rc) return rc;
    double t0 = rf_now();
    rc = rf_comm_allreduce(g->c, x, x, n, t, op);
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

static int sum_over(const rf_tp_group *g, float *x, size_t n) {
    return x ? allreduce(g, x, n, RF_COMM_F32, RF_COMM_SUM) : RF_OK;
}

int rf_tp_sum(const rf_tp_group *g, float *x, size_t n) {
    return sum_over(g, x, n);
}

int rf_tp_colpar_fwd(const rf_tp_group *g, float *out, int ldo, const float *inp, const float *w,
                     int ldw, const float *b, int N, int IC, int OCl) {
    return g->be->linear_ld_fwd(g->be, out, ldo, inp, IC, w, ldw, b, N, IC, OCl);
}

int rf_tp_colpar_bwd(const rf_tp_group *g, float *dinp, float *dw, float *db, int ldw,
                     const float *dout, int ldd, const float *inp, const float *w, int N, int IC,
                     int OCl) {
    TRY(drop_replica(g, dinp, (size_t)N * IC));
    TRY(g->be->linear_ld_bwd(g->be, dinp, IC, dw, ldw, db, dout, ldd, inp, IC, w, ldw, N, IC, OCl));
    return sum_over(g, dinp, (size_t)N * IC);
}

int rf_tp_rowpar_fwd(const rf_tp_group *g, float *out, const float *inp, int ldi, const float *w,
                     int ldw, const float *b, int N, int ICl, int OC) {
    TRY(g->be->linear_ld_fwd(g->be, out, OC, inp, ldi, w, ldw, rf_comm_rank(g->c) == 0 ? b : NULL,
                             N, ICl, OC));
    return sum_over(g, out, (size_t)N * OC);
}

int rf_tp_rowpar_bwd(const rf_tp_group *g, float *dinp, int ldi, float *dw, int ldw, float *db,
                     const float *dout, const float *inp, const float *w, int N, int ICl, int OC) {
    return g->be->linear_ld_bwd(g->be, dinp, ldi, dw, ldw, db, dout, OC, inp, ldi, w, ldw, N, ICl,
                                OC);
}

int rf_tp_qkv_fwd(const rf_tp_group *g, float *out, const float *inp, const float *w,
                  const float *b, int wstride, int N, int C, int Cl) {
    for (int j = 0; j < 3; j++) /* q, k, v: each Cl output columns of out */
        TRY(g->be->linear_ld_fwd(g->be, out + (size_t)j * Cl, 3 * Cl, inp, C,
                                 w + (size_t)j * wstride * C, C, b ? b + (size_t)j * wstride : NULL,
                                 N, C, Cl));
    return RF_OK;
}

int rf_tp_qkv_bwd(const rf_tp_group *g, float *dinp, float *dw, float *db, int wstride,
                  const float *dout, const float *inp, const float *w, int N, int C, int Cl) {
    TRY(drop_replica(g, dinp, (size_t)N * C));
    for (int j = 0; j < 3; j++)
        TRY(g->be->linear_ld_bwd(g->be, dinp, C, dw + (size_t)j * wstride * C, C,
                                 db ? db + (size_t)j * wstride : NULL, dout + (size_t)j * Cl,
                                 3 * Cl, inp, C, w + (size_t)j * wstride * C, C, N, C, Cl));
    return sum_over(g, dinp, (size_t)N * C);
}

int rf_tp_embed_fwd(const rf_tp_group *g, float *out, const int32_t *ids, const int32_t *pos,
                    const int32_t *types, const float *wte_local, const rf_tp_vocab *v,
                    const float *wpe, const float *wtt, int B, int T, int C) {
    for (int n = 0; g->be == rf_backend_cpu() && n < B * T; n++) /* host ids (tp.h) */
        if (ids[n] < 0 || ids[n] >= v->V)
            return rf_fail(RF_ERR_RANGE, "vocab-parallel embedding: id %d at %d is outside [0, %d)",
                           ids[n], n, v->V);
    TRY(g->be->embed_rows_fwd(g->be, out, ids, wte_local, v->lo, v->hi, B * T, C));
    TRY(sum_over(g, out, (size_t)B * T * C)); /* one rank's row + zeros: exact */
    if (!wpe) return RF_OK;
    return g->be->embed_add_fwd(g->be, out, pos, types, wpe, wtt, B, T, C);
}

int rf_tp_embed_bwd(const rf_tp_group *g, float *dwte_local, float *dwpe, float *dwtt,
                    const float *dout, const int32_t *ids, const int32_t *types,
                    const rf_tp_vocab *v, int B, int T, int C) {
    return g->be->embed_rows_bwd(g->be, dwte_local, dwpe, dwtt, dout, ids, types, v->lo, v->hi, B,
                                 T, C);
}

int rf_tp_xent_fwd(const rf_tp_group *g, float *loss, float *losses, float *mx, double *se,
                   const float *logits, int ldz, const int32_t *labels, const rf_tp_vocab *v,
                   int N) {
    const rf_backend *be = g->be; /* losses holds the target logit until vxent_loss */
    TRY(be->vxent_stats(be, mx, losses, logits, ldz, labels, v->lo, v->hi, N));
    TRY(allreduce(g, mx, N, RF_COMM_F32, RF_COMM_MAX));
    TRY(allreduce(g, losses, N, RF_COMM_F32, RF_COMM_SUM)); /* exactly one rank's is not 0 */
    TRY(be->vxent_sumexp(be, se, logits, ldz, mx, v->lo, v->hi, N));
    TRY(allreduce(g, se, N, RF_COMM_F64, RF_COMM_SUM));
    return be->vxent_loss(be, loss, losses, mx, se, labels, N);
}

int rf_tp_xent_bwd(const rf_tp_group *g, float *dlogits, int ldd, const float *logits, int ldz,
                   const float *mx, const double *se, const int32_t *labels, const rf_tp_vocab *v,
                   int N, float scale) {
    return g->be->vxent_bwd(g->be, dlogits, ldd, logits, ldz, mx, se, labels, v->lo, v->hi, N,
                            scale);
}
