/* Numerical gradient checks of the causal-LM ops (ops_causal.h), as
 * test_ops.c does for the BERT ops: for a random projection L = sum(out * R)
 * (or the loss itself), each analytic gradient is compared with central
 * differences (h = 1e-2, objective summed in double); the relative error
 * (norm of the difference over the norm of the gradient) must stay below
 * 1e-2: float32 round-off gives ~1e-3, a wrong formula errors of order 1.
 * Also: outputs and gradients are bitwise the same with 1 and 2 threads, and
 * a few forward values are checked against their definitions. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <omp.h>

#include "gradcheck.h"
#include "common/rng.h"
#include "trainer/ops_causal.h"

/* ---- Conv1D ---- */
typedef struct {
    float *inp, *w, *b;
    int N, IC, OC;
} conv_ctx;
static void conv_fwd(check *c) {
    conv_ctx *k = c->ctx;
    rf_op_conv1d_fwd(c->out, k->inp, k->w, k->b, k->N, k->IC, k->OC);
}
static void test_conv1d(void **state) {
    (void)state;
    int N = 5, IC = 7, OC = 3;
    conv_ctx k = {randn(N * IC, 1), randn(IC * OC, 1), randn(OC, 1), N, IC, OC};
    check c = {conv_fwd, zeros(N * OC), randn(N * OC, 1), (size_t)N * OC, &k};
    objective(&c);
    /* out[0][1] by its definition: sum_i inp[0][i] w[i][1] + b[1] */
    double ref = k.b[1];
    for (int i = 0; i < IC; i++)
        ref += (double)k.inp[i] * k.w[i * OC + 1];
    assert_true(fabs(c.out[1] - ref) < 1e-5);
    float *di = zeros(N * IC), *dw = zeros(IC * OC), *db = zeros(OC);
    rf_op_conv1d_bwd(di, dw, db, c.R, k.inp, k.w, N, IC, OC);
    expect_grad(&c, k.inp, N * IC, di, "conv1d dinp");
    expect_grad(&c, k.w, IC * OC, dw, "conv1d dw");
    expect_grad(&c, k.b, OC, db, "conv1d db");
    free(k.inp), free(k.w), free(k.b), free(c.out), free(c.R), free(di), free(dw), free(db);
}

/* ---- token + position embedding ---- */
typedef struct {
    float *wte, *wpe;
    int32_t *ids;
    int B, T, C;
} tp_ctx;
static void tp_fwd(check *c) {
    tp_ctx *k = c->ctx;
    rf_op_tokpos_fwd(c->out, k->ids, NULL, k->wte, k->wpe, k->B, k->T, k->C);
}
static void test_tokpos(void **state) {
    (void)state;
    int B = 2, T = 3, C = 5, V = 4;
    int32_t ids[] = {1, 3, 1, 0, 1, 2};
    tp_ctx k = {randn(V * C, 1), randn(T * C, 1), ids, B, T, C};
    check c = {tp_fwd, zeros(B * T * C), randn(B * T * C, 1), (size_t)B * T * C, &k};
    float *dwte = zeros(V * C), *dwpe = zeros(T * C);
    rf_op_tokpos_bwd(dwte, dwpe, c.R, ids, NULL, B, T, C);
    expect_grad(&c, k.wte, V * C, dwte, "tokpos dwte");
    expect_grad(&c, k.wpe, T * C, dwpe, "tokpos dwpe");
    free(k.wte), free(k.wpe), free(c.out), free(c.R), free(dwte), free(dwpe);
}

/* ---- RMSNorm ---- */
typedef struct {
    float *inp, *w, *rstd;
    int N, C;
} rms_ctx;
static void rms_fwd(check *c) {
    rms_ctx *k = c->ctx;
    rf_op_rmsnorm_fwd(c->out, k->rstd, k->inp, k->w, k->N, k->C, 1e-6f);
}
static void test_rmsnorm(void **state) {
    (void)state;
    int N = 4, C = 9;
    rms_ctx k = {randn(N * C, 2), randn(C, 1), zeros(N), N, C};
    check c = {rms_fwd, zeros(N * C), randn(N * C, 1), (size_t)N * C, &k};
    objective(&c);
    double ss = 0;
    for (int i = 0; i < C; i++)
        ss += (double)k.inp[C + i] * k.inp[C + i];
    assert_true(fabs(c.out[C + 2] - k.w[2] * k.inp[C + 2] / sqrt(ss / C + 1e-6)) < 1e-5);
    float *di = zeros(N * C), *dw = zeros(C);
    rf_op_rmsnorm_bwd(di, dw, c.R, k.inp, k.w, k.rstd, N, C);
    expect_grad(&c, k.inp, N * C, di, "rmsnorm dinp");
    expect_grad(&c, k.w, C, dw, "rmsnorm dw");
    free(k.inp), free(k.w), free(k.rstd), free(c.out), free(c.R), free(di), free(dw);
}

