/* LoRA (lora.h): numerical gradient checks of the op (with and without
 * dropout), its values by definition, 1 vs 2 threads bitwise; on the tiny
 * GPT-2 and Llama fixtures: an adapter with B = 0 leaves the logits bitwise
 * those of the base; the base stays frozen (no gradient block, weights
 * unchanged by training) while the loss falls; the quantized bases (int8,
 * NF4, Q4_1) give the logits and adapter gradients of the fp32 path run on
 * their dequantized weights; whole models 1 vs 2 threads bitwise with
 * dropout; the PEFT files round-trip and bad ones are refused. Parity with
 * peft itself is test_parity_lora. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <omp.h>

#include "common/config.h"
#include "common/error.h"
#include "common/rng.h"
#include "common/sys.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/lora.h"
#include "trainer/safetensors.h"
#include "../support/skip.h"

static rf_rng rng;

static float *randu(size_t n, float scale) {
    float *x = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((rf_rng_double(&rng) * 2 - 1) * scale);
    return x;
}

static char *root_path(const char *rel) {
    const char *root = getenv("REFINERY_ROOT");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/%s", root ? root : ".", rel);
    return p;
}

static double rel(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++)
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(d) / fmax(sqrt(r), 1e-12);
}

/* ---- the op ---- */

typedef struct {
    float *x, *w, *A, *B, *out, *R, *u, *xd;
    int N, IC, OC, r;
    float s, p;
    uint64_t seed;
} op_ctx;

/* L = sum(R * (x W^T + s drop(x) A^T B^T)) in double. */
static double op_objective(op_ctx *k) {
    for (int n = 0; n < k->N; n++)
        for (int j = 0; j < k->OC; j++) {
            double v = 0;
            for (int i = 0; i < k->IC; i++)
                v += (double)k->x[n * k->IC + i] * k->w[j * k->IC + i];
            k->out[n * k->OC + j] = (float)v;
        }
    rf_op_lora_fwd(k->out, k->OC, k->u, k->xd, k->x, k->A, k->B, k->N, k->IC, k->OC, k->r, k->s,
                   k->p, k->seed);
    double L = 0;
    for (int i = 0; i < k->N * k->OC; i++)
        L += (double)k->out[i] * k->R[i];
    return L;
}

static double num_err(op_ctx *k, float *x, size_t n, const float *g, const float *base_g) {
    const float h = 1e-2f;
    double d2 = 0, n2 = 0;
    for (size_t i = 0; i < n; i++) {
        float keep = x[i];
        x[i] = keep + h;
        double fp = op_objective(k);
        x[i] = keep - h;
        double fm = op_objective(k);
        x[i] = keep;
        double num = (fp - fm) / (2 * h) - (base_g ? base_g[i] : 0);
        d2 += (num - g[i]) * (num - g[i]), n2 += num * num;
    }
    if (n2 == 0) fail_msg("gradient identically zero: the check would be vacuous");
    return sqrt(d2) / sqrt(n2);
}

static void check_op(float p) {
    op_ctx k = {.N = 6, .IC = 7, .OC = 5, .r = 3, .s = 2.5f, .p = p, .seed = 99};
    k.x = randu((size_t)k.N * k.IC, 1), k.w = randu((size_t)k.OC * k.IC, 1);
    k.A = randu((size_t)k.r * k.IC, 1), k.B = randu((size_t)k.OC * k.r, 1);
    k.out = calloc((size_t)k.N * k.OC, 4), k.R = randu((size_t)k.N * k.OC, 1);
    k.u = calloc((size_t)k.N * k.r, 4), k.xd = calloc((size_t)k.N * k.IC, 4);
    op_objective(&k);
    /* u by its definition (no dropout): u[n, r] = sum_i x[n, i] A[r, i] */
    if (p == 0) {
        double u01 = 0;
        for (int i = 0; i < k.IC; i++)
            u01 += (double)k.x[k.IC + i] * k.A[1 * k.IC + i];
        assert_true(fabs(k.u[1 * k.r + 1] - u01) < 1e-5);
    }
    float *dx = calloc((size_t)k.N * k.IC, 4), *dA = calloc((size_t)k.r * k.IC, 4),
          *dB = calloc((size_t)k.OC * k.r, 4), *du = calloc((size_t)k.N * k.r, 4);
    rf_op_lora_bwd(dx, dA, dB, du, k.xd, k.R, k.OC, k.x, k.u, k.A, k.B, k.N, k.IC, k.OC, k.r, k.s,
                   k.p, k.seed);
    /* dx holds the adapter's part only: the base's R W is subtracted from the numbers */
    float *bg = calloc((size_t)k.N * k.IC, 4);
    for (int n = 0; n < k.N; n++)
        for (int i = 0; i < k.IC; i++)
            for (int j = 0; j < k.OC; j++)
                bg[n * k.IC + i] += k.R[n * k.OC + j] * k.w[j * k.IC + i];
    double ex = num_err(&k, k.x, (size_t)k.N * k.IC, dx, bg),
           ea = num_err(&k, k.A, (size_t)k.r * k.IC, dA, NULL),
           eb = num_err(&k, k.B, (size_t)k.OC * k.r, dB, NULL);
    printf("  lora op, dropout %.1f: dx %.2e, dA %.2e, dB %.2e\n", p, ex, ea, eb);
    assert_true(ex < 1e-2 && ea < 1e-2 && eb < 1e-2);
    free(k.x), free(k.w), free(k.A), free(k.B), free(k.out), free(k.R), free(k.u), free(k.xd);
    free(dx), free(dA), free(dB), free(du), free(bg);
}

