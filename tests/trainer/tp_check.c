/* The tensor-parallel ops (trainer/tp.h) against their unsplit versions
 * (ops.h), run by tests/trainer/tp.test.sh under scripts/mpirun.sh.
 *
 * Every rank builds the same full tensors from one seed, computes the unsplit
 * reference locally, then runs the split op on its slice over the tp group of
 * each mesh that fits the world (tp = world; at 4 ranks also dp 2 x tp 2).
 * For each output and gradient: the largest |split - unsplit| over the rank's
 * part, relative to the largest |unsplit| of that tensor, taken over all
 * ranks; whether it is bitwise equal on every rank; and, for replicated
 * results, whether every tp rank holds the same bits. Fails (exit 1) when an
 * error is above 1e-5 or a replicated result differs between ranks. Sizes
 * are odd where the split allows it. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/error.h"
#include "trainer/mesh.h"
#include "trainer/ops.h"
#include "trainer/ops_causal.h"
#include "trainer/tp.h"

#define TOL 1e-5

static rf_comm *g_world;
static int g_fail;
static char g_mesh[64];

static uint64_t g_rng;
static float rnd(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0) - 1.0);
}
static float *rand_buf(size_t n, float scale) {
    float *p = malloc(n * sizeof *p);
    if (!p) abort();
    for (size_t i = 0; i < n; i++)
        p[i] = scale * rnd();
    return p;
}
static float *dup(const float *x, size_t n) {
    float *p = malloc(n * sizeof *p);
    if (!p) abort();
    memcpy(p, x, n * sizeof *p);
    return p;
}
static float *zeros(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    if (!p) abort();
    return p;
}

static void die(const char *what, int rc) {
    fprintf(stderr, "rank %d: %s: %s (%d)\n", rf_comm_rank(g_world), what, rf_errmsg(), rc);
    exit(2);
}
#define OK(x)                                                                                      \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) die(#x, rc_);                                                                     \
    } while (0)

/* Compares a rows x cols block: got (row stride ldg) against ref (ldr). The
 * scale is the largest |ref| of the whole tensor (refall, nall elements), so
 * every rank divides by the same number. Collective over the world. */
/* The ops on host memory (the CPU backend) over group tp. */
#define TPG(tp) (&(rf_tp_group){(tp), rf_backend_cpu(), NULL})

static void check(const char *name, const float *got, int ldg, const float *ref, int ldr, int rows,
                  int cols, const float *refall, size_t nall) {
    double scale = 0, worst = 0;
    for (size_t i = 0; i < nall; i++)
        scale = fmax(scale, fabs(refall[i]));
    uint8_t bitwise = 1;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float a = got[(size_t)r * ldg + c], b = ref[(size_t)r * ldr + c];
            if (memcmp(&a, &b, sizeof a)) bitwise = 0;
            double d = fabs((double)a - b);
            if (!(d <= worst)) worst = isnan(d) ? INFINITY : d; /* NaN counts as a failure */
        }
    double rel = scale > 0 ? worst / scale : worst;
    OK(rf_comm_allreduce(g_world, &rel, &rel, 1, RF_COMM_F64, RF_COMM_MAX));
    OK(rf_comm_allreduce(g_world, &bitwise, &bitwise, 1, RF_COMM_U8, RF_COMM_MIN));
    int bad = !(rel <= TOL);
    if (rf_comm_rank(g_world) == 0)
        printf("%-5s %-34s rel err %.2e %s%s\n", bad ? "FAIL" : "ok", name, rel,
               bitwise ? "(bitwise)" : "(not bitwise)", bad ? " > 1e-5" : "");
    g_fail |= bad;
}

/* A replicated result must be the same bits on every rank of the tp group:
 * the element-wise max and min over the group both equal the local value. */
static void same_on_tp(const char *name, rf_comm *tp, const float *x, size_t n) {
    float *hi = dup(x, n), *lo = dup(x, n);
    OK(rf_comm_allreduce(tp, hi, hi, n, RF_COMM_F32, RF_COMM_MAX));
    OK(rf_comm_allreduce(tp, lo, lo, n, RF_COMM_F32, RF_COMM_MIN));
    uint8_t same = !memcmp(hi, x, n * sizeof *x) && !memcmp(lo, x, n * sizeof *x);
    OK(rf_comm_allreduce(g_world, &same, &same, 1, RF_COMM_U8, RF_COMM_MIN));
    if (rf_comm_rank(g_world) == 0)
        printf("%-5s %-34s %s\n", same ? "ok" : "FAIL", name,
               same ? "same bits on every tp rank" : "differs between tp ranks");
    g_fail |= !same;
    free(hi);
    free(lo);
}

static void title(const char *what) {
    if (rf_comm_rank(g_world) == 0) printf("-- %s, %s\n", g_mesh, what);
}

/* ---- column-parallel linear: N rows (21; 301 cuts the products into two
 * pieces, as ops.c does), IC 37, OC 36 (OCl 18 or 9) ---- */
