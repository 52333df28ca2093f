/* Numerical gradient checks of every op's backward: for a random projection
 * L = sum(out * R), each analytic gradient is compared with central
 * differences (h = 1e-2, objective summed in double). Float32 round-off then
 * bounds the error near 1e-3, so the check asserts a relative error (norm of
 * the difference over the norm of the gradient) below 1e-2 — a wrong formula
 * gives errors of order 1. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <omp.h>

#include "gradcheck.h"
#include "common/rng.h"
#include "trainer/backend.h"
#include "trainer/ops.h"

/* ---- linear ---- */
typedef struct {
    float *inp, *w, *b;
    int N, IC, OC;
} lin_ctx;
static void lin_fwd(check *c) {
    lin_ctx *k = c->ctx;
    rf_op_linear_fwd(c->out, k->inp, k->w, k->b, k->N, k->IC, k->OC);
}
static void test_linear(void **state) {
    lin_ctx k = {randn(5 * 7, 1), randn(3 * 7, 1), randn(3, 1), 5, 7, 3};
    check c = {lin_fwd, zeros(15), randn(15, 1), 15, &k};
    float *di = zeros(35), *dw = zeros(21), *db = zeros(3);
    rf_op_linear_bwd(di, dw, db, c.R, k.inp, k.w, 5, 7, 3);
    expect_grad(&c, k.inp, 35, di, "linear dinp");
    expect_grad(&c, k.w, 21, dw, "linear dw");
    expect_grad(&c, k.b, 3, db, "linear db");
    free(k.inp), free(k.w), free(k.b), free(c.out), free(c.R), free(di), free(dw), free(db);
}

/* ---- layernorm ---- */
typedef struct {
    float *inp, *w, *b, *mean, *rstd;
    int N, C;
} ln_ctx;
static void ln_fwd(check *c) {
    ln_ctx *k = c->ctx;
    rf_op_layernorm_fwd(c->out, k->mean, k->rstd, k->inp, k->w, k->b, k->N, k->C, 1e-12f);
}
static void test_layernorm(void **state) {
    int N = 4, C = 9;
    ln_ctx k = {randn(N * C, 2), randn(C, 1), randn(C, 1), zeros(N), zeros(N), N, C};
    check c = {ln_fwd, zeros(N * C), randn(N * C, 1), (size_t)N * C, &k};
    objective(&c);
    float *di = zeros(N * C), *dw = zeros(C), *db = zeros(C);
    rf_op_layernorm_bwd(di, dw, db, c.R, k.inp, k.w, k.mean, k.rstd, N, C);
    expect_grad(&c, k.inp, N * C, di, "layernorm dinp");
    expect_grad(&c, k.w, C, dw, "layernorm dw");
    expect_grad(&c, k.b, C, db, "layernorm db");
    free(k.inp), free(k.w), free(k.b), free(k.mean), free(k.rstd), free(c.out), free(c.R);
    free(di), free(dw), free(db);
}

/* The products are cut into fixed pieces, so 1 and 2 threads give the same
 * bits; K = 700 is past OpenBLAS's block of the summed dimension, and N = 32
 * is a single piece (which OpenBLAS would thread on its own otherwise). */
static void test_linear_thread_count(void **state) {
    int IC = 700, OC = 48;
    for (int N = 32; N <= 544; N += 512) {
        float *x = randn(N * IC, 1), *w = randn(OC * IC, 1), *b = randn(OC, 1),
              *dout = randn(N * OC, 1);
        float *out[2], *dx[2], *dw[2], *db[2];
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(t + 1);
            out[t] = zeros(N * OC), dx[t] = zeros(N * IC), dw[t] = zeros(OC * IC),
            db[t] = zeros(OC);
            rf_op_linear_fwd(out[t], x, w, b, N, IC, OC);
            rf_op_linear_bwd(dx[t], dw[t], db[t], dout, x, w, N, IC, OC);
        }
        assert_memory_equal(out[0], out[1], sizeof(float) * N * OC);
        assert_memory_equal(dx[0], dx[1], sizeof(float) * N * IC);
        assert_memory_equal(dw[0], dw[1], sizeof(float) * OC * IC);
        assert_memory_equal(db[0], db[1], sizeof(float) * OC);
        for (int t = 0; t < 2; t++)
            free(out[t]), free(dx[t]), free(dw[t]), free(db[t]);
        free(x), free(w), free(b), free(dout);
    }
}

