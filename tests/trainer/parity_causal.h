/* Helpers of the causal-LM parity tests (header-only, each test is its own
 * binary): fixture paths, comparison with whole or sampled reference tensors,
 * and the AdamW steps of scripts/parity/causal_fixtures.py on a flat block. */
#ifndef RF_TEST_PARITY_CAUSAL_H
#define RF_TEST_PARITY_CAUSAL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parity_util.h"
#include "trainer/backend.h"
#include "trainer/model.h"
#include "trainer/model_iface.h"
#include "trainer/ops.h"
#include "trainer/optim.h"

#define LOGIT_TOL  1e-5
#define GRAD_TOL   1e-4
#define WEIGHT_TOL 1e-5

static inline char *root_path(const char *rel) {
    const char *root = getenv("REFINERY_ROOT");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/%s", root ? root : ".", rel);
    return p;
}

/* Relative error of x[n] against the fixture's `name`: whole, or (fixtures
 * of large tensors) the worst of its sum (against the norm: a sum may cancel),
 * its sum of squares and 1000 elements at flat indices i * n / 1000. */
static inline double compare(const rf_st_file *ref, const char *name, const float *x, size_t n) {
    if (rf_st_find(ref, name)) {
        size_t k;
        float *r = fx_get(ref, name, &k);
        assert_int_equal(k, n);
        double e = rel_err(x, r, n);
        free(r);
        return e;
    }
    char key[256];
    snprintf(key, sizeof key, "samp.%s", name);
    size_t ns;
    float *samp = fx_get(ref, key, &ns), *mine = malloc(ns * sizeof(float));
    for (size_t i = 0; i < ns; i++)
        mine[i] = x[i * n / ns];
    double e = rel_err(mine, samp, ns);
    double s = 0, ss = 0;
    for (size_t i = 0; i < n; i++)
        s += x[i], ss += (double)x[i] * x[i];
    snprintf(key, sizeof key, "sum.%s", name);
    float *rs = fx_get(ref, key, NULL);
    snprintf(key, sizeof key, "sumsq.%s", name);
    float *rss = fx_get(ref, key, NULL);
    double es = fabs(s - rs[0]) / fmax(sqrt(rss[0]), 1e-6), ess = fabs(ss - rss[0]) / rss[0];
    e = fmax(e, fmax(es, ess));
    free(samp), free(mine), free(rs), free(rss);
    return e;
}

/* Relative error of the weights w[n] after the AdamW steps against the
 * fixture's `name` ("after.3.<tensor>"), leaving out the elements whose
 * step-0 gradient `gname` is non-zero but below 1e-7 in magnitude: there
 * m / (sqrt(v) + eps) sits near Adam's eps and the gradient's own round-off
 * (relative to the tensor's largest entries) decides the step's size, as in
 * the BERT parity test. *left_out counts them. Tensors the fixture holds
 * sampled are compared whole (compare()). */
static inline double weight_err(const rf_st_file *ref, const char *name, const char *gname,
                                const float *w, size_t n, size_t *left_out) {
    if (!rf_st_find(ref, name) || !rf_st_find(ref, gname)) return compare(ref, name, w, n);
    size_t k;
    float *r = fx_get(ref, name, &k), *g = fx_get(ref, gname, NULL);
    assert_int_equal(k, n);
    double d = 0, rr = 0;
    for (size_t i = 0; i < n; i++) {
        if (g[i] != 0 && fabsf(g[i]) < 1e-7f) {
            ++*left_out;
            continue;
        }
        d += ((double)w[i] - r[i]) * ((double)w[i] - r[i]);
        rr += (double)r[i] * r[i];
    }
    free(r), free(g);
    return sqrt(d) / fmax(sqrt(rr), 1e-6);
}

/* The fixture's optimizer: lr 1e-3, warmup 1 step, linear decay to step 4,
 * global clipping at 1.0 (torch's formula), weight decay 0.01 on the tensors
 * flagged `decay`, betas (0.9, 0.999), eps 1e-8. */