static void test_colpar(rf_comm *tp, int N) {
    const int IC = 37, OC = 36, ntp = rf_comm_world(tp), r = rf_comm_rank(tp);
    const int OCl = OC / ntp;
    g_rng = 11;
    float *x = rand_buf((size_t)N * IC, 1), *W = rand_buf((size_t)OC * IC, 0.3f),
          *b = rand_buf(OC, 0.5f), *dy = rand_buf((size_t)N * OC, 1),
          *dx0 = rand_buf((size_t)N * IC, 0.1f), *dW0 = rand_buf((size_t)OC * IC, 0.1f),
          *db0 = rand_buf(OC, 0.1f);
    float *y = zeros((size_t)N * OC), *dx = dup(dx0, (size_t)N * IC),
          *dW = dup(dW0, (size_t)OC * IC), *db = dup(db0, OC);
    rf_op_linear_fwd(y, x, W, b, N, IC, OC);
    rf_op_linear_bwd(dx, dW, db, dy, x, W, N, IC, OC);

    char t[64];
    snprintf(t, sizeof t, "column-parallel linear [%dx37] -> 36", N);
    title(t);
    float *yl = zeros((size_t)N * OCl), *dxl = dup(dx0, (size_t)N * IC),
          *dWl = dup(dW0, (size_t)OC * IC), *dbl = dup(db0, OC);
    size_t wo = (size_t)r * OCl * IC; /* the rank's rows: a view of the full weight */
    OK(rf_tp_colpar_fwd(TPG(tp), yl, OCl, x, W + wo, IC, b + r * OCl, N, IC, OCl));
    OK(rf_tp_colpar_bwd(TPG(tp), dxl, dWl + wo, dbl + r * OCl, IC, dy + r * OCl, OC, x, W + wo, N,
                        IC, OCl));
    check("colpar out", yl, OCl, y + r * OCl, OC, N, OCl, y, (size_t)N * OC);
    check("colpar dinp (all-reduced)", dxl, IC, dx, IC, N, IC, dx, (size_t)N * IC);
    check("colpar dw (rank's rows)", dWl + wo, IC, dW + wo, IC, OCl, IC, dW, (size_t)OC * IC);
    check("colpar db", dbl + r * OCl, OCl, db + r * OCl, OCl, 1, OCl, db, OC);
    same_on_tp("colpar dinp replicated", tp, dxl, (size_t)N * IC);
    free(x), free(W), free(b), free(dy), free(dx0), free(dW0), free(db0), free(y), free(dx),
        free(dW), free(db), free(yl), free(dxl), free(dWl), free(dbl);
}

/* ---- row-parallel linear: N rows (21 or 301), IC 44 (ICl 22 or 11), OC 23;
 * the weight as a view of the full one (ldw = IC) and as a packed shard
 * (ldw = ICl) ---- */
static void test_rowpar(rf_comm *tp, int N) {
    const int IC = 44, OC = 23, ntp = rf_comm_world(tp), r = rf_comm_rank(tp);
    const int ICl = IC / ntp;
    g_rng = 12;
    float *x = rand_buf((size_t)N * IC, 1), *W = rand_buf((size_t)OC * IC, 0.3f),
          *b = rand_buf(OC, 0.5f), *dy = rand_buf((size_t)N * OC, 1),
          *dx0 = rand_buf((size_t)N * IC, 0.1f), *dW0 = rand_buf((size_t)OC * IC, 0.1f),
          *db0 = rand_buf(OC, 0.1f);
    float *y = zeros((size_t)N * OC), *dx = dup(dx0, (size_t)N * IC),
          *dW = dup(dW0, (size_t)OC * IC), *db = dup(db0, OC);
    rf_op_linear_fwd(y, x, W, b, N, IC, OC);
    rf_op_linear_bwd(dx, dW, db, dy, x, W, N, IC, OC);

    for (int packed = 0; packed < 2; packed++) {
        char t[80];
        snprintf(t, sizeof t, "row-parallel linear 44 -> [%dx23], %s", N,
                 packed ? "packed [23x44/tp] shard" : "view of the full weight");
        title(t);
        float *yl = zeros((size_t)N * OC), *dxl = dup(dx0, (size_t)N * IC), *dbl = dup(db0, OC);
        float *Wv, *dWv, *dWfull = dup(dW0, (size_t)OC * IC);
        int ldw;
        if (packed) { /* test set-up, not the hot path: the shard a rank would load */
            ldw = ICl;
            Wv = zeros((size_t)OC * ICl);
            dWv = zeros((size_t)OC * ICl);
            for (int o = 0; o < OC; o++) {
                memcpy(Wv + (size_t)o * ICl, W + (size_t)o * IC + r * ICl, ICl * sizeof(float));
                memcpy(dWv + (size_t)o * ICl, dW0 + (size_t)o * IC + r * ICl, ICl * sizeof(float));
            }
        } else {
            ldw = IC;
            Wv = W + r * ICl;
            dWv = dWfull + r * ICl;
        }
        OK(rf_tp_rowpar_fwd(TPG(tp), yl, x + r * ICl, IC, Wv, ldw, b, N, ICl, OC));
        OK(rf_tp_rowpar_bwd(TPG(tp), dxl + r * ICl, IC, dWv, ldw, dbl, dy, x + r * ICl, Wv, N, ICl,
                            OC));
        check("rowpar out (all-reduced)", yl, OC, y, OC, N, OC, y, (size_t)N * OC);
        check("rowpar dinp (rank's columns)", dxl + r * ICl, IC, dx + r * ICl, IC, N, ICl, dx,
              (size_t)N * IC);
        check("rowpar dw (rank's columns)", dWv, ldw, dW + r * ICl, IC, OC, ICl, dW,
              (size_t)OC * IC);
        check("rowpar db", dbl, OC, db, OC, 1, OC, db, OC);
        same_on_tp("rowpar out replicated", tp, yl, (size_t)N * OC);
        if (packed) free(Wv), free(dWv);
        free(yl), free(dxl), free(dbl), free(dWfull);
    }
    free(x), free(W), free(b), free(dy), free(dx0), free(dW0), free(db0), free(y), free(dx),
        free(dW), free(db);
}

