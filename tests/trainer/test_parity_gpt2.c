/* Parity of gpt2.c with PyTorch's GPT2LMHeadModel (fixtures from
 * scripts/parity/causal_fixtures.py, eager attention, no dropout) on a batch
 * with right padding and -100 labels: logits and loss within relative error
 * 1e-5, every parameter's gradient within 1e-4 (norm-wise, ||c - ref|| /
 * ||ref||). Two models: a random GPT-2 (hidden 32, 2 layers, 4 heads, vocab
 * 64) committed in tests/fixtures/causal/, and ../shared/models/tiny-gpt2
 * (hidden 2, vocab 50257; skipped when ../shared is absent), whose large
 * tensors (logits, wte) the fixture holds as sum, sum of squares and 1000
 * strided elements. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <omp.h>

#include "common/error.h"
#include "parity_causal.h"
#include "trainer/gpt2.h"

static void test_random_gpt2(void **state) {
    (void)state;
    char *dir = root_path("tests/fixtures/causal/tiny-gpt2-rand"),
         *ref = root_path("tests/fixtures/causal/gpt2_rand_ref.safetensors");
    causal_parity_run(dir, ref);
    free(dir), free(ref);
}

static void test_shared_tiny_gpt2(void **state) {
    (void)state;
    char *dir = root_path("../shared/models/tiny-gpt2"),
         *ref = root_path("tests/fixtures/causal/gpt2_shared_ref.safetensors");
    struct stat st;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/model.safetensors", dir);
    if (stat(probe, &st) != 0) {
        printf("skipped: %s not found\n", probe);
        free(dir), free(ref);
        skip();
    }
    causal_parity_run(dir, ref);
    free(dir), free(ref);
}

/* The whole model gives the same bits with 1 and 2 threads (a batch of
 * 8 x 32 with padding: past the ops' serial thresholds and one product piece). */
static void test_thread_count(void **state) {
    (void)state;
    char *dir = root_path("tests/fixtures/causal/tiny-gpt2-rand");
    int B = 8, T = 32, N = B * T;
    int32_t *ids = malloc(sizeof(int32_t) * N), *labels = malloc(sizeof(int32_t) * N);
    uint8_t *valid = malloc(N);
    for (int n = 0; n < N; n++) {
        ids[n] = (int32_t)((n * 37 + 11) % 64);
        valid[n] = n % T < T - (n / T) * 3;
        labels[n] = valid[n] ? ids[n] : -100;
    }
    float *grads[2], *logits[2], loss[2];
    size_t np = 0;
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        rf_gpt2 *m;
        if (rf_gpt2_load(dir, &m)) fail_msg("%s", rf_errmsg());
        assert_int_equal(rf_gpt2_enable_training(m), 0);
        assert_int_equal(
            rf_gpt2_forward(
                m,
                &(rf_causal_batch){.B = B, .T = T, .ids = ids, .valid = valid, .labels = labels}),
            0);
        assert_int_equal(rf_gpt2_backward(m, 1.0f), 0);
        np = m->nparams;
        grads[t] = malloc(np * sizeof(float));
        memcpy(grads[t], m->grads, np * sizeof(float));
        logits[t] = malloc(sizeof(float) * N * 64);
        memcpy(logits[t], m->logits, sizeof(float) * N * 64);
        loss[t] = m->loss;
        rf_gpt2_free(m);
    }
    omp_set_num_threads(2);
    assert_memory_equal(logits[0], logits[1], sizeof(float) * N * 64);
    assert_memory_equal(&loss[0], &loss[1], sizeof(float));
    assert_memory_equal(grads[0], grads[1], np * sizeof(float));
    assert_true(norm(grads[0], np) > 0);
    for (int t = 0; t < 2; t++)
        free(grads[t]), free(logits[t]);
    free(ids), free(labels), free(valid), free(dir);
}

/* Packing: two documents in one row (positions restarting, seg numbering
 * them, the second's first label -100) give the logits of each document run
 * alone, and the summed-loss gradients of the two separate runs. */