static void test_op_gradients(void **state) {
    (void)state;
    check_op(0.0f);
    check_op(0.3f); /* the same masks in backward as in forward */
}

/* Larger shapes cut into several pieces: 1 and 2 threads give the same bits. */
static void test_op_threads(void **state) {
    (void)state;
    int N = 700, IC = 96, OC = 80, r = 8;
    float *x = randu((size_t)N * IC, 1), *A = randu((size_t)r * IC, 1),
          *B = randu((size_t)OC * r, 1), *dout = randu((size_t)N * OC, 1);
    float *o[2], *dx[2], *dA[2], *dB[2];
    float *u = malloc(sizeof(float) * N * r), *du = malloc(sizeof(float) * N * r),
          *xd = malloc(sizeof(float) * N * IC);
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        o[t] = calloc((size_t)N * OC, 4), dx[t] = calloc((size_t)N * IC, 4);
        dA[t] = calloc((size_t)r * IC, 4), dB[t] = calloc((size_t)OC * r, 4);
        rf_op_lora_fwd(o[t], OC, u, xd, x, A, B, N, IC, OC, r, 2.0f, 0.1f, 7);
        rf_op_lora_bwd(dx[t], dA[t], dB[t], du, xd, dout, OC, x, u, A, B, N, IC, OC, r, 2.0f, 0.1f,
                       7);
    }
    assert_memory_equal(o[0], o[1], sizeof(float) * N * OC);
    assert_memory_equal(dx[0], dx[1], sizeof(float) * N * IC);
    assert_memory_equal(dA[0], dA[1], sizeof(float) * r * IC);
    assert_memory_equal(dB[0], dB[1], sizeof(float) * OC * r);
    for (int t = 0; t < 2; t++)
        free(o[t]), free(dx[t]), free(dA[t]), free(dB[t]);
    free(x), free(A), free(B), free(dout), free(u), free(du), free(xd);
}

/* ---- on the models ---- */

/* A batch of 2 x 8: the second row right-padded after 6 tokens, -100 labels there. */
static int32_t ids[16], labels[16];
static uint8_t valid[16];
static rf_causal_batch batch(int V) {
    for (int n = 0; n < 16; n++) {
        ids[n] = (int32_t)((n * 37 + 11) % V);
        valid[n] = !(n >= 14);
        labels[n] = valid[n] ? ids[n] : -100;
    }
    return (rf_causal_batch){.B = 2, .T = 8, .ids = ids, .labels = labels, .valid = valid};
}

/* Either model behind one small interface. */
typedef struct lm {
    bool llama;
    rf_gpt2 *g;
    rf_llama *l;
} lm;