/* ---- fused QKV [3C, C], C 20 = 4 heads of 5, split by heads ---- */
static void test_qkv(rf_comm *tp) {
    const int N = 21, C = 20, ntp = rf_comm_world(tp), r = rf_comm_rank(tp), Cl = C / ntp;
    g_rng = 13;
    float *x = rand_buf((size_t)N * C, 1), *W = rand_buf((size_t)3 * C * C, 0.3f),
          *b = rand_buf(3 * C, 0.5f), *dq = rand_buf((size_t)N * 3 * C, 1),
          *dx0 = rand_buf((size_t)N * C, 0.1f), *dW0 = rand_buf((size_t)3 * C * C, 0.1f),
          *db0 = rand_buf(3 * C, 0.1f);
    float *q = zeros((size_t)N * 3 * C), *dx = dup(dx0, (size_t)N * C),
          *dW = dup(dW0, (size_t)3 * C * C), *db = dup(db0, 3 * C);
    rf_op_linear_fwd(q, x, W, b, N, C, 3 * C);
    rf_op_linear_bwd(dx, dW, db, dq, x, W, N, C, 3 * C);
    /* the local output gradient [N, 3Cl] (in training: attention's backward) */
    float *dql = zeros((size_t)N * 3 * Cl);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < 3; j++)
            memcpy(dql + (size_t)n * 3 * Cl + j * Cl, dq + (size_t)n * 3 * C + j * C + r * Cl,
                   Cl * sizeof(float));

    for (int packed = 0; packed < 2; packed++) {
        title(packed ? "fused QKV [60x20] by heads, packed [3Cl x C] shard"
                     : "fused QKV [60x20] by heads, view of the full weight (wstride C)");
        float *ql = zeros((size_t)N * 3 * Cl), *dxl = dup(dx0, (size_t)N * C);
        float *Wv, *bv, *dWv, *dbv, *dWfull = dup(dW0, (size_t)3 * C * C),
                                    *dbfull = dup(db0, 3 * C);
        int ws;
        if (packed) {
            ws = Cl;
            Wv = zeros((size_t)3 * Cl * C), bv = zeros(3 * Cl), dWv = zeros((size_t)3 * Cl * C),
            dbv = zeros(3 * Cl);
            for (int j = 0; j < 3; j++) {
                size_t src = (size_t)(j * C + r * Cl) * C, dst = (size_t)j * Cl * C;
                memcpy(Wv + dst, W + src, (size_t)Cl * C * sizeof(float));
                memcpy(dWv + dst, dW0 + src, (size_t)Cl * C * sizeof(float));
                memcpy(bv + j * Cl, b + j * C + r * Cl, Cl * sizeof(float));
                memcpy(dbv + j * Cl, db0 + j * C + r * Cl, Cl * sizeof(float));
            }
        } else {
            ws = C;
            Wv = W + (size_t)r * Cl * C, bv = b + r * Cl, dWv = dWfull + (size_t)r * Cl * C,
            dbv = dbfull + r * Cl;
        }
        OK(rf_tp_qkv_fwd(TPG(tp), ql, x, Wv, bv, ws, N, C, Cl));
        OK(rf_tp_qkv_bwd(TPG(tp), dxl, dWv, dbv, ws, dql, x, Wv, N, C, Cl));
        const char *part[3][3] = {{"qkv out q_l", "qkv dw q rows", "qkv db q"},
                                  {"qkv out k_l", "qkv dw k rows", "qkv db k"},
                                  {"qkv out v_l", "qkv dw v rows", "qkv db v"}};
        for (int j = 0; j < 3; j++) {
            check(part[j][0], ql + j * Cl, 3 * Cl, q + j * C + r * Cl, 3 * C, N, Cl, q,
                  (size_t)N * 3 * C);
            check(part[j][1], dWv + (size_t)j * ws * C, C, dW + (size_t)(j * C + r * Cl) * C, C, Cl,
                  C, dW, (size_t)3 * C * C);
            check(part[j][2], dbv + j * ws, Cl, db + j * C + r * Cl, Cl, 1, Cl, db, 3 * C);
        }
        check("qkv dinp (all-reduced)", dxl, C, dx, C, N, C, dx, (size_t)N * C);
        same_on_tp("qkv dinp replicated", tp, dxl, (size_t)N * C);
        if (packed) free(Wv), free(bv), free(dWv), free(dbv);
        free(ql), free(dxl), free(dWfull), free(dbfull);
    }
    free(x), free(W), free(b), free(dq), free(dx0), free(dW0), free(db0), free(q), free(dx),
        free(dW), free(db), free(dql);
}