/* ---- RoPE on the k part of a fused buffer ---- */
typedef struct {
    float *inp;
    int N, T, nh, hs, stride;
} rope_ctx;
static void rope_fwd(check *c) {
    rope_ctx *k = c->ctx;
    memset(c->out, 0, sizeof(float) * c->nout);
    rf_op_rope_fwd(c->out + 4, k->inp + 4, NULL, k->N, k->T, k->nh, k->hs, k->stride, 10000.0f);
}
static void test_rope(void **state) {
    (void)state;
    int B = 2, T = 5, nh = 2, hs = 6, stride = 4 + nh * hs + 3, N = B * T;
    rope_ctx k = {randn(N * stride, 1), N, T, nh, hs, stride};
    check c = {rope_fwd, zeros(N * stride), randn(N * stride, 1), (size_t)N * stride, &k};
    objective(&c);
    /* row 3 (position 3), head 1, pair i = 1: angle 3 * 10000^(-2/6) */
    const float *x = k.inp + 3 * stride + 4 + hs, *o = c.out + 3 * stride + 4 + hs;
    double a = 3 * pow(10000.0, -2.0 / 6);
    assert_true(fabs(o[1] - (x[1] * cos(a) - x[4] * sin(a))) < 1e-5);
    assert_true(fabs(o[4] - (x[4] * cos(a) + x[1] * sin(a))) < 1e-5);
    /* position 0 is the identity; in place gives the same as out of place */
    for (int i = 0; i < nh * hs; i++)
        assert_true(c.out[4 + i] == k.inp[4 + i]);
    float *inplace = malloc(sizeof(float) * N * stride);
    memcpy(inplace, k.inp, sizeof(float) * N * stride);
    rf_op_rope_fwd(inplace + 4, inplace + 4, NULL, N, T, nh, hs, stride, 10000.0f);
    for (int n = 0; n < N; n++)
        assert_memory_equal(inplace + n * stride + 4, c.out + n * stride + 4,
                            sizeof(float) * nh * hs);
    float *di = zeros(N * stride);
    rf_op_rope_bwd(di + 4, c.R + 4, NULL, N, T, nh, hs, stride, 10000.0f);
    for (int n = 0; n < N; n++) /* columns outside the heads get nothing */
        assert_true(di[n * stride] == 0 && di[n * stride + 4 + nh * hs] == 0);
    expect_grad(&c, k.inp, N * stride, di, "rope dinp");
    free(k.inp), free(c.out), free(c.R), free(di), free(inplace);
}

/* ---- SwiGLU ---- */
typedef struct {
    float *gu;
    int N, F;
} swi_ctx;
static void swi_fwd(check *c) {
    swi_ctx *k = c->ctx;
    rf_op_swiglu_fwd(c->out, k->gu, k->N, k->F);
}
static void test_swiglu(void **state) {
    (void)state;
    int N = 3, F = 7;
    swi_ctx k = {randn(N * 2 * F, 3), N, F};
    check c = {swi_fwd, zeros(N * F), randn(N * F, 1), (size_t)N * F, &k};
    objective(&c);
    float g = k.gu[2 * F + 3], u = k.gu[2 * F + F + 3];
    assert_true(fabs(c.out[F + 3] - g / (1 + exp(-g)) * u) < 1e-5);
    float *dgu = zeros(N * 2 * F);
    rf_op_swiglu_bwd(dgu, c.R, k.gu, N, F);
    expect_grad(&c, k.gu, N * 2 * F, dgu, "swiglu dgu");
    free(k.gu), free(c.out), free(c.R), free(dgu);
}