static void test_packed(void **state) {
    (void)state;
    char *dir = root_path("tests/fixtures/causal/tiny-gpt2-rand");
    rf_gpt2 *m;
    if (rf_gpt2_load(dir, &m)) fail_msg("%s", rf_errmsg());
    assert_int_equal(rf_gpt2_enable_training(m), 0);
    int V = m->cfg.vocab_size, TA = 5, TB = 3, T = TA + TB;
    int32_t ids[8], pos[8], seg[8], labels[8];
    for (int n = 0; n < T; n++) {
        ids[n] = (int32_t)((n * 29 + 5) % V);
        pos[n] = n < TA ? n : n - TA;
        seg[n] = n >= TA;
        labels[n] = n == TA ? -100 : ids[n];
    }
    assert_int_equal(
        rf_gpt2_forward(m,
                        &(rf_causal_batch){
                            .B = 1, .T = T, .ids = ids, .labels = labels, .pos = pos, .seg = seg}),
        0);
    int cp = m->counted;
    assert_int_equal(cp, (TA - 1) + (TB - 1));
    float *lp = malloc(sizeof(float) * T * V), *g = calloc(m->nparams, sizeof(float));
    memcpy(lp, m->logits, sizeof(float) * T * V);
    assert_int_equal(rf_gpt2_zero_grad(m), 0);
    assert_int_equal(rf_gpt2_backward(m, (float)cp), 0);
    memcpy(g, m->grads, sizeof(float) * m->nparams);

    assert_int_equal(rf_gpt2_zero_grad(m), 0);
    assert_int_equal(
        rf_gpt2_forward(m, &(rf_causal_batch){.B = 1, .T = TA, .ids = ids, .labels = labels}), 0);
    double ea = rel_err(lp, m->logits, (size_t)TA * V);
    assert_int_equal(rf_gpt2_backward(m, (float)m->counted), 0);
    assert_int_equal(
        rf_gpt2_forward(
            m, &(rf_causal_batch){.B = 1, .T = TB, .ids = ids + TA, .labels = labels + TA}),
        0);
    double eb = rel_err(lp + TA * V, m->logits, (size_t)TB * V);
    assert_int_equal(rf_gpt2_backward(m, (float)m->counted), 0);
    double eg = rel_err(g, m->grads, m->nparams);
    printf("  packed vs separate: logits %.3g / %.3g, gradients %.3g\n", ea, eb, eg);
    assert_true(ea <= 1e-6 && eb <= 1e-6);
    assert_true(eg <= 1e-5);
    free(lp), free(g), free(dir);
    rf_gpt2_free(m);
}

/* Errors are reported, not crashed on. */
static void test_errors(void **state) {
    (void)state;
    rf_gpt2_config c;
    const char *bad = "{\"model_type\":\"gpt2\",\"vocab_size\":8,\"n_positions\":4,\"n_embd\":6,"
                      "\"n_layer\":1,\"n_head\":4}";
    assert_int_equal(rf_gpt2_config_parse(bad, strlen(bad), &c), RF_ERR_INVALID);
    const char *relu = "{\"vocab_size\":8,\"n_positions\":4,\"n_embd\":8,\"n_layer\":1,"
                       "\"n_head\":2,\"activation_function\":\"relu\"}";
    assert_int_equal(rf_gpt2_config_parse(relu, strlen(relu), &c), RF_ERR_UNSUPPORTED);
    const char *ok = "{\"vocab_size\":8,\"n_positions\":4,\"n_embd\":8,\"n_layer\":1,"
                     "\"n_head\":2}";
    assert_int_equal(rf_gpt2_config_parse(ok, strlen(ok), &c), RF_OK);
    assert_int_equal(c.n_inner, 32);
    rf_gpt2 *m;
    assert_int_equal(rf_gpt2_new(&c, &m), RF_OK);
    int32_t ids[] = {1, 2, 8, 0};
    assert_int_equal(
        rf_gpt2_forward(
            m, &(rf_causal_batch){.B = 1, .T = 4, .ids = ids, .valid = NULL, .labels = NULL}),
        RF_ERR_RANGE); /* id 8 */
    ids[2] = 3;
    assert_int_equal(
        rf_gpt2_forward(
            m, &(rf_causal_batch){.B = 1, .T = 5, .ids = ids, .valid = NULL, .labels = NULL}),
        RF_ERR_RANGE); /* 5 > 4 positions */
    int32_t labels[] = {1, 2, 3, 8};
    assert_int_equal(
        rf_gpt2_forward(
            m, &(rf_causal_batch){.B = 1, .T = 4, .ids = ids, .valid = NULL, .labels = labels}),
        RF_ERR_RANGE); /* label 8 */
    assert_int_equal(
        rf_gpt2_forward(
            m, &(rf_causal_batch){.B = 1, .T = 4, .ids = ids, .valid = NULL, .labels = NULL}),
        RF_OK);
    assert_int_equal(rf_gpt2_backward(m, 1.0f), RF_ERR_INVALID); /* training not enabled */
    rf_gpt2_free(m);
    assert_int_equal(rf_gpt2_load("/nonexistent-dir", &m), RF_ERR_NOT_FOUND);
    assert_null(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_gpt2),  cmocka_unit_test(test_shared_tiny_gpt2),
        cmocka_unit_test(test_thread_count), cmocka_unit_test(test_packed),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