/* ---- vocab-parallel embedding: B 3, T 7, C 19, V 103 (and 5: at tp 4 the
 * last rank owns no id); padding rows of the shard are NaN, so reading one
 * would show ---- */
static void test_embed(rf_comm *tp, int V) {
    const int B = 3, T = 7, C = 19, TV = 2, N = B * T, ntp = rf_comm_world(tp),
              r = rf_comm_rank(tp);
    g_rng = 14 + V;
    float *wte = rand_buf((size_t)V * C, 1), *wpe = rand_buf((size_t)T * C, 1),
          *wtt = rand_buf((size_t)TV * C, 1), *dout = rand_buf((size_t)N * C, 1);
    int32_t ids[21], types[21];
    for (int n = 0; n < N; n++) {
        ids[n] = (int32_t)((rnd() + 1) * 0.5f * V) % V;
        types[n] = n % 3 == 0;
    }
    ids[0] = 0, ids[1] = V - 1, ids[2] = V - 1; /* both ends, one repeated */
    float *out = zeros((size_t)N * C), *dwte = zeros((size_t)V * C), *dwpe = zeros((size_t)T * C),
          *dwtt = zeros((size_t)TV * C);
    rf_op_embed_fwd(out, ids, types, wte, wpe, wtt, B, T, C);
    rf_op_embed_bwd(dwte, dwpe, dwtt, dout, ids, types, B, T, C, V, TV);

    rf_tp_vocab v;
    OK(rf_tp_vocab_split(V, ntp, r, &v));
    char t[96];
    snprintf(t, sizeof t, "vocab-parallel embedding V %d (rank %d: ids [%d, %d) of block %d)", V, r,
             v.lo, v.hi, v.block);
    title(t);
    float *wl = zeros((size_t)v.block * C), *dwl = zeros((size_t)v.block * C);
    for (size_t i = 0; i < (size_t)v.block * C; i++)
        wl[i] = NAN;
    memcpy(wl, wte + (size_t)v.lo * C, (size_t)(v.hi - v.lo) * C * sizeof(float));
    float *outl = zeros((size_t)N * C), *dwpel = zeros((size_t)T * C),
          *dwttl = zeros((size_t)TV * C);
    OK(rf_tp_embed_fwd(TPG(tp), outl, ids, NULL, types, wl, &v, wpe, wtt, B, T, C));
    OK(rf_tp_embed_bwd(TPG(tp), dwl, dwpel, dwttl, dout, ids, types, &v, B, T, C));
    check("embed out (all-reduced)", outl, C, out, C, N, C, out, (size_t)N * C);
    check("embed dwte (rank's rows)", dwl, C, dwte + (size_t)v.lo * C, C, v.hi - v.lo, C, dwte,
          (size_t)V * C);
    float *zpad = zeros((size_t)v.block * C); /* padding rows of the gradient stay 0 */
    check("embed dwte padding rows stay 0", dwl + (size_t)(v.hi - v.lo) * C, C, zpad, C,
          v.block - (v.hi - v.lo), C, dwte, (size_t)V * C);
    check("embed dwpe", dwpel, C, dwpe, C, T, C, dwpe, (size_t)T * C);
    check("embed dwtt", dwttl, C, dwtt, C, TV, C, dwtt, (size_t)TV * C);
    same_on_tp("embed out replicated", tp, outl, (size_t)N * C);
    int32_t bad[21];
    memcpy(bad, ids, sizeof bad);
    bad[5] = V;
    int rc = rf_tp_embed_fwd(TPG(tp), outl, bad, NULL, types, wl, &v, wpe, wtt, B, T, C);
    uint8_t refused = rc == RF_ERR_RANGE;
    OK(rf_comm_allreduce(g_world, &refused, &refused, 1, RF_COMM_U8, RF_COMM_MIN));
    if (rf_comm_rank(g_world) == 0)
        printf("%-5s %-34s %s\n", refused ? "ok" : "FAIL", "embed id == V refused",
               refused ? "RF_ERR_RANGE on every rank" : "not refused");
    g_fail |= !refused;
    free(wte), free(wpe), free(wtt), free(dout), free(out), free(dwte), free(dwpe), free(dwtt),
        free(wl), free(dwl), free(outl), free(dwpel), free(dwttl), free(zpad);
}

