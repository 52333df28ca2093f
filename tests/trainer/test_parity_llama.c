/* Parity of llama.c with PyTorch's LlamaForCausalLM (fixtures from
 * scripts/parity/causal_fixtures.py, eager attention, no dropout) on a random
 * Llama committed in tests/fixtures/causal/ (hidden 32, 2 layers, 4 query
 * heads over 2 key/value heads, head size 8, SwiGLU width 48, RMSNorm, RoPE
 * theta 10000, untied head, vocab 64) and a batch with right padding and -100
 * labels: logits and loss within relative error 1e-5, every parameter's
 * gradient within 1e-4 (norm-wise, ||c - ref|| / ||ref||), every weight after
 * 3 AdamW steps within 1e-5. A second fixture has a tied head, 6 query heads
 * over 2 key/value heads of size 6 and rope theta 1e5. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/error.h"
#include "parity_causal.h"
#include "trainer/llama.h"

static void run_parity(const char *model_dir, const char *ref_file) {
    rf_llama *m;
    if (rf_llama_load(model_dir, &m)) fail_msg("load %s: %s", model_dir, rf_errmsg());
    rf_st_file *ref;
    if (rf_st_open(ref_file, &ref)) fail_msg("%s", rf_errmsg());
    size_t n;
    int32_t *ids = fx_ints(ref, "in.ids", &n), *mask = fx_ints(ref, "in.mask", NULL),
            *labels = fx_ints(ref, "in.labels", NULL);
    int B = 3, T = (int)(n / 3);
    uint8_t *valid = malloc(n);
    for (size_t i = 0; i < n; i++)
        valid[i] = (uint8_t)mask[i];
    assert_int_equal(rf_llama_enable_training(m), 0);
    assert_int_equal(rf_llama_zero_grad(m), 0);
    assert_int_equal(
        rf_llama_forward(
            m, &(rf_causal_batch){.B = B, .T = T, .ids = ids, .valid = valid, .labels = labels}),
        0);
    assert_int_equal(rf_llama_backward(m, 1.0f), 0);

    float *loss = fx_get(ref, "out.loss", NULL);
    double el = compare(ref, "out.logits", m->logits, n * m->cfg.vocab_size),
           eloss = fabs(m->loss - loss[0]) / fabs(loss[0]);
    printf("%s\n  logits rel err %.3g, loss rel err %.3g (loss %.7f vs %.7f, %d tokens)\n",
           model_dir, el, eloss, m->loss, loss[0], m->counted);
    assert_true(el <= LOGIT_TOL);
    assert_true(eloss <= LOGIT_TOL);
    double worst = 0;
    const char *worst_name = "";
    for (size_t t = 0; t < m->ntensors; t++) {
        char name[128];
        snprintf(name, sizeof name, "grad.%s", m->tensors[t].name);
        double e = compare(ref, name, m->grads + m->tensors[t].offset, m->tensors[t].numel);
        if (e > GRAD_TOL) printf("  %s: rel err %.3g\n", name, e);
        if (e > worst) worst = e, worst_name = m->tensors[t].name;
    }
    printf("  worst gradient rel err %.3g (%s), %zu tensors\n", worst, worst_name, m->ntensors);
    assert_true(worst <= GRAD_TOL);

    /* backward accumulates: a second backward of the same forward doubles */
    float g0 = m->grads[m->tensors[2].offset];
    assert_int_equal(rf_llama_backward(m, 1.0f), 0);
    assert_float_equal(m->grads[m->tensors[2].offset], 2 * g0, 1e-6 * fabs(g0) + 1e-12);

    /* 3 AdamW steps on the same batch, when the fixture has them */
    char key[160], skey[170];
    snprintf(key, sizeof key, "after.3.%s", m->tensors[0].name);
    snprintf(skey, sizeof skey, "samp.%s", key);
    if (rf_st_find(ref, key) || rf_st_find(ref, skey)) {
        rf_adamw o = causal_fixture_adamw();
        float *m1 = calloc(m->nparams, sizeof(float)), *m2 = calloc(m->nparams, sizeof(float));
        for (long step = 0; step < 3; step++) {
            assert_int_equal(rf_llama_zero_grad(m), 0);
            assert_int_equal(
                rf_llama_forward(m,
                                 &(rf_causal_batch){
                                     .B = B, .T = T, .ids = ids, .valid = valid, .labels = labels}),
                0);
            assert_int_equal(rf_llama_backward(m, 1.0f), 0);
            adamw_step_flat(m->params, m->grads, m1, m2, m->nparams, m->tensors, m->ntensors, &o,
                            step);
        }
        double worst_w = 0;
        const char *wn = "";
        size_t left_out = 0;
        for (size_t t = 0; t < m->ntensors; t++) {
            char name[160];
            char gname[160];
            snprintf(name, sizeof name, "after.3.%s", m->tensors[t].name);
            snprintf(gname, sizeof gname, "grad.%s", m->tensors[t].name);
            double e = weight_err(ref, name, gname, m->params + m->tensors[t].offset,
                                  m->tensors[t].numel, &left_out);
            if (e > WEIGHT_TOL) printf("  %s: rel err %.3g\n", name, e);
            if (e > worst_w) worst_w = e, wn = m->tensors[t].name;
        }
        printf("  after 3 AdamW steps: worst weight rel err %.3g (%s), %zu elements with a "
               "step-0 gradient below 1e-7 left out\n",
               worst_w, wn, left_out);
        assert_true(worst_w <= WEIGHT_TOL);
        free(m1), free(m2);
    }

    free(ids), free(mask), free(labels), free(valid), free(loss);
    rf_st_free(ref);
    rf_llama_free(m);
}