static inline rf_adamw causal_fixture_adamw(void) {
    rf_adamw o = rf_adamw_defaults();
    o.lr = 1e-3f;
    o.weight_decay = 0.01f;
    o.warmup_steps = 1;
    o.total_steps = 4;
    o.clip_norm = 1.0f;
    return o;
}

/* One optimizer step on the flat blocks with the CPU kernels. */
static inline void adamw_step_flat(float *params, float *grads, float *m1, float *m2, size_t n,
                                   const rf_tensor_info *t, size_t nt, const rf_adamw *o,
                                   long step) {
    float norm = (float)sqrt(rf_op_sumsq(grads, n));
    float coef = o->clip_norm / (norm + 1e-6f);
    if (coef < 1.0f) rf_op_scale(grads, n, coef);
    rf_param_span *spans = malloc(nt * sizeof *spans);
    for (size_t i = 0; i < nt; i++)
        spans[i] = (rf_param_span){t[i].offset, t[i].numel, t[i].decay};
    rf_adamw_hp hp = {rf_adamw_lr(o, step), o->beta1, o->beta2, o->eps,
                      o->weight_decay,      step,     NULL,     0};
    rf_op_adamw(params, grads, m1, m2, 0, n, spans, nt, &hp);
    free(spans);
}

/* One causal LM (GPT-2 or Llama, on the CPU through the model interface)
 * against its PyTorch fixture ref_file (scripts/parity/causal_fixtures.py):
 * logits and loss within LOGIT_TOL, every gradient within GRAD_TOL, a second
 * backward doubling the gradients (backward accumulates), and, when the
 * fixture has them, the weights after 3 AdamW steps on the same batch within
 * WEIGHT_TOL. GPT-2's fused q|k|v bias (attn.c_attn.bias) is compared on its
 * query and value parts: the key bias's gradient is exactly zero (softmax
 * ignores a shift shared by all keys), so both sides hold round-off noise
 * that AdamW scales up to lr-sized steps; its error is printed only. */