/* ---- attention, with padding and dropout ---- */
typedef struct {
    float *qkv, *att, *scratch;
    uint8_t *valid;
    int B, T, Tq, C, NH;
    float p;
} att_ctx;
static void att_fwd(check *c) {
    att_ctx *k = c->ctx;
    rf_op_attention_fwd(c->out, k->att, k->scratch, k->qkv, k->valid, k->B, k->T, k->Tq, k->C,
                        k->NH, k->p, 77);
}
/* Tq < T: only the first Tq positions of each sequence are queries. */
static void run_attention(float p, int Tq) {
    int B = 2, T = 5, C = 8, NH = 2;
    uint8_t valid[10] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0}; /* second sequence padded */
    att_ctx k = {randn(B * T * 3 * C, 1),
                 zeros(B * NH * Tq * T),
                 zeros(B * NH * Tq * T),
                 valid,
                 B,
                 T,
                 Tq,
                 C,
                 NH,
                 p};
    check c = {att_fwd, zeros(B * Tq * C), randn(B * Tq * C, 1), (size_t)B * Tq * C, &k};
    objective(&c);
    /* out NULL (the backward's recompute): the same probabilities and, with
     * dropout, the same dropped ones in the scratch, which the backward reads */
    size_t na = (size_t)B * NH * Tq * T;
    float *att1 = zeros(na), *scr1 = zeros(na);
    memcpy(att1, k.att, na * sizeof *att1);
    memcpy(scr1, k.scratch, na * sizeof *scr1);
    memset(k.att, 0xff, na * sizeof *k.att);
    memset(k.scratch, 0xff, na * sizeof *k.scratch);
    rf_op_attention_fwd(NULL, k.att, k.scratch, k.qkv, k.valid, B, T, Tq, C, NH, p, 77);
    assert_memory_equal(k.att, att1, na * sizeof *att1);
    if (p > 0) assert_memory_equal(k.scratch, scr1, na * sizeof *scr1);
    /* att NULL (a forward whose backward recomputes): the same output, and
     * the same dropped probabilities left in another scratch */
    size_t no = (size_t)B * Tq * C;
    float *o1 = zeros(no), *o2 = zeros(no), *scr2 = zeros(na);
    rf_op_attention_fwd(o1, att1, scr1, k.qkv, k.valid, B, T, Tq, C, NH, p, 77);
    rf_op_attention_fwd(o2, NULL, scr2, k.qkv, k.valid, B, T, Tq, C, NH, p, 77);
    assert_memory_equal(o1, o2, no * sizeof *o1);
    if (p > 0) assert_memory_equal(scr1, scr2, na * sizeof *scr1);
    free(att1), free(scr1), free(scr2), free(o1), free(o2);
    float *dqkv = zeros(B * T * 3 * C);
    rf_op_attention_bwd(dqkv, k.scratch, c.R, k.qkv, k.att, B, T, Tq, C, NH, p, 77);
    expect_grad(&c, k.qkv, B * T * 3 * C, dqkv,
                p > 0 ? "attention+dropout dqkv" : "attention dqkv");
    /* padded keys get no gradient; neither do positions that are not queries */
    for (int t = 8; t < 10; t++)
        for (int i = C; i < 3 * C; i++)
            assert_true(dqkv[t * 3 * C + i] == 0.0f);
    for (int n = 0; n < B * T; n++)
        for (int i = 0; n % T >= Tq && i < C; i++)
            assert_true(dqkv[n * 3 * C + i] == 0.0f);
    free(k.qkv), free(k.att), free(k.scratch), free(c.out), free(c.R), free(dqkv);
}
static void test_attention(void **state) {
    run_attention(0, 5);
}
static void test_attention_dropout(void **state) {
    run_attention(0.3f, 5);
}
static void test_attention_cls_queries(void **state) {
    run_attention(0, 1);
    run_attention(0.3f, 2);
}