static lm load(bool llama, const char *rel_dir) {
    char *dir = root_path(rel_dir);
    lm m = {.llama = llama};
    int rc = llama ? rf_llama_load(dir, &m.l) : rf_gpt2_load(dir, &m.g);
    if (rc) fail_msg("load %s: %s", dir, rf_errmsg());
    free(dir);
    return m;
}
static void lm_free(lm *m) {
    rf_gpt2_free(m->g), rf_llama_free(m->l);
}
static int vocab(const lm *m) {
    return m->llama ? m->l->cfg.vocab_size : m->g->cfg.vocab_size;
}
static rf_lora *lora_new(const lm *m, const rf_lora_config *c, uint64_t seed) {
    rf_lora *lo;
    int rc =
        m->llama ? rf_lora_new_llama(m->l, c, seed, &lo) : rf_lora_new_gpt2(m->g, c, seed, &lo);
    if (rc) fail_msg("lora: %s", rf_errmsg());
    return lo;
}
static void attach(lm *m, rf_lora *lo) {
    int rc = m->llama ? rf_lora_attach_llama(lo, m->l, true) : rf_lora_attach_gpt2(lo, m->g);
    if (rc) fail_msg("attach: %s", rf_errmsg());
    assert_int_equal(m->llama ? rf_llama_enable_training(m->l) : rf_gpt2_enable_training(m->g), 0);
    assert_int_equal(rf_lora_enable_training(lo), 0);
}
static float *fwd(lm *m, const rf_causal_batch *b, float *loss) {
    int rc = m->llama ? rf_llama_forward(m->l, b) : rf_gpt2_forward(m->g, b);
    if (rc) fail_msg("forward: %s", rf_errmsg());
    *loss = m->llama ? m->l->loss : m->g->loss;
    return m->llama ? m->l->logits : m->g->logits;
}
static void bwd(lm *m) {
    int rc = m->llama ? rf_llama_backward(m->l, 1.0f) : rf_gpt2_backward(m->g, 1.0f);
    if (rc) fail_msg("backward: %s", rf_errmsg());
}
static float *params(lm *m, size_t *n) {
    *n = m->llama ? m->l->nparams : m->g->nparams;
    return m->llama ? m->l->params : m->g->params;
}

static const char *GPT2 = "tests/fixtures/causal/tiny-gpt2-rand",
                  *LLAMA = "tests/fixtures/causal/tiny-llama-rand";

static rf_lora_config all_targets(bool llama, rf_qtype base) {
    rf_lora_config c = rf_lora_defaults();
    c.rank = 4, c.alpha = 8;
    c.targets = RF_LORA_Q | RF_LORA_K | RF_LORA_V | RF_LORA_O | RF_LORA_UP | RF_LORA_DOWN |
                (llama ? RF_LORA_GATE : 0);
    c.base = base;
    return c;
}

/* B = 0 (peft's initialisation): the logits are the base model's, bitwise. */
static void zero_b(bool llama, const char *dir) {
    lm m = load(llama, dir);
    int V = vocab(&m);
    rf_causal_batch b = batch(V);
    float loss0, loss1, *lg = fwd(&m, &b, &loss0);
    float *ref = malloc(sizeof(float) * 16 * V);
    memcpy(ref, lg, sizeof(float) * 16 * V);
    rf_lora_config c = all_targets(llama, RF_QT_F32);
    rf_lora *lo = lora_new(&m, &c, 1);
    attach(&m, lo);
    lg = fwd(&m, &b, &loss1);
    assert_memory_equal(lg, ref, sizeof(float) * 16 * V);
    assert_true(loss0 == loss1);
    /* A is initialised, B zero: the first backward gives B gradients only */
    bwd(&m);
    double ga = 0, gb = 0;
    for (size_t t = 0; t < lo->ntensors; t++)
        for (size_t i = 0; i < lo->tensors[t].numel; i++)
            *(t % 2 ? &gb : &ga) += fabs(lo->grads[lo->tensors[t].offset + i]);
    printf("  %s: %zu adapter tensors, %zu parameters; B = 0: logits bitwise the base's; "
           "|dA| %g, |dB| %.3g\n",
           llama ? "llama" : "gpt2", lo->ntensors, lo->nparams, ga, gb);
    assert_true(ga == 0 && gb > 0);
    free(ref);
    lm_free(&m);
    rf_lora_free(lo);
}

static void test_zero_b(void **state) {
    (void)state;
    zero_b(false, GPT2);
    zero_b(true, LLAMA);
}