/* ---- vocab-parallel cross-entropy: N 21 rows (3 ignored), V 103 / 5 ---- */
static void test_xent(rf_comm *tp, int V) {
    const int N = 21, ntp = rf_comm_world(tp), r = rf_comm_rank(tp);
    const float scale = 0.75f;
    g_rng = 15 + V;
    float *z = rand_buf((size_t)N * V, 4), *dz0 = rand_buf((size_t)N * V, 0.01f);
    int32_t labels[21];
    for (int n = 0; n < N; n++)
        labels[n] = n % 7 == 3 ? -1 : (int32_t)((rnd() + 1) * 0.5f * V) % V;
    labels[0] = 0, labels[1] = V - 1;
    float *probs = zeros((size_t)N * V), losses[21], *dz = dup(dz0, (size_t)N * V);
    float loss = rf_op_xent_fwd(probs, losses, z, labels, NULL, N, V);
    rf_op_xent_bwd(dz, probs, labels, NULL, N, V, scale);

    rf_tp_vocab v;
    OK(rf_tp_vocab_split(V, ntp, r, &v));
    char t[64];
    snprintf(t, sizeof t, "vocab-parallel cross-entropy V %d", V);
    title(t);
    int nl = v.hi - v.lo;
    float *zl = zeros((size_t)N * v.block), *dzl = zeros((size_t)N * v.block);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < v.block; k++) {
            zl[(size_t)n * v.block + k] = k < nl ? z[(size_t)n * V + v.lo + k] : NAN; /* padding */
            dzl[(size_t)n * v.block + k] = k < nl ? dz0[(size_t)n * V + v.lo + k] : 0;
        }
    float lossl, lossesl[21], mx[21];
    double se[21];
    OK(rf_tp_xent_fwd(TPG(tp), &lossl, lossesl, mx, se, zl, v.block, labels, &v, N));
    OK(rf_tp_xent_bwd(TPG(tp), dzl, v.block, zl, v.block, mx, se, labels, &v, N, scale));
    check("xent loss (mean)", &lossl, 1, &loss, 1, 1, 1, &loss, 1);
    check("xent per-row losses", lossesl, N, losses, N, 1, N, losses, N);
    check("xent dlogits (rank's columns)", dzl, v.block, dz + v.lo, V, N, nl, dz, (size_t)N * V);
    float *zpad = zeros((size_t)N * v.block);
    check("xent dlogits padding stays 0", dzl + nl, v.block, zpad, v.block, N, v.block - nl, dz,
          (size_t)N * V);
    free(z), free(dz0), free(probs), free(dz), free(zl), free(dzl), free(zpad);
}

/* ---- the causal-LM loss, vocab-parallel: Hugging Face's shift
 * (rf_causal_targets) and rf_tp_xent against rf_op_causal_xent_*; B 3 x T 7,
 * some labels -100, V 103 / 5 (padding columns) ---- */
static void test_causal_xent(rf_comm *tp, int V) {
    const int B = 3, T = 7, N = B * T, ntp = rf_comm_world(tp), r = rf_comm_rank(tp);
    const float scale = 0.75f;
    g_rng = 25 + V;
    float *z = rand_buf((size_t)N * V, 4), *dz0 = rand_buf((size_t)N * V, 0.01f);
    int32_t labels[21], tgt[21];
    for (int n = 0; n < N; n++)
        labels[n] = n % 4 == 1 ? -100 : (int32_t)((rnd() + 1) * 0.5f * V) % V;
    labels[2] = 0, labels[3] = V - 1;
    float lse[21], losses[21], *dz = dup(dz0, (size_t)N * V);
    int counted;
    float loss = rf_op_causal_xent_fwd(lse, losses, &counted, z, labels, B, T, V);
    rf_op_causal_xent_bwd(dz, z, lse, labels, B, T, V, scale);

    rf_tp_vocab v;
    OK(rf_tp_vocab_split(V, ntp, r, &v));
    char t[64];
    snprintf(t, sizeof t, "vocab-parallel causal-LM loss V %d", V);
    title(t);
    int nl = v.hi - v.lo;
    float *zl = zeros((size_t)N * v.block), *dzl = zeros((size_t)N * v.block);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < v.block; k++) {
            zl[(size_t)n * v.block + k] = k < nl ? z[(size_t)n * V + v.lo + k] : NAN; /* padding */
            dzl[(size_t)n * v.block + k] = k < nl ? dz0[(size_t)n * V + v.lo + k] : 0;
        }
    float lossl, lossesl[21], mx[21];
    double se[21];
    float cl = (float)rf_causal_targets(tgt, labels, B, T), cr = (float)counted;
    OK(rf_tp_xent_fwd(TPG(tp), &lossl, lossesl, mx, se, zl, v.block, tgt, &v, N));
    OK(rf_tp_xent_bwd(TPG(tp), dzl, v.block, zl, v.block, mx, se, tgt, &v, N, scale));
    check("causal counted targets", &cl, 1, &cr, 1, 1, 1, &cr, 1);
    check("causal loss (mean)", &lossl, 1, &loss, 1, 1, 1, &loss, 1);
    check("causal per-row losses", lossesl, N, losses, N, 1, N, losses, N);
    check("causal dlogits (rank's columns)", dzl, v.block, dz + v.lo, V, N, nl, dz, (size_t)N * V);
    float *zpad = zeros((size_t)N * v.block);
    check("causal dlogits padding stays 0", dzl + nl, v.block, zpad, v.block, N, v.block - nl, dz,
          (size_t)N * V);
    same_on_tp("causal loss replicated", tp, &lossl, 1);
    free(z), free(dz0), free(dz), free(zl), free(dzl), free(zpad);
}