/* ---- elementwise ops ---- */
typedef struct {
    float *inp, *inp2;
    size_t n;
    int which;
} ew_ctx;
static void ew_fwd(check *c) {
    ew_ctx *k = c->ctx;
    switch (k->which) {
    case 0:
        rf_op_gelu_fwd(c->out, k->inp, k->n);
        break;
    case 1:
        rf_op_tanh_fwd(c->out, k->inp, k->n);
        break;
    case 2:
        rf_op_dropout_fwd(c->out, k->inp, k->n, 0.25f, 5);
        break;
    default: /* 3: residual, 4: residual with dropout on the branch */
        rf_op_residual_fwd(c->out, k->inp, k->inp2, k->n, k->which == 4 ? 0.25f : 0, 5);
        break;
    }
}
static void test_elementwise(void **state) {
    const char *names[] = {"gelu", "tanh", "dropout", "residual", "residual+dropout"};
    for (int which = 0; which < 5; which++) {
        size_t n = 50;
        ew_ctx k = {randn(n, 3), randn(n, 1), n, which};
        check c = {ew_fwd, zeros(n), randn(n, 1), n, &k};
        objective(&c);
        float *d = zeros(n), *d2 = zeros(n);
        switch (which) {
        case 0:
            rf_op_gelu_bwd(d, k.inp, c.R, n);
            break;
        case 1:
            rf_op_tanh_bwd(d, c.out, c.R, n);
            break;
        case 2:
            rf_op_dropout_bwd(d, c.R, n, 0.25f, 5);
            break;
        default:
            rf_op_residual_bwd(d, d2, c.R, n, which == 4 ? 0.25f : 0, 5);
            break;
        }
        expect_grad(&c, k.inp, n, d, names[which]);
        if (which >= 3) expect_grad(&c, k.inp2, n, d2, "residual b");
        if (which == 4) /* the branch is dropped exactly where rf_op_dropout_fwd drops */
            for (size_t i = 0; i < n; i++)
                assert_true((d[i] == 0.0f) == !rf_op_dropout_keep(5, i, 0.25f));
        free(k.inp), free(k.inp2), free(c.out), free(c.R), free(d), free(d2);
    }
}

/* Dropout keeps about 1-p of the elements and scales them by 1/(1-p). */
static void test_dropout_rate(void **state) {
    size_t n = 100000, kept = 0;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0f;
    rf_op_dropout_fwd(y, x, n, 0.1f, 123);
    for (size_t i = 0; i < n; i++) {
        if (y[i] != 0.0f) {
            kept++;
            assert_float_equal(y[i], 1.0f / 0.9f, 1e-6);
        }
    }
    assert_true(kept > 89500 && kept < 90500);
    free(x), free(y);
}

/* ---- embeddings ---- */
typedef struct {
    int32_t *ids, *types;
    float *wte, *wpe, *wtt;
    int B, T, C;
} emb_ctx;
static void emb_fwd(check *c) {
    emb_ctx *k = c->ctx;
    rf_op_embed_fwd(c->out, k->ids, k->types, k->wte, k->wpe, k->wtt, k->B, k->T, k->C);
}
static void test_embed(void **state) {
    int32_t ids[6] = {3, 1, 3, 0, 2, 3}, types[6] = {0, 0, 1, 1, 0, 1};
    int B = 2, T = 3, C = 4, V = 5, P = 3, TV = 2;
    emb_ctx k = {ids, types, randn(V * C, 1), randn(P * C, 1), randn(TV * C, 1), B, T, C};
    check c = {emb_fwd, zeros(B * T * C), randn(B * T * C, 1), (size_t)B * T * C, &k};
    float *dte = zeros(V * C), *dpe = zeros(P * C), *dtt = zeros(TV * C);
    rf_op_embed_bwd(dte, dpe, dtt, c.R, ids, types, B, T, C, V, TV);
    expect_grad(&c, k.wte, V * C, dte, "embed word");
    expect_grad(&c, k.wpe, P * C, dpe, "embed position");
    expect_grad(&c, k.wtt, TV * C, dtt, "embed type");
    free(k.wte), free(k.wpe), free(k.wtt), free(c.out), free(c.R), free(dte), free(dpe), free(dtt);
}