/* The base is frozen: no gradient block, its weights do not move; the loss falls. */
static void frozen(bool llama, const char *dir) {
    lm m = load(llama, dir);
    size_t np;
    float *p = params(&m, &np), *keep = malloc(np * sizeof(float));
    memcpy(keep, p, np * sizeof(float));
    rf_lora_config c = all_targets(llama, RF_QT_F32);
    rf_lora *lo = lora_new(&m, &c, 2);
    attach(&m, lo);
    assert_null(llama ? (void *)m.l->grads : (void *)m.g->grads);
    rf_adamw o = rf_adamw_defaults();
    o.lr = 1e-2f;
    rf_causal_batch b = batch(vocab(&m));
    float first = 0, loss = 0;
    for (long step = 0; step < 5; step++) {
        rf_lora_zero_grad(lo);
        fwd(&m, &b, &loss);
        if (!step) first = loss;
        bwd(&m);
        rf_lora_adamw_step(lo, &o, step);
    }
    fwd(&m, &b, &loss);
    printf("  %s: loss %.4f -> %.4f after 5 adapter steps, base unchanged\n",
           llama ? "llama" : "gpt2", first, loss);
    assert_true(loss < first);
    assert_memory_equal(p, keep, np * sizeof(float));
    free(keep);
    lm_free(&m);
    rf_lora_free(lo);
}

static void test_frozen(void **state) {
    (void)state;
    frozen(false, GPT2);
    frozen(true, LLAMA);
}

/* Random B, so that every adapter gradient is non-zero. */
static void randomize_b(rf_lora *lo) {
    for (size_t t = 1; t < lo->ntensors; t += 2)
        for (size_t i = 0; i < lo->tensors[t].numel; i++)
            lo->params[lo->tensors[t].offset + i] = (float)((rf_rng_double(&rng) * 2 - 1) * 0.3);
}

/* Writes the dequantized base of lo (quantized) into model q's fp32 weights. */
static void put_dequantized(const rf_lora *lo, lm *q) {
    for (int l = 0; l < lo->nlayers; l++)
        for (int s = 0; s < RF_NPROJ; s++) {
            const rf_lora_proj *pj = &lo->proj[l * RF_NPROJ + s];
            float *w;
            if (q->llama) {
                rf_llama_layer *y = &q->l->p.layers[l];
                w = s == RF_PROJ_QKV  ? y->qkv_w
                    : s == RF_PROJ_O  ? y->o_w
                    : s == RF_PROJ_UP ? y->gu_w
                                      : y->down_w;
            } else {
                rf_gpt2_layer *y = &q->g->p.layers[l];
                w = s == RF_PROJ_QKV  ? y->attn_w
                    : s == RF_PROJ_O  ? y->proj_w
                    : s == RF_PROJ_UP ? y->fc_w
                                      : y->fcp_w;
            }
            for (int j = 0; j < pj->nparts; j++) {
                const rf_lora_part *p = &pj->part[j];
                float *d = malloc(sizeof(float) * p->len * pj->in);
                rf_qweight_dequant(&p->q, d);
                for (int r = 0; r < p->len; r++)
                    for (int k = 0; k < pj->in; k++) {
                        if (q->llama)
                            w[(size_t)(p->off + r) * pj->in + k] = d[(size_t)r * pj->in + k];
                        else /* Conv1D [in, out] */
                            w[(size_t)k * pj->out + p->off + r] = d[(size_t)r * pj->in + k];
                    }
                free(d);
            }
        }
}

static void quantized_base(lm *mq, lm *mf, rf_qtype t, const char *what) {
    rf_lora_config cq = all_targets(mq->llama, t), cf = all_targets(mq->llama, RF_QT_F32);
    rf_lora *lq = lora_new(mq, &cq, 3), *lf = lora_new(mf, &cf, 3);
    randomize_b(lq);
    memcpy(lf->params, lq->params, lq->nparams * sizeof(float));
    attach(mq, lq);
    put_dequantized(lq, mf);
    attach(mf, lf);
    /* the quantized model's fp32 copies were released: they read as zero */
    const float *w0 = mq->llama ? mq->l->p.layers[0].gu_w : mq->g->p.layers[0].fc_w;
    for (int i = 0; i < 64; i++)
        assert_true(w0[i] == 0.0f);
    int V = vocab(mq);
    rf_causal_batch b = batch(V);
    float lq_loss, lf_loss, *gq = fwd(mq, &b, &lq_loss), *gf = fwd(mf, &b, &lf_loss);
    double el = rel(gq, gf, (size_t)16 * V);
    bwd(mq), bwd(mf);
    double eg = rel(lq->grads, lf->grads, lq->nparams);
    printf("  %s, %s base (%zu bytes quantized): logits %.2e, loss %.9g vs %.9g, adapter "
           "gradients %.2e against fp32 on the dequantized weights\n",
           mq->llama ? "llama" : "gpt2", what, lq->qbytes, el, lq_loss, lf_loss, eg);
    assert_true(lq->qbytes > 0);
    assert_true(el < 1e-6 && eg < 1e-5);
    rf_lora_free(lq), rf_lora_free(lf);
}