/* ---- the causal-LM head: logits = h wte^T with the vocab-parallel word
 * embedding as a column-parallel weight (its padding rows zero), then the
 * vocab-parallel cross-entropy; N 21, C 19, V 103 ---- */
static void test_lm_head(rf_comm *tp) {
    const int N = 21, C = 19, V = 103, ntp = rf_comm_world(tp), r = rf_comm_rank(tp);
    g_rng = 18;
    float *h = rand_buf((size_t)N * C, 1), *wte = rand_buf((size_t)V * C, 0.5f);
    int32_t labels[21];
    for (int n = 0; n < N; n++)
        labels[n] = n % 5 == 2 ? -1 : (int32_t)((rnd() + 1) * 0.5f * V) % V;
    float *z = zeros((size_t)N * V), *probs = zeros((size_t)N * V), losses[21],
          *dz = zeros((size_t)N * V), *dh = zeros((size_t)N * C), *dwte = zeros((size_t)V * C);
    rf_op_linear_fwd(z, h, wte, NULL, N, C, V);
    float loss = rf_op_xent_fwd(probs, losses, z, labels, NULL, N, V);
    rf_op_xent_bwd(dz, probs, labels, NULL, N, V, 1.0f);
    rf_op_linear_bwd(dh, dwte, NULL, dz, h, wte, N, C, V);

    title("LM head: tied vocab-parallel embedding + cross-entropy, V 103");
    rf_tp_vocab v;
    OK(rf_tp_vocab_split(V, ntp, r, &v));
    int nl = v.hi - v.lo;
    float *wl = zeros((size_t)v.block * C), *dwl = zeros((size_t)v.block * C);
    memcpy(wl, wte + (size_t)v.lo * C, (size_t)nl * C * sizeof(float)); /* padding rows 0 */
    float *zl = zeros((size_t)N * v.block), *dzl = zeros((size_t)N * v.block),
          *dhl = zeros((size_t)N * C), lossl, lossesl[21], mx[21];
    double se[21];
    OK(rf_tp_colpar_fwd(TPG(tp), zl, v.block, h, wl, C, NULL, N, C, v.block));
    OK(rf_tp_xent_fwd(TPG(tp), &lossl, lossesl, mx, se, zl, v.block, labels, &v, N));
    OK(rf_tp_xent_bwd(TPG(tp), dzl, v.block, zl, v.block, mx, se, labels, &v, N, 1.0f));
    OK(rf_tp_colpar_bwd(TPG(tp), dhl, dwl, NULL, C, dzl, v.block, h, wl, N, C, v.block));
    check("lm logits (rank's columns)", zl, v.block, z + v.lo, V, N, nl, z, (size_t)N * V);
    check("lm loss", &lossl, 1, &loss, 1, 1, 1, &loss, 1);
    check("lm dh (all-reduced)", dhl, C, dh, C, N, C, dh, (size_t)N * C);
    check("lm dwte (rank's rows)", dwl, C, dwte + (size_t)v.lo * C, C, nl, C, dwte, (size_t)V * C);
    float *zpad = zeros((size_t)v.block * C);
    check("lm dwte padding rows stay 0", dwl + (size_t)nl * C, C, zpad, C, v.block - nl, C, dwte,
          (size_t)V * C);
    same_on_tp("lm dh replicated", tp, dhl, (size_t)N * C);
    free(h), free(wte), free(z), free(probs), free(dz), free(dh), free(dwte), free(wl), free(dwl),
        free(zl), free(dzl), free(dhl), free(zpad);
}

/* ---- an attention block: QKV column-parallel, attention on the local heads,
 * output projection row-parallel; B 3, T 7 (lengths 7, 5, 3), C 20, 4 heads
 * of 5; no dropout ---- */