/* ---- tanh GELU ---- */
typedef struct {
    float *inp;
    size_t n;
} gelu_ctx;
static void gelu_fwd(check *c) {
    gelu_ctx *k = c->ctx;
    rf_op_gelu_tanh_fwd(c->out, k->inp, k->n);
}
static void test_gelu_tanh(void **state) {
    (void)state;
    size_t n = 40;
    gelu_ctx k = {randn(n, 4), n};
    check c = {gelu_fwd, zeros(n), randn(n, 1), n, &k};
    objective(&c);
    for (size_t i = 0; i < n; i++) {
        double x = k.inp[i];
        double ref = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
        assert_true(fabs(c.out[i] - ref) < 1e-6 * (1 + fabs(ref)));
    }
    float *di = zeros(n);
    rf_op_gelu_tanh_bwd(di, k.inp, c.R, n);
    expect_grad(&c, k.inp, n, di, "gelu_tanh dinp");
    free(k.inp), free(c.out), free(c.R), free(di);
}

/* ---- causal attention with GQA and padding ---- */
typedef struct {
    float *qkv, *att;
    const uint8_t *valid;
    const int32_t *seg;
    int B, T, NH, NKV, hs;
} att_ctx;
static void att_fwd(check *c) {
    att_ctx *k = c->ctx;
    rf_op_causal_attention_fwd(c->out, k->att, k->qkv, k->valid, k->seg, k->B, k->T, k->NH, k->NKV,
                               k->hs);
}
static void check_attention(int NH, int NKV, bool packed, const char *what) {
    int B = 2, T = 5, hs = 4, W = (NH + 2 * NKV) * hs;
    uint8_t valid[] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0}; /* sequence 1: 3 tokens + 2 padding */
    int32_t seg[] = {0, 0, 1, 1, 1, 0, 0, 0, 0, 0};   /* packed: sequence 0 holds 2 documents */
    att_ctx k = {
        randn(B * T * W, 1), zeros(B * NH * T * T), valid, packed ? seg : NULL, B, T, NH, NKV, hs};
    size_t nout = (size_t)B * T * NH * hs;
    check c = {att_fwd, zeros(nout), randn(nout, 1), nout, &k};
    objective(&c);
    /* position 0 sees only itself: its output is its kv head's value */
    for (int h = 0; h < NH; h++) {
        int g = h / (NH / NKV);
        for (int i = 0; i < hs; i++)
            assert_true(fabs(c.out[h * hs + i] - k.qkv[(NH + NKV + g) * hs + i]) < 1e-6);
    }
    /* causal and padding: no probability above the diagonal or on a padded key */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double s = 0;
                for (int j = 0; j < T; j++) {
                    float a = k.att[(((size_t)b * NH + h) * T + t) * T + j];
                    if (j > t || !valid[b * T + j]) assert_true(a == 0);
                    if (packed && seg[b * T + j] != seg[b * T + t]) assert_true(a == 0);
                    s += a;
                }
                assert_true(fabs(s - 1) < 1e-5);
            }
    /* out NULL (the backward's recompute): the same probabilities */
    size_t na = (size_t)B * NH * T * T;
    float *att1 = zeros(na);
    memcpy(att1, k.att, na * sizeof *att1);
    memset(k.att, 0xff, na * sizeof *k.att);
    rf_op_causal_attention_fwd(NULL, k.att, k.qkv, k.valid, k.seg, B, T, NH, NKV, hs);
    assert_memory_equal(k.att, att1, na * sizeof *att1);
    free(att1);
    float *dqkv = zeros(B * T * W), *scratch = zeros(B * NH * T);
    rf_op_causal_attention_bwd(dqkv, scratch, c.R, k.qkv, k.att, B, T, NH, NKV, hs);
    /* padded keys/values get no gradient */
    for (int i = NH * hs; i < W; i++)
        assert_true(dqkv[(size_t)(T + 4) * W + i] == 0);
    char name[64];
    snprintf(name, sizeof name, "%s dqkv", what);
    expect_grad(&c, k.qkv, B * T * W, dqkv, name);
    free(k.qkv), free(k.att), free(c.out), free(c.R), free(dqkv), free(scratch);
}
static void test_attention_mha(void **state) {
    (void)state;
    check_attention(3, 3, false, "attention mha");
}
static void test_attention_gqa(void **state) {
    (void)state;
    check_attention(4, 2, false, "attention gqa 4/2");
    check_attention(4, 1, false, "attention mqa 4/1");
}