static void test_quantized_bases(void **state) {
    (void)state;
    rf_qtype ts[] = {RF_QT_INT8, RF_QT_NF4};
    const char *names[] = {"int8", "nf4"};
    for (int i = 0; i < 2; i++) {
        lm a = load(false, GPT2), b = load(false, GPT2);
        quantized_base(&a, &b, ts[i], names[i]);
        lm_free(&a), lm_free(&b);
        a = load(true, LLAMA), b = load(true, LLAMA);
        quantized_base(&a, &b, ts[i], names[i]);
        lm_free(&a), lm_free(&b);
    }
    /* Q4_1 rows need a multiple of 32 inputs: a random Llama with intermediate 64 */
    rf_llama_config c = {.vocab_size = 64,
                         .hidden_size = 32,
                         .intermediate_size = 64,
                         .num_hidden_layers = 2,
                         .num_attention_heads = 4,
                         .num_key_value_heads = 2,
                         .head_dim = 8,
                         .max_position_embeddings = 32,
                         .rms_norm_eps = 1e-6f,
                         .rope_theta = 10000};
    lm a = {.llama = true}, b = {.llama = true};
    assert_int_equal(rf_llama_new(&c, &a.l), 0);
    assert_int_equal(rf_llama_new(&c, &b.l), 0);
    float *w = randu(a.l->nparams, 0.3f);
    for (size_t t = 0; t < a.l->ntensors; t++) /* norms near 1 */
        if (a.l->tensors[t].ndim == 1)
            for (size_t i = 0; i < a.l->tensors[t].numel; i++)
                w[a.l->tensors[t].offset + i] += 1.0f;
    memcpy(a.l->params, w, a.l->nparams * sizeof(float));
    memcpy(b.l->params, w, a.l->nparams * sizeof(float));
    quantized_base(&a, &b, RF_QT_Q4_1, "q4_1");
    lm_free(&a), lm_free(&b);
    free(w);
}

/* A whole model with adapters and dropout, 1 and 2 threads: the same bits. */
static void threads(bool llama, const char *dir) {
    float *lg[2], *gr[2];
    size_t V = 0, np = 0;
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        lm m = load(llama, dir);
        rf_lora_config c = all_targets(llama, RF_QT_NF4);
        c.dropout = 0.1f;
        rf_lora *lo = lora_new(&m, &c, 4);
        rf_rng_seed(&rng, 77);
        randomize_b(lo);
        attach(&m, lo);
        lo->train = true, lo->seed = 1234;
        V = (size_t)vocab(&m);
        rf_causal_batch b = batch((int)V);
        float loss, *l = fwd(&m, &b, &loss);
        lg[t] = malloc(sizeof(float) * 16 * V);
        memcpy(lg[t], l, sizeof(float) * 16 * V);
        bwd(&m);
        np = lo->nparams;
        gr[t] = malloc(sizeof(float) * np);
        memcpy(gr[t], lo->grads, sizeof(float) * np);
        lo->train = false; /* eval: no dropout, other logits */
        l = fwd(&m, &b, &loss);
        assert_true(rel(l, lg[t], 16 * V) > 1e-4);
        lm_free(&m);
        rf_lora_free(lo);
    }
    assert_memory_equal(lg[0], lg[1], sizeof(float) * 16 * V);
    assert_memory_equal(gr[0], gr[1], sizeof(float) * np);
    for (int t = 0; t < 2; t++)
        free(lg[t]), free(gr[t]);
}

static void test_threads(void **state) {
    (void)state;
    threads(false, GPT2);
    threads(true, LLAMA);
    omp_set_num_threads(2);
}