/* ---- cross-entropy: the loss itself is the objective ---- */
typedef struct {
    float *logits, *probs, *losses;
    int32_t *labels;
    int B, K;
    const float *weights; /* NULL: plain mean */
} xe_ctx;
static void xe_fwd(check *c) {
    xe_ctx *k = c->ctx;
    c->out[0] = rf_op_xent_fwd(k->probs, k->losses, k->logits, k->labels, k->weights, k->B, k->K);
}
static void test_xent(void **state) {
    int32_t labels[4] = {2, 0, -1, 1}; /* -1 is ignored */
    int B = 4, K = 3;
    xe_ctx k = {randn(B * K, 2), zeros(B * K), zeros(B), labels, B, K, NULL};
    float R = 1.0f, out;
    check c = {xe_fwd, &out, &R, 1, &k};
    objective(&c);
    float *d = zeros(B * K);
    rf_op_xent_bwd(d, k.probs, labels, NULL, B, K, 1.0f);
    expect_grad(&c, k.logits, B * K, d, "cross-entropy");
    for (int i = 0; i < K; i++)
        assert_true(d[2 * K + i] == 0.0f);
    free(k.logits), free(k.probs), free(k.losses), free(d);
}

/* Class weights (PyTorch's CrossEntropyLoss(weight=w)): the gradient of the
 * weighted mean, with a backward scale as gradient accumulation uses. */
static void test_xent_weighted(void **state) {
    int32_t labels[6] = {2, 0, -1, 1, 0, 2};
    const float w[3] = {4.0f, 0.25f, 1.5f};
    int B = 6, K = 3;
    xe_ctx k = {randn(B * K, 2), zeros(B * K), zeros(B), labels, B, K, w};
    float R = 0.5f, out; /* objective 0.5 * loss <-> backward scale 0.5 */
    check c = {xe_fwd, &out, &R, 1, &k};
    objective(&c);
    float *d = zeros(B * K);
    rf_op_xent_bwd(d, k.probs, labels, w, B, K, 0.5f);
    expect_grad(&c, k.logits, B * K, d, "weighted cross-entropy");
    for (int i = 0; i < K; i++)
        assert_true(d[2 * K + i] == 0.0f);
    free(k.logits), free(k.probs), free(k.losses), free(d);
}

/* The optimizer kernels of ops_optim.c: the sum of squares is the same at any
 * thread count and close to a long-double reference; scale multiplies; AdamW
 * on a shard [lo, hi) with its own moments equals the whole-range update on
 * those elements and leaves the others alone. */