static void test_attention_block(rf_comm *tp) {
    const int B = 3, T = 7, N = B * T, C = 20, NH = 4, ntp = rf_comm_world(tp),
              r = rf_comm_rank(tp), Cl = C / ntp, NHl = NH / ntp;
    const int len[3] = {7, 5, 3};
    g_rng = 16;
    uint8_t valid[21];
    for (int n = 0; n < N; n++)
        valid[n] = n % T < len[n / T];
    float *x = rand_buf((size_t)N * C, 1), *Wq = rand_buf((size_t)3 * C * C, 0.4f),
          *bq = rand_buf(3 * C, 0.2f), *Wo = rand_buf((size_t)C * C, 0.3f), *bo = rand_buf(C, 0.2f),
          *dout = rand_buf((size_t)N * C, 1);
    /* unsplit */
    float *qkv = zeros((size_t)N * 3 * C), *ctx = zeros((size_t)N * C),
          *att = zeros((size_t)B * NH * T * T), *scr = zeros((size_t)B * NH * T * T),
          *out = zeros((size_t)N * C);
    float *dctx = zeros((size_t)N * C), *dqkv = zeros((size_t)N * 3 * C),
          *dx = zeros((size_t)N * C), *dWq = zeros((size_t)3 * C * C), *dbq = zeros(3 * C),
          *dWo = zeros((size_t)C * C), *dbo = zeros(C);
    rf_op_linear_fwd(qkv, x, Wq, bq, N, C, 3 * C);
    rf_op_attention_fwd(ctx, att, scr, qkv, valid, B, T, T, C, NH, 0, 0);
    rf_op_linear_fwd(out, ctx, Wo, bo, N, C, C);
    rf_op_linear_bwd(dctx, dWo, dbo, dout, ctx, Wo, N, C, C);
    rf_op_attention_bwd(dqkv, scr, dctx, qkv, att, B, T, T, C, NH, 0, 0);
    rf_op_linear_bwd(dx, dWq, dbq, dqkv, x, Wq, N, C, 3 * C);

    char t[96];
    snprintf(t, sizeof t, "attention block (%d of %d heads per rank)", NHl, NH);
    title(t);
    float *qkvl = zeros((size_t)N * 3 * Cl), *ctxl = zeros((size_t)N * Cl),
          *attl = zeros((size_t)B * NHl * T * T), *scrl = zeros((size_t)B * NHl * T * T),
          *outl = zeros((size_t)N * C), *dctxl = zeros((size_t)N * Cl),
          *dqkvl = zeros((size_t)N * 3 * Cl), *dxl = zeros((size_t)N * C),
          *dWql = zeros((size_t)3 * C * C), *dbql = zeros(3 * C), *dWol = zeros((size_t)C * C),
          *dbol = zeros(C);
    size_t wq = (size_t)r * Cl * C;
    OK(rf_tp_qkv_fwd(TPG(tp), qkvl, x, Wq + wq, bq + r * Cl, C, N, C, Cl));
    rf_op_attention_fwd(ctxl, attl, scrl, qkvl, valid, B, T, T, Cl, NHl, 0, 0);
    OK(rf_tp_rowpar_fwd(TPG(tp), outl, ctxl, Cl, Wo + r * Cl, C, bo, N, Cl, C));
    OK(rf_tp_rowpar_bwd(TPG(tp), dctxl, Cl, dWol + r * Cl, C, dbol, dout, ctxl, Wo + r * Cl, N, Cl,
                        C));
    rf_op_attention_bwd(dqkvl, scrl, dctxl, qkvl, attl, B, T, T, Cl, NHl, 0, 0);
    OK(rf_tp_qkv_bwd(TPG(tp), dxl, dWql + wq, dbql + r * Cl, C, dqkvl, x, Wq + wq, N, C, Cl));
    check("block out", outl, C, out, C, N, C, out, (size_t)N * C);
    check("block dx", dxl, C, dx, C, N, C, dx, (size_t)N * C);
    check("block dWo (rank's columns)", dWol + r * Cl, C, dWo + r * Cl, C, C, Cl, dWo,
          (size_t)C * C);
    check("block dbo", dbol, C, dbo, C, 1, C, dbo, C);
    for (int j = 0; j < 3; j++) {
        size_t o = (size_t)(j * C + r * Cl);
        check(j == 0   ? "block dWqkv q rows"
              : j == 1 ? "block dWqkv k rows"
                       : "block dWqkv v rows",
              dWql + o * C, C, dWq + o * C, C, Cl, C, dWq, (size_t)3 * C * C);
        /* the key bias's exact gradient is 0 (softmax ignores it): both sides
         * hold round-off, so every part is measured against the whole bias */
        check(j == 0   ? "block dbqkv q"
              : j == 1 ? "block dbqkv k (vs whole bias)"
                       : "block dbqkv v",
              dbql + o, Cl, dbq + o, Cl, 1, Cl, dbq, (size_t)3 * C);
    }
    same_on_tp("block out replicated", tp, outl, (size_t)N * C);
    same_on_tp("block dx replicated", tp, dxl, (size_t)N * C);
    free(x), free(Wq), free(bq), free(Wo), free(bo), free(dout), free(qkv), free(ctx), free(att),
        free(scr), free(out), free(dctx), free(dqkv), free(dx), free(dWq), free(dbq), free(dWo),
        free(dbo);
    free(qkvl), free(ctxl), free(attl), free(scrl), free(outl), free(dctxl), free(dqkvl), free(dxl),
        free(dWql), free(dbql), free(dWol), free(dbol);
}

/* ---- an MLP block: up column-parallel, GELU on the rank's columns, down
 * row-parallel; N 21, C 19, I 36 ---- */