static void test_options(void **state) {
    (void)state;
    lm g = load(false, GPT2);
    rf_lora *lo;
    rf_lora_config c = rf_lora_defaults(); /* q and v: GPT-2's c_attn is q, k and v together */
    assert_int_equal(rf_lora_new_gpt2(g.g, &c, 1, &lo), RF_ERR_UNSUPPORTED);
    c.targets = RF_LORA_GATE;
    assert_int_equal(rf_lora_new_gpt2(g.g, &c, 1, &lo), RF_ERR_UNSUPPORTED);
    c.targets = RF_LORA_O, c.base = RF_QT_Q4_1;
    assert_int_equal(rf_lora_new_gpt2(g.g, &c, 1, &lo), RF_ERR_UNSUPPORTED);
    c.base = RF_QT_F32, c.rank = 0;
    assert_int_equal(rf_lora_new_gpt2(g.g, &c, 1, &lo), RF_ERR_INVALID);
    c.rank = 4, c.dropout = 1.0f;
    assert_int_equal(rf_lora_new_gpt2(g.g, &c, 1, &lo), RF_ERR_INVALID);
    c.dropout = 0, c.alpha = -1;
    assert_int_equal(rf_lora_new_gpt2(g.g, &c, 1, &lo), RF_ERR_INVALID);
    c.alpha = 8, c.targets = 0;
    assert_int_equal(rf_lora_new_gpt2(g.g, &c, 1, &lo), RF_ERR_INVALID);
    assert_int_equal(rf_lora_target_bit("gate"), RF_LORA_GATE);
    assert_int_equal(rf_lora_target_bit("qq"), 0);
    assert_int_equal(rf_lora_base_parse("nf4"), RF_QT_NF4);
    assert_int_equal(rf_lora_base_parse("nf8"), -1);
    lm_free(&g);
    lm l = load(true, LLAMA);
    c = rf_lora_defaults();
    c.base = RF_QT_Q4_1;
    assert_int_equal(rf_lora_new_llama(l.l, &c, 1, &lo), RF_OK);
    assert_int_equal(rf_lora_attach_llama(lo, l.l, false), RF_ERR_UNSUPPORTED);
    rf_lora_free(lo);
    lm_free(&l);
}

/* The spec's lora mapping. */
static int parse(const char *yaml, rf_lora_config *c) {
    rf_cfg *root;
    if (rf_cfg_load_string(yaml, strlen(yaml), "spec.yaml", &root)) fail_msg("%s", rf_errmsg());
    int rc = rf_lora_config_parse(rf_cfg_get(root, "lora"), c);
    rf_cfg_free(root);
    return rc;
}

static void test_spec(void **state) {
    (void)state;
    rf_lora_config c;
    assert_int_equal(parse("lora:\n  rank: 16\n  dropout: 0.05\n  targets: [q, v, gate]\n"
                           "  base: nf4\n",
                           &c),
                     RF_OK);
    assert_int_equal(c.rank, 16);
    assert_true(c.alpha == 32.0f); /* default: 2 r */
    assert_true(c.dropout == 0.05f);
    assert_int_equal(c.targets, RF_LORA_Q | RF_LORA_V | RF_LORA_GATE);
    assert_int_equal(c.base, RF_QT_NF4);
    assert_int_equal(parse("lora: {alpha: 8}\n", &c), RF_OK);
    assert_int_equal(c.rank, 8);
    assert_int_equal(c.targets, RF_LORA_Q | RF_LORA_V);
    assert_int_equal(parse("lora: {targets: [q, x]}\n", &c), RF_ERR_INVALID);
    printf("  %s\n", rf_errmsg());
    assert_non_null(strstr(rf_errmsg(), "spec.yaml:1"));
    assert_int_equal(parse("lora: {base: nf8}\n", &c), RF_ERR_INVALID);
    assert_int_equal(parse("lora: {rank: 0}\n", &c), RF_ERR_INVALID);
    assert_int_equal(parse("lora: {dropout: 1}\n", &c), RF_ERR_INVALID);
    assert_int_equal(parse("lora: {ranks: 4}\n", &c), RF_ERR_INVALID);
    printf("  %s\n", rf_errmsg());
    assert_int_equal(parse("lora: {targets: []}\n", &c), RF_ERR_INVALID);
}

/* ---- PEFT files ---- */

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