static inline void causal_parity_run(const char *model_dir, const char *ref_file) {
    rf_model *mo;
    if (rf_model_load(model_dir, NULL, rf_backend_cpu(), &mo))
        fail_msg("load %s: %s", model_dir, rf_errmsg());
    rf_st_file *ref;
    if (rf_st_open(ref_file, &ref)) fail_msg("%s", rf_errmsg());
    fx_batch fb = fx_causal_batch(ref, 3);
    size_t n = fb.n;
    rf_model_batch b = {
        .B = fb.B, .T = fb.T, .ids = fb.ids, .valid = fb.valid, .labels = fb.labels};
    rf_model_info info = rf_model_info_of(mo);
    rf_model_blocks m;
    assert_int_equal(rf_model_blocks_of(mo, &m), 0);
    assert_int_equal(rf_model_enable_training(mo, m.nparams, m.nparams), 0);
    assert_int_equal(rf_model_blocks_of(mo, &m), 0);
    assert_int_equal(rf_model_zero_grad(mo), 0);
    assert_int_equal(rf_model_forward(mo, &b, true, 0), 0);
    assert_int_equal(rf_model_backward(mo, 1.0f), 0);

    const float *logits;
    size_t row;
    float mloss;
    long counted;
    assert_int_equal(rf_model_logits(mo, &logits, &row), 0);
    assert_int_equal(row, (size_t)info.vocab);
    assert_int_equal(rf_model_loss(mo, &mloss, &counted), 0);
    float *loss = fx_get(ref, "out.loss", NULL);
    double el = compare(ref, "out.logits", logits, n * row),
           eloss = fabs(mloss - loss[0]) / fabs(loss[0]);
    printf("%s\n  logits rel err %.3g, loss rel err %.3g (loss %.7f vs %.7f, %ld tokens)\n",
           model_dir, el, eloss, mloss, loss[0], counted);
    assert_true(el <= LOGIT_TOL);
    assert_true(eloss <= LOGIT_TOL);
    double worst = 0;
    const char *worst_name = "";
    for (size_t t = 0; t < m.ntensors; t++) {
        char name[128];
        snprintf(name, sizeof name, "grad.%s", m.tensors[t].name);
        double e = compare(ref, name, m.grads + m.tensors[t].offset, m.tensors[t].numel);
        if (e > GRAD_TOL) printf("  %s: rel err %.3g\n", name, e);
        if (e > worst) worst = e, worst_name = m.tensors[t].name;
    }
    printf("  worst gradient rel err %.3g (%s), %zu tensors\n", worst, worst_name, m.ntensors);
    assert_true(worst <= GRAD_TOL);

    /* backward accumulates: a second backward of the same forward doubles */
    float g0 = m.grads[m.tensors[2].offset];
    assert_int_equal(rf_model_backward(mo, 1.0f), 0);
    assert_float_equal(m.grads[m.tensors[2].offset], 2 * g0, 1e-6 * fabs(g0) + 1e-12);

    /* 3 AdamW steps on the same batch, when the fixture has them */
    char key[160], skey[170];
    snprintf(key, sizeof key, "after.3.%s", m.tensors[0].name);
    snprintf(skey, sizeof skey, "samp.%s", key);
    if (rf_st_find(ref, key) || rf_st_find(ref, skey)) {
        rf_adamw o = causal_fixture_adamw();
        float *m1 = calloc(m.nparams, sizeof(float)), *m2 = calloc(m.nparams, sizeof(float));
        for (long step = 0; step < 3; step++) {
            assert_int_equal(rf_model_zero_grad(mo), 0);
            assert_int_equal(rf_model_forward(mo, &b, true, 0), 0);
            assert_int_equal(rf_model_backward(mo, 1.0f), 0);
            adamw_step_flat(m.params, m.grads, m1, m2, m.nparams, m.tensors, m.ntensors, &o, step);
        }
        double worst_w = 0;
        const char *wn = "";
        size_t left_out = 0;
        for (size_t t = 0; t < m.ntensors; t++) {
            char name[160];
            char gname[160];
            snprintf(name, sizeof name, "after.3.%s", m.tensors[t].name);
            snprintf(gname, sizeof gname, "grad.%s", m.tensors[t].name);
            const float *w = m.params + m.tensors[t].offset;
            double e;
            if (strstr(name, "attn.c_attn.bias")) {
                int C = info.hidden;
                float *r = fx_get(ref, name, NULL), qv[2][64 * 2];
                assert_true(C <= 64);
                memcpy(qv[0], w, C * sizeof(float));
                memcpy(qv[0] + C, w + 2 * C, C * sizeof(float));
                memcpy(qv[1], r, C * sizeof(float));
                memcpy(qv[1] + C, r + 2 * C, C * sizeof(float));
                e = rel_err(qv[0], qv[1], 2 * (size_t)C);
                printf("  %s: key part (left out) rel err %.3g, query+value %.3g\n", name,
                       rel_err(w + C, r + C, C), e);
                free(r);
            } else {
                e = weight_err(ref, name, gname, w, m.tensors[t].numel, &left_out);
            }
            if (e > WEIGHT_TOL) printf("  %s: rel err %.3g\n", name, e);
            if (e > worst_w) worst_w = e, wn = m.tensors[t].name;
        }
        printf("  after 3 AdamW steps: worst weight rel err %.3g (%s), %zu elements with a "
               "step-0 gradient below 1e-7 left out\n",
               worst_w, wn, left_out);
        assert_true(worst_w <= WEIGHT_TOL);
        free(m1), free(m2);
    }

    fx_batch_free(&fb), free(loss);
    rf_st_free(ref);
    rf_model_free(mo);
}

#endif