static void test_mlp_block(rf_comm *tp) {
    const int N = 21, C = 19, I = 36, ntp = rf_comm_world(tp), r = rf_comm_rank(tp), Il = I / ntp;
    g_rng = 17;
    float *x = rand_buf((size_t)N * C, 1), *W1 = rand_buf((size_t)I * C, 0.4f),
          *b1 = rand_buf(I, 0.2f), *W2 = rand_buf((size_t)C * I, 0.3f), *b2 = rand_buf(C, 0.2f),
          *dout = rand_buf((size_t)N * C, 1);
    float *h = zeros((size_t)N * I), *a = zeros((size_t)N * I), *out = zeros((size_t)N * C),
          *da = zeros((size_t)N * I), *dh = zeros((size_t)N * I), *dx = zeros((size_t)N * C),
          *dW1 = zeros((size_t)I * C), *db1 = zeros(I), *dW2 = zeros((size_t)C * I),
          *db2 = zeros(C);
    rf_op_linear_fwd(h, x, W1, b1, N, C, I);
    rf_op_gelu_fwd(a, h, (size_t)N * I);
    rf_op_linear_fwd(out, a, W2, b2, N, I, C);
    rf_op_linear_bwd(da, dW2, db2, dout, a, W2, N, I, C);
    rf_op_gelu_bwd(dh, h, da, (size_t)N * I);
    rf_op_linear_bwd(dx, dW1, db1, dh, x, W1, N, C, I);

    title("MLP block 19 -> 36 -> 19");
    float *hl = zeros((size_t)N * Il), *al = zeros((size_t)N * Il), *outl = zeros((size_t)N * C),
          *dal = zeros((size_t)N * Il), *dhl = zeros((size_t)N * Il), *dxl = zeros((size_t)N * C),
          *dW1l = zeros((size_t)I * C), *db1l = zeros(I), *dW2l = zeros((size_t)C * I),
          *db2l = zeros(C);
    size_t w1 = (size_t)r * Il * C;
    OK(rf_tp_colpar_fwd(TPG(tp), hl, Il, x, W1 + w1, C, b1 + r * Il, N, C, Il));
    rf_op_gelu_fwd(al, hl, (size_t)N * Il);
    OK(rf_tp_rowpar_fwd(TPG(tp), outl, al, Il, W2 + r * Il, I, b2, N, Il, C));
    OK(rf_tp_rowpar_bwd(TPG(tp), dal, Il, dW2l + r * Il, I, db2l, dout, al, W2 + r * Il, N, Il, C));
    rf_op_gelu_bwd(dhl, hl, dal, (size_t)N * Il);
    OK(rf_tp_colpar_bwd(TPG(tp), dxl, dW1l + w1, db1l + r * Il, C, dhl, Il, x, W1 + w1, N, C, Il));
    check("mlp out", outl, C, out, C, N, C, out, (size_t)N * C);
    check("mlp dx", dxl, C, dx, C, N, C, dx, (size_t)N * C);
    check("mlp dW1 (rank's rows)", dW1l + w1, C, dW1 + w1, C, Il, C, dW1, (size_t)I * C);
    check("mlp db1", db1l + r * Il, Il, db1 + r * Il, Il, 1, Il, db1, I);
    check("mlp dW2 (rank's columns)", dW2l + r * Il, I, dW2 + r * Il, I, C, Il, dW2, (size_t)C * I);
    check("mlp db2", db2l, C, db2, C, 1, C, db2, C);
    same_on_tp("mlp out replicated", tp, outl, (size_t)N * C);
    same_on_tp("mlp dx replicated", tp, dxl, (size_t)N * C);
    free(x), free(W1), free(b1), free(W2), free(b2), free(dout), free(h), free(a), free(out),
        free(da), free(dh), free(dx), free(dW1), free(db1), free(dW2), free(db2);
    free(hl), free(al), free(outl), free(dal), free(dhl), free(dxl), free(dW1l), free(db1l),
        free(dW2l), free(db2l);
}

int main(void) {
    OK(rf_comm_init_from_env(NULL, &g_world));
    int world = rf_comm_world(g_world);
    int meshes[2][2] = {{1, world}, {2, world / 2}}; /* {dp, tp} */
    int nmesh = world == 4 ? 2 : 1;
    for (int i = 0; i < nmesh; i++) {
        rf_tr_parallel p = rf_tr_parallel_default();
        p.dp = meshes[i][0], p.tp = meshes[i][1];
        rf_comm_mesh m;
        OK(rf_tr_mesh_init(g_world, &p, &m));
        snprintf(g_mesh, sizeof g_mesh, "dp %d x tp %d", p.dp, p.tp);
        test_colpar(m.tp_comm, 21);
        test_colpar(m.tp_comm, 301);
        test_rowpar(m.tp_comm, 21);
        test_rowpar(m.tp_comm, 301);
        test_qkv(m.tp_comm);
        test_embed(m.tp_comm, 103);
        test_embed(m.tp_comm, 5);
        test_xent(m.tp_comm, 103);
        test_xent(m.tp_comm, 5);
        test_causal_xent(m.tp_comm, 103);
        test_causal_xent(m.tp_comm, 5);
        test_lm_head(m.tp_comm);
        test_attention_block(m.tp_comm);
        test_mlp_block(m.tp_comm);
        OK(rf_comm_mesh_destroy(&m));
    }
    if (rf_comm_rank(g_world) == 0)
        printf(g_fail ? "SOME CHECKS FAILED at %d rank(s)\n" : "all checks passed at %d rank(s)\n",
               world);
    OK(rf_comm_destroy(g_world));
    return g_fail ? 1 : 0;
}