static void test_peft_roundtrip(void **state) {
    (void)state;
    char dir[] = "/tmp/rf_lora_XXXXXX";
    assert_non_null(mkdtemp(dir));
    lm m = load(true, LLAMA);
    rf_lora_config c = rf_lora_defaults();
    c.targets = RF_LORA_Q | RF_LORA_V | RF_LORA_DOWN | RF_LORA_GATE;
    rf_lora *a = lora_new(&m, &c, 5), *b = lora_new(&m, &c, 6);
    randomize_b(a);
    assert_int_equal(rf_lora_save_peft(a, dir, "tiny-llama-rand"), RF_OK);
    assert_true(rel(a->params, b->params, a->nparams) > 0.1);
    assert_int_equal(rf_lora_load_peft(b, dir), RF_OK);
    assert_memory_equal(a->params, b->params, a->nparams * sizeof(float));
    /* the names are peft's */
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    rf_st_file *st;
    assert_int_equal(rf_st_open(path, &st), 0);
    assert_int_equal(st->n, a->ntensors);
    assert_non_null(rf_st_find(st, "base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight"));
    rf_st_free(st);
    /* another rank or other targets are refused, naming the difference */
    rf_lora_config c2 = c;
    c2.rank = 4;
    rf_lora *d = lora_new(&m, &c2, 7);
    assert_int_equal(rf_lora_load_peft(d, dir), RF_ERR_INVALID);
    printf("  rank 4 over a rank-8 file: %s\n", rf_errmsg());
    rf_lora_free(d);
    c2 = c, c2.targets = RF_LORA_Q | RF_LORA_V;
    d = lora_new(&m, &c2, 7);
    assert_int_equal(rf_lora_load_peft(d, dir), RF_ERR_INVALID);
    rf_lora_free(d);
    d = lora_new(&m, &c, 7); /* other weights, for a damaged file below */
    /* a damaged config, an unknown module, DoRA, a truncated weight file */
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    write_text(path, "{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": \"q_proj|v_proj\"}");
    assert_int_equal(rf_lora_load_peft(b, dir), RF_ERR_UNSUPPORTED);
    write_text(path,
               "{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", \"x_proj\"]}");
    assert_int_equal(rf_lora_load_peft(b, dir), RF_ERR_UNSUPPORTED);
    write_text(path, "{\"r\": 8, \"lora_alpha\": 16, \"use_dora\": true, \"target_modules\": "
                     "[\"q_proj\", \"v_proj\", \"down_proj\", \"gate_proj\"]}");
    assert_int_equal(rf_lora_load_peft(b, dir), RF_ERR_UNSUPPORTED);
    write_text(path, "{\"r\": 8, \"lora_alpha\": ");
    assert_int_equal(rf_lora_load_peft(b, dir), RF_ERR_PARSE);
    write_text(path, "{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", "
                     "\"v_proj\", \"down_proj\", \"gate_proj\"]}");
    assert_int_equal(rf_lora_load_peft(b, dir), RF_OK);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    assert_int_equal(truncate(path, 200), 0);
    assert_true(rf_lora_load_peft(b, dir) < 0);
    printf("  truncated weights: %s\n", rf_errmsg());
    /* a file lacking one adapter tensor: refused, and b's weights unchanged */
    rf_st_out *outs = calloc(a->ntensors, sizeof *outs);
    char(*names)[128] = calloc(a->ntensors, sizeof *names);
    for (size_t i = 0; i < a->ntensors; i++) {
        const rf_tensor_info *t = &a->tensors[i];
        snprintf(names[i], sizeof names[i], "base_model.model.%s", t->name);
        outs[i] = (rf_st_out){names[i], 2, {t->shape[0], t->shape[1]}, d->params + t->offset};
    }
    assert_int_equal(rf_st_write(path, outs, a->ntensors - 1), 0);
    assert_int_equal(rf_lora_load_peft(b, dir), RF_ERR_NOT_FOUND);
    assert_memory_equal(a->params, b->params, a->nparams * sizeof(float));
    free(outs), free(names);
    /* GPT-2 writes fan_in_fan_out and unambiguous module names */
    lm g = load(false, GPT2);
    rf_lora_config cg = all_targets(false, RF_QT_F32);
    cg.targets = RF_LORA_O | RF_LORA_UP;
    rf_lora *e = lora_new(&g, &cg, 8), *f = lora_new(&g, &cg, 9);
    assert_int_equal(rf_lora_save_peft(e, dir, NULL), RF_OK);
    char *text;
    size_t len;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    assert_int_equal(rf_read_file(path, 1 << 16, &text, &len), 0);
    assert_non_null(strstr(text, "\"fan_in_fan_out\": true"));
    assert_non_null(strstr(text, "[\"attn.c_proj\", \"mlp.c_fc\"]"));
    free(text);
    assert_int_equal(rf_lora_load_peft(f, dir), RF_OK);
    assert_memory_equal(e->params, f->params, e->nparams * sizeof(float));
    rf_lora_free(e), rf_lora_free(f);
    lm_free(&g);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    rf_lora_free(a), rf_lora_free(b), rf_lora_free(d);
    lm_free(&m);
}