static void test_random_llama(void **state) {
    (void)state;
    char *dir = root_path("tests/fixtures/causal/tiny-llama-rand"),
         *ref = root_path("tests/fixtures/causal/llama_rand_ref.safetensors");
    run_parity(dir, ref);
    free(dir), free(ref);
}

/* Tied head, 6 query heads over 2 kv heads of size 6, rope theta 1e5: the
 * shape of SmolLM2 in miniature. */
static void test_tied_llama(void **state) {
    (void)state;
    char *dir = root_path("tests/fixtures/causal/tiny-llama-tied"),
         *ref = root_path("tests/fixtures/causal/llama_tied_ref.safetensors");
    run_parity(dir, ref);
    free(dir), free(ref);
}

/* Packing: two documents in one row (positions restarting, seg numbering
 * them, the second's first label -100) give the logits of each document run
 * alone, and the summed-loss gradients of the two separate runs. */
static void test_packed(void **state) {
    (void)state;
    char *dir = root_path("tests/fixtures/causal/tiny-llama-tied");
    rf_llama *m;
    if (rf_llama_load(dir, &m)) fail_msg("%s", rf_errmsg());
    assert_int_equal(rf_llama_enable_training(m), 0);
    int V = m->cfg.vocab_size, TA = 5, TB = 3, T = TA + TB;
    int32_t ids[8], pos[8], seg[8], labels[8];
    for (int n = 0; n < T; n++) {
        ids[n] = (int32_t)((n * 29 + 5) % V);
        pos[n] = n < TA ? n : n - TA;
        seg[n] = n >= TA;
        labels[n] = n == TA ? -100 : ids[n];
    }
    assert_int_equal(
        rf_llama_forward(m,
                         &(rf_causal_batch){
                             .B = 1, .T = T, .ids = ids, .labels = labels, .pos = pos, .seg = seg}),
        0);
    int cp = m->counted;
    assert_int_equal(cp, (TA - 1) + (TB - 1));
    float *lp = malloc(sizeof(float) * T * V), *g = calloc(m->nparams, sizeof(float));
    memcpy(lp, m->logits, sizeof(float) * T * V);
    assert_int_equal(rf_llama_zero_grad(m), 0);
    assert_int_equal(rf_llama_backward(m, (float)cp), 0);
    memcpy(g, m->grads, sizeof(float) * m->nparams);

    assert_int_equal(rf_llama_zero_grad(m), 0);
    assert_int_equal(
        rf_llama_forward(m, &(rf_causal_batch){.B = 1, .T = TA, .ids = ids, .labels = labels}), 0);
    double ea = rel_err(lp, m->logits, (size_t)TA * V);
    assert_int_equal(rf_llama_backward(m, (float)m->counted), 0);
    assert_int_equal(
        rf_llama_forward(
            m, &(rf_causal_batch){.B = 1, .T = TB, .ids = ids + TA, .labels = labels + TA}),
        0);
    double eb = rel_err(lp + TA * V, m->logits, (size_t)TB * V);
    assert_int_equal(rf_llama_backward(m, (float)m->counted), 0);
    double eg = rel_err(g, m->grads, m->nparams);
    printf("  packed vs separate: logits %.3g / %.3g, gradients %.3g\n", ea, eb, eg);
    assert_true(ea <= 1e-6 && eb <= 1e-6);
    assert_true(eg <= 1e-5);
    free(lp), free(g), free(dir);
    rf_llama_free(m);
}

/* Errors are reported, not crashed on. */
static void test_errors(void **state) {
    (void)state;
    rf_llama_config c;
    const char *gqa = "{\"vocab_size\":8,\"hidden_size\":8,\"intermediate_size\":4,"
                      "\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                      "\"num_key_value_heads\":3}";
    assert_int_equal(rf_llama_config_parse(gqa, strlen(gqa), &c), RF_ERR_INVALID);
    const char *scaled = "{\"vocab_size\":8,\"hidden_size\":8,\"intermediate_size\":4,"
                         "\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                         "\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":5e5}}";
    assert_int_equal(rf_llama_config_parse(scaled, strlen(scaled), &c), RF_ERR_UNSUPPORTED);
    const char *old = "{\"vocab_size\":8,\"hidden_size\":8,\"intermediate_size\":4,"
                      "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"rope_theta\":500000.0,"
                      "\"tie_word_embeddings\":true}";
    assert_int_equal(rf_llama_config_parse(old, strlen(old), &c), RF_OK);
    assert_int_equal(c.num_key_value_heads, 2);
    assert_int_equal(c.head_dim, 4);
    assert_float_equal(c.rope_theta, 500000.0f, 0);
    assert_true(c.tie_word_embeddings);
    rf_llama *m;
    assert_int_equal(rf_llama_new(&c, &m), RF_OK);
    assert_null(rf_llama_find(m, "lm_head.weight")); /* tied: no tensor of its own */
    assert_ptr_equal(m->p.head_w, m->p.wte);
    int32_t ids[] = {1, 2, 8, 0};
    assert_int_equal(
        rf_llama_forward(
            m, &(rf_causal_batch){.B = 1, .T = 4, .ids = ids, .valid = NULL, .labels = NULL}),
        RF_ERR_RANGE);
    ids[2] = 3;
    assert_int_equal(
        rf_llama_forward(
            m, &(rf_causal_batch){.B = 1, .T = 4, .ids = ids, .valid = NULL, .labels = NULL}),
        RF_OK);
    assert_int_equal(rf_llama_backward(m, 1.0f), RF_ERR_INVALID);
    rf_llama_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_llama),
        cmocka_unit_test(test_tied_llama),
        cmocka_unit_test(test_packed),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