/* Packed documents: gradients, no probability across a document boundary, and
 * the second document's output equals attention over that document alone. */
static void test_attention_packed(void **state) {
    (void)state;
    check_attention(4, 2, true, "attention packed 4/2");
    int T = 7, NH = 2, NKV = 1, hs = 4, W = (NH + 2 * NKV) * hs, A = NH * hs;
    int32_t seg[] = {0, 0, 0, 1, 1, 1, 1};
    float *qkv = randn(T * W, 1), *out = zeros(T * A), *att = zeros(NH * T * T);
    float *alone = zeros(4 * A), *att1 = zeros(NH * 4 * 4);
    rf_op_causal_attention_fwd(out, att, qkv, NULL, seg, 1, T, NH, NKV, hs);
    rf_op_causal_attention_fwd(alone, att1, qkv + 3 * W, NULL, NULL, 1, 4, NH, NKV, hs);
    assert_memory_equal(out + 3 * A, alone, sizeof(float) * 4 * A);
    free(qkv), free(out), free(att), free(alone), free(att1);
}

/* ---- tied LM head + causal cross-entropy: the objective is the loss ---- */
typedef struct {
    float *h, *wte, *logits, *lse, *losses;
    const int32_t *labels;
    int B, T, C, V, counted;
} lm_ctx;
static void lm_fwd(check *c) {
    lm_ctx *k = c->ctx;
    rf_op_lm_head_fwd(k->logits, k->h, k->wte, k->B * k->T, k->C, k->V);
    c->out[0] = rf_op_causal_xent_fwd(k->lse, k->losses, &k->counted, k->logits, k->labels, k->B,
                                      k->T, k->V);
}
static void test_lm_head_xent(void **state) {
    (void)state;
    int B = 2, T = 4, C = 6, V = 9, N = B * T;
    /* sequence 0: all labels; sequence 1: one ignored (-100), then padding */
    int32_t labels[] = {3, 1, 8, 0, 2, -100, 5, -100};
    lm_ctx k = {
        randn(N * C, 1), randn(V * C, 1), zeros(N * V), zeros(N), zeros(N), labels, B, T, C, V, 0};
    float one = 1;
    check c = {lm_fwd, zeros(1), &one, 1, &k};
    objective(&c);
    /* counted: positions 0-2 of sequence 0 and position 1 of sequence 1 (label 5) */
    assert_int_equal(k.counted, 4);
    double ref = 0;
    int rows[] = {0, 1, 2, 5}, ys[] = {1, 8, 0, 5};
    for (int r = 0; r < 4; r++) {
        const float *z = k.logits + (size_t)rows[r] * V;
        double s = 0;
        for (int j = 0; j < V; j++)
            s += exp(z[j]);
        ref += log(s) - z[ys[r]];
        assert_true(fabs(k.losses[rows[r]] - (log(s) - z[ys[r]])) < 1e-5);
    }
    assert_true(fabs(c.out[0] - ref / 4) < 1e-5);
    assert_true(k.losses[3] == 0 && k.losses[4] == 0 && k.losses[7] == 0);
    float *dlogits = zeros(N * V), *dh = zeros(N * C), *dwte = zeros(V * C);
    rf_op_causal_xent_bwd(dlogits, k.logits, k.lse, labels, B, T, V, 1.0f);
    rf_op_lm_head_bwd(dh, dwte, dlogits, k.h, k.wte, N, C, V);
    expect_grad(&c, k.h, N * C, dh, "lm head dh");
    expect_grad(&c, k.wte, V * C, dwte, "lm head dwte");
    free(k.h), free(k.wte), free(k.logits), free(k.lse), free(k.losses), free(c.out);
    free(dlogits), free(dh), free(dwte);
}

/* Every op gives the same bits with 1 and 2 threads, on sizes past the
 * serial thresholds and past one product piece. */
