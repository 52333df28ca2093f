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

static void test_random_llama(void **state) {
    (void)state;
    char *dir = root_path("tests/fixtures/causal/tiny-llama-rand"),
         *ref = root_path("tests/fixtures/causal/llama_rand_ref.safetensors");
    causal_parity_run(dir, ref);
    free(dir), free(ref);
}

/* Tied head, 6 query heads over 2 kv heads of size 6, rope theta 1e5: the
 * shape of SmolLM2 in miniature. */
static void test_tied_llama(void **state) {
    (void)state;
    char *dir = root_path("tests/fixtures/causal/tiny-llama-tied"),
         *ref = root_path("tests/fixtures/causal/llama_tied_ref.safetensors");
    causal_parity_run(dir, ref);
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