static void test_optim_kernels(void **state) {
    (void)state;
    rf_rng r;
    rf_rng_seed(&r, 21);
    size_t n = 100003;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    long double ref = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(rf_rng_double(&r) * 2 - 1);
        ref += (long double)x[i] * x[i];
    }
    double s[3];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        s[t] = rf_op_sumsq(x, n);
    }
    omp_set_num_threads(2);
    assert_true(s[0] == s[1] && s[1] == s[2]);
    assert_true(fabsl(s[0] - ref) <= 1e-12L * ref);
    assert_true(rf_op_sumsq(x, 0) == 0.0);
    memcpy(y, x, n * sizeof *y);
    rf_op_scale(y, n, 0.25f);
    for (size_t i = 0; i < n; i++)
        assert_true(y[i] == x[i] * 0.25f);

    rf_param_span spans[] = {{0, 40000, true}, {40000, 3, false}, {40003, 60000, true}};
    rf_adamw_hp hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 0, NULL, 0};
    size_t lo = 39990, hi = 40010, k = hi - lo;
    float *g = malloc(n * sizeof *g), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
    float *ms = calloc(k, sizeof *ms), *vs = calloc(k, sizeof *vs);
    for (size_t i = 0; i < n; i++)
        g[i] = (float)(rf_rng_double(&r) - 0.5);
    memcpy(y, x, n * sizeof *y);
    rf_op_adamw(x, g, m, v, 0, n, spans, 3, &hp);
    rf_op_adamw(y, g, ms, vs, lo, hi, spans, 3, &hp);
    for (size_t i = 0; i < n; i++) {
        if (i >= lo && i < hi) {
            assert_true(y[i] == x[i] && ms[i - lo] == m[i] && vs[i - lo] == v[i]);
        } else {
            assert_true(x[i] != y[i] || g[i] == 0); /* updated only in the full run */
        }
    }
    /* the decay flag: a no-decay element with zero gradient does not move */
    float p1 = 1.0f, g0 = 0.0f, m1 = 0, v1 = 0;
    rf_param_span nd = {0, 1, false};
    rf_op_adamw(&p1, &g0, &m1, &v1, 0, 1, &nd, 1, &hp);
    assert_true(p1 == 1.0f);
    rf_param_span d = {0, 1, true};
    rf_op_adamw(&p1, &g0, &m1, &v1, 0, 1, &d, 1, &hp);
    assert_true(p1 == 1.0f - 1e-3f * 0.1f);
    /* clipping inside the update (hp.sumsq): bit for bit rf_op_scale by
     * rf_clip_coef then the plain update, for a norm above the clip (the
     * coefficient ~0.3), below it and with clipping off (both: times 1) */
    double ss = rf_op_sumsq(g, n);
    float clips[] = {0.3f * (float)sqrt(ss), 2.0f * (float)sqrt(ss), 0.0f};
    for (int c = 0; c < 3; c++) {
        float coef = rf_clip_coef(ss, clips[c]);
        assert_true(c == 0 ? coef < 0.31f && coef > 0.29f : coef == 1.0f);
        memset(m, 0, n * sizeof *m), memset(v, 0, n * sizeof *v);
        float *gc = malloc(n * sizeof *gc), *mc = calloc(n, sizeof *mc),
              *vc = calloc(n, sizeof *vc);
        memcpy(gc, g, n * sizeof *gc);
        memcpy(y, x, n * sizeof *y);
        if (coef < 1.0f) rf_op_scale(gc, n, coef);
        rf_adamw_hp plain = hp, clipped = hp;
        clipped.sumsq = &ss, clipped.clip_norm = clips[c];
        rf_op_adamw(x, gc, mc, vc, 0, n, spans, 3, &plain);
        rf_op_adamw(y, g, m, v, 0, n, spans, 3, &clipped);
        assert_memory_equal(x, y, n * sizeof *x);
        assert_memory_equal(mc, m, n * sizeof *m);
        assert_memory_equal(vc, v, n * sizeof *v);
        free(gc), free(mc), free(vc);
    }
    free(x), free(y), free(g), free(m), free(v), free(ms), free(vs);
}

/* The evaluation arg-max: the first of equal maxima, and the softmax. */
static void test_softmax_argmax(void **state) {
    (void)state;
    float z[] = {1, 3, 3, -2, 0.5f, 0.5f, 0.5f, 0.5f}, p[8];
    int32_t pred[2];
    rf_op_softmax_argmax(pred, p, z, 2, 4);
    assert_int_equal(pred[0], 1);
    assert_int_equal(pred[1], 0);
    double e = exp(-2.0), s = e + 2 + exp(-5.0);
    assert_float_equal(p[0], e / s, 1e-7);
    assert_float_equal(p[1], 1 / s, 1e-7);
    for (int k = 4; k < 8; k++)
        assert_float_equal(p[k], 0.25, 1e-7);
    rf_op_softmax_argmax(pred, NULL, z, 1, 4); /* probabilities not wanted */
    assert_int_equal(pred[0], 1);
}

int main(void) {
    rf_rng_seed(&rng, 42);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_linear_thread_count),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_dropout),
        cmocka_unit_test(test_attention_cls_queries),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_dropout_rate),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_xent),
        cmocka_unit_test(test_xent_weighted),
        cmocka_unit_test(test_optim_kernels),
        cmocka_unit_test(test_softmax_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