/* SmolLM2-135M from its Q4_1 GGUF (scripts/fetch-smollm2.sh; skipped when
 * absent): the base kept as the file's Q4_1 blocks gives the logits of the
 * fully dequantized fp32 model, with and without an adapter; the quantized
 * model holds no fp32 copy of the projections. */
static void test_smollm2_q4_1(void **state) {
    (void)state;
    static char path[4096];
    const char *d = getenv("REFINERY_SMOLLM2_DIR"), *root = getenv("REFINERY_ROOT");
    if (d && *d)
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d);
    else
        snprintf(path, sizeof path, "%s/build/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
                 root ? root : ".");
    const char *san = getenv("REFINERY_SANITIZED");
    if (san && strcmp(san, "1") == 0)
        RF_SKIP("two SmolLM2 models are slow under the sanitizers (the case runs in make test)");
    if (access(path, R_OK) != 0)
        RF_SKIP("SmolLM2 not found at %s (run scripts/fetch-smollm2.sh)", path);
    rf_llama *f, *q;
    rf_lora *lq;
    rf_lora_config c = rf_lora_defaults();
    c.base = RF_QT_Q4_1, c.targets = RF_LORA_Q | RF_LORA_DOWN;
    if (rf_lora_load_llama_gguf(path, NULL, 1, &f, NULL) ||
        rf_lora_load_llama_gguf(path, &c, 1, &q, &lq))
        fail_msg("%s", rf_errmsg());
    int32_t tok[8] = {504, 3458, 282, 4119, 314, 260, 1345, 30};
    rf_causal_batch b = {.B = 1, .T = 8, .ids = tok, .labels = tok};
    int V = f->cfg.vocab_size;
    assert_int_equal(rf_llama_forward(f, &b), 0);
    float *ref = malloc(sizeof(float) * 8 * V);
    memcpy(ref, f->logits, sizeof(float) * 8 * V);
    assert_int_equal(rf_llama_forward(q, &b), 0);
    double e0 = rel(q->logits, ref, (size_t)8 * V);
    /* with a non-zero adapter: the same adapter on the fp32 model */
    rf_lora *lf;
    rf_lora_config cf = c;
    cf.base = RF_QT_F32;
    assert_int_equal(rf_lora_new_llama(f, &cf, 1, &lf), 0);
    randomize_b(lq);
    memcpy(lf->params, lq->params, sizeof(float) * lq->nparams);
    assert_int_equal(rf_lora_attach_llama(lf, f, false), 0);
    assert_int_equal(rf_llama_forward(f, &b), 0);
    assert_int_equal(rf_llama_forward(q, &b), 0);
    double e1 = rel(q->logits, f->logits, (size_t)8 * V),
           moved = rel(f->logits, ref, (size_t)8 * V);
    printf("  SmolLM2 q4_1 base (%.1f MB of blocks) vs fp32: logits %.2e, with an adapter %.2e "
           "(the adapter moved them by %.3g); loss %.4f\n",
           lq->qbytes / 1048576.0, e0, e1, moved, q->loss);
    assert_true(e0 < 1e-5 && e1 < 1e-5 && moved > 1e-3);
    assert_true(q->params[rf_llama_find(q, "model.layers.3.mlp.up_proj.weight")->offset + 7] == 0);
    free(ref);
    rf_lora_free(lq), rf_lora_free(lf);
    rf_llama_free(f), rf_llama_free(q);
}

int main(void) {
    rf_rng_seed(&rng, 4242);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_gradients),
        cmocka_unit_test(test_op_threads),
        cmocka_unit_test(test_zero_b),
        cmocka_unit_test(test_frozen),
        cmocka_unit_test(test_quantized_bases),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_peft_roundtrip),
        cmocka_unit_test(test_spec),
        cmocka_unit_test(test_smollm2_q4_1),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