static void test_thread_count(void **state) {
    (void)state;
    int B = 3, T = 48, NH = 4, NKV = 2, hs = 16, C = NH * hs, W = (NH + 2 * NKV) * hs, N = B * T;
    int V = 100, F = 96;
    float *qkv = randn(N * W, 1), *x = randn(N * C, 1), *w = randn(C * W, 1), *b = randn(W, 1),
          *dW = randn(N * W, 1), *dC = randn(N * C, 1), *nw = randn(C, 1), *wte = randn(V * C, 1),
          *gu = randn(N * 2 * F, 2), *dF = randn(N * F, 1);
    int32_t *labels = malloc(sizeof(int32_t) * N);
    int32_t *seg = malloc(sizeof(int32_t) * N);
    uint8_t *valid = malloc(N);
    for (int n = 0; n < N; n++) {
        labels[n] = n % 7 == 0 ? -100 : (int32_t)(n * 13 % V);
        valid[n] = !(n / T == 2 && n % T > 40);
        seg[n] = n / T == 1 && n % T >= 20; /* sequence 1 packs two documents */
    }
    size_t sz[] = {
        (size_t)N * C,     (size_t)B * NH * T * T, (size_t)N * W,    (size_t)N * W, (size_t)C * W,
        (size_t)W,         (size_t)N * C,          (size_t)N,        (size_t)C,     (size_t)N * V,
        (size_t)N,         (size_t)N * V,          (size_t)V * C,    (size_t)N * W, (size_t)N * F,
        (size_t)N * 2 * F, (size_t)N * W,          (size_t)N * 2 * F};
    enum { NB = sizeof sz / sizeof sz[0] };
    float *r[2][NB];
    float loss[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        for (int i = 0; i < NB; i++)
            r[t][i] = zeros(sz[i]);
        float *scratch = zeros(B * NH * T);
        rf_op_causal_attention_fwd(r[t][0], r[t][1], qkv, valid, seg, B, T, NH, NKV, hs);
        rf_op_causal_attention_bwd(r[t][2], scratch, dC, qkv, r[t][1], B, T, NH, NKV, hs);
        rf_op_conv1d_fwd(r[t][3], x, w, b, N, C, W);
        rf_op_conv1d_bwd(r[t][6], r[t][4], r[t][5], dW, x, w, N, C, W);
        float *nrm = zeros(N * C);
        rf_op_rmsnorm_fwd(nrm, r[t][7], x, nw, N, C, 1e-5f);
        rf_op_rmsnorm_bwd(r[t][6], r[t][8], dC, x, nw, r[t][7], N, C);
        rf_op_lm_head_fwd(r[t][9], x, wte, N, C, V);
        int counted;
        float *losses = zeros(N);
        loss[t] = rf_op_causal_xent_fwd(r[t][10], losses, &counted, r[t][9], labels, B, T, V);
        rf_op_causal_xent_bwd(r[t][11], r[t][9], r[t][10], labels, B, T, V, 1.0f);
        rf_op_lm_head_bwd(r[t][6], r[t][12], r[t][11], x, wte, N, C, V);
        rf_op_rope_fwd(r[t][13], qkv, NULL, N, T, NH + NKV, hs, W, 10000.0f);
        rf_op_rope_bwd(r[t][16], dW, NULL, N, T, NH + NKV, hs, W, 10000.0f);
        rf_op_swiglu_fwd(r[t][14], gu, N, F);
        rf_op_swiglu_bwd(r[t][15], dF, gu, N, F);
        rf_op_gelu_tanh_bwd(r[t][17], gu, gu, (size_t)N * 2 * F);
        free(scratch), free(nrm), free(losses);
    }
    omp_set_num_threads(2);
    assert_memory_equal(&loss[0], &loss[1], sizeof(float));
    for (int i = 0; i < NB; i++) {
        assert_memory_equal(r[0][i], r[1][i], sizeof(float) * sz[i]);
        free(r[0][i]), free(r[1][i]);
    }
    free(qkv), free(x), free(w), free(b), free(dW), free(dC), free(nw), free(wte), free(gu);
    free(dF), free(labels), free(valid), free(seg);
}

int main(void) {
    rf_rng_seed(&rng, 1234);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv1d),           cmocka_unit_test(test_tokpos),
        cmocka_unit_test(test_rmsnorm),          cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),           cmocka_unit_test(test_gelu_tanh),
        cmocka_unit_test(test_attention_mha),    cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_packed), cmocka_unit_test(test_lm_head_xent),
        cmocka_unit_test(test_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
