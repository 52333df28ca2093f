/* The incremental forward with a key/value cache (trainer/causal_infer.h)
 * against the full forward (rf_gpt2_forward / rf_llama_forward): the logits
 * at every position agree within 1e-5 (norm-wise relative error of each
 * position's logits) whether the sequence is fed at once, in chunks, or a
 * token at a time after a prefix, on the random GPT-2 and Llama fixtures
 * (tests/fixtures/causal), ../shared/models/tiny-gpt2 and SmolLM2-135M (the
 * GGUF of scripts/fetch-smollm2.sh; skipped without it and under ASan, where
 * smollm2_gguf.test.sh does not run it either). Out-of-range tokens and
 * positions are refused without touching the cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../support/skip.h"
#include "common/error.h"
#include "common/rng.h"
#include "trainer/causal_infer.h"
#include "trainer/llama_gguf.h"

#define TOL 1e-5

static char *path_of(const char *rel) {
    const char *root = getenv("REFINERY_ROOT");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/%s", root ? root : ".", rel);
    return p;
}

/* The full forward's logits [T, V] of ids. */
static float *full_logits(rf_causal_model *m, const int32_t *ids, int T, int V) {
    rf_causal_batch b = {.B = 1, .T = T, .ids = ids};
    int rc = m->gpt2 ? rf_gpt2_forward(m->gpt2, &b) : rf_llama_forward(m->llama, &b);
    if (rc) fail_msg("forward: %s", rf_errmsg());
    float *out = malloc((size_t)T * V * sizeof(float));
    memcpy(out, m->gpt2 ? m->gpt2->logits : m->llama->logits, (size_t)T * V * sizeof(float));
    return out;
}

/* Feeds ids in pieces of `step` tokens after a first piece of `first`, and
 * returns the worst per-position relative error against ref. */
static double incremental(rf_causal_model *m, const int32_t *ids, int T, int chunk, int first,
                          int step, const float *ref) {
    rf_infer *st;
    if (rf_infer_new(m, T, chunk, &st)) fail_msg("%s", rf_errmsg());
    const rf_causal_dims *d = rf_infer_dims(st);
    float *h = malloc((size_t)T * d->C * sizeof(float)),
          *lg = malloc((size_t)T * d->vocab * sizeof(float));
    for (int at = 0; at < T;) {
        int n = at == 0 ? first : step;
        if (n > T - at) n = T - at;
        assert_int_equal(rf_infer_forward(st, ids + at, n, h + (size_t)at * d->C), 0);
        at += n;
        assert_int_equal(rf_infer_len(st), at);
    }
    rf_infer_logits(st, h, T, lg);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        const float *a = lg + (size_t)t * d->vocab, *b = ref + (size_t)t * d->vocab;
        double e = 0, r = 0;
        for (int v = 0; v < d->vocab; v++)
            e += ((double)a[v] - b[v]) * ((double)a[v] - b[v]), r += (double)b[v] * b[v];
        e = sqrt(e) / fmax(sqrt(r), 1e-6);
        worst = e > worst ? e : worst;
    }
    free(h), free(lg);
    rf_infer_free(st);
    return worst;
}

static void check_model(rf_causal_model *m, const char *what, int T) {
    rf_causal_dims d;
    assert_int_equal(rf_causal_dims_of(m, &d), 0);
    if (T > d.max_pos) T = d.max_pos;
    rf_rng r;
    rf_rng_seed(&r, 7);
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    for (int t = 0; t < T; t++)
        ids[t] = (int32_t)rf_rng_below(&r, (uint64_t)d.vocab);
    float *ref = full_logits(m, ids, T, d.vocab);
    struct {
        int chunk, first, step;
    } ways[] = {{T, T, 1}, {4, 5, 1}, {3, 1, 1}, {T, T / 2, 3}, {64, T - 1, 1}};
    double worst = 0;
    for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++) {
        double e = incremental(m, ids, T, ways[i].chunk, ways[i].first, ways[i].step, ref);
        if (e > TOL)
            printf("  %s: chunk %d, first %d, then %d: rel err %.3g\n", what, ways[i].chunk,
                   ways[i].first, ways[i].step, e);
        worst = e > worst ? e : worst;
    }
    printf("%s: %d positions, 5 feeding orders, worst per-position logits rel err %.3g\n", what, T,
           worst);
    assert_true(worst <= TOL);
    free(ids), free(ref);
}

static void test_fixtures(void **state) {
    const char *gpt2[] = {"tests/fixtures/causal/tiny-gpt2-rand"};
    const char *llama[] = {"tests/fixtures/causal/tiny-llama-rand",
                           "tests/fixtures/causal/tiny-llama-tied"};
    for (size_t i = 0; i < 1; i++) {
        char *p = path_of(gpt2[i]);
        rf_causal_model m = {0};
        if (rf_gpt2_load(p, &m.gpt2)) fail_msg("%s", rf_errmsg());
        check_model(&m, gpt2[i], 20);
        rf_gpt2_free(m.gpt2);
        free(p);
    }
    for (size_t i = 0; i < 2; i++) {
        char *p = path_of(llama[i]);
        rf_causal_model m = {0};
        if (rf_llama_load(p, &m.llama)) fail_msg("%s", rf_errmsg());
        check_model(&m, llama[i], 20);
        rf_llama_free(m.llama);
        free(p);
    }
}

static void test_shared_tiny_gpt2(void **state) {
    const char *shared = getenv("SHARED");
    char p[4096];
    snprintf(p, sizeof p, "%s/models/tiny-gpt2", shared ? shared : "../shared");
    struct stat st;
    if (stat(p, &st) != 0) RF_SKIP("%s is missing", p);
    rf_causal_model m = {0};
    if (rf_gpt2_load(p, &m.gpt2)) fail_msg("%s", rf_errmsg());
    /* 150 positions: a prefill of more than 64 new tokens runs the CPU's
     * attention in blocks of 64 queries (causal_infer.c's QB) */
    check_model(&m, "tiny-gpt2", 150);
    rf_gpt2_free(m.gpt2);
}

static void test_smollm2(void **state) {
    const char *d = getenv("REFINERY_SMOLLM2_DIR");
    char p[4096];
    if (d && *d)
        snprintf(p, sizeof p, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d);
    else {
        char *q = path_of("build/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf");
        snprintf(p, sizeof p, "%s", q);
        free(q);
    }
    if (getenv("REFINERY_SANITIZED"))
        RF_SKIP("SmolLM2 (135M parameters) is not run under the sanitizers; make test runs it");
    struct stat st;
    if (stat(p, &st) != 0) RF_SKIP("SmolLM2 not found at %s (run scripts/fetch-smollm2.sh)", p);
    rf_causal_model m = {0};
    if (rf_llama_load_gguf(p, &m.llama)) fail_msg("%s", rf_errmsg());
    check_model(&m, "SmolLM2-135M", 16);
    rf_llama_free(m.llama);
}

static void test_range(void **state) {
    char *p = path_of("tests/fixtures/causal/tiny-llama-tied");
    rf_causal_model m = {0};
    if (rf_llama_load(p, &m.llama)) fail_msg("%s", rf_errmsg());
    free(p);
    rf_infer *st;
    int max = m.llama->cfg.max_position_embeddings;
    assert_int_equal(rf_infer_new(&m, max + 1, 4, &st), RF_ERR_RANGE);
    assert_int_equal(rf_infer_new(&m, 0, 4, &st), RF_ERR_RANGE);
    assert_int_equal(rf_infer_new(&m, 8, 4, &st), 0);
    int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    assert_int_equal(rf_infer_forward(st, ids, 9, NULL), RF_ERR_RANGE); /* past cap */
    assert_int_equal(rf_infer_len(st), 0);
    int32_t bad[2] = {3, 64}; /* vocab 64 */
    assert_int_equal(rf_infer_forward(st, bad, 2, NULL), RF_ERR_RANGE);
    bad[1] = -1;
    assert_int_equal(rf_infer_forward(st, bad, 2, NULL), RF_ERR_RANGE);
    assert_int_equal(rf_infer_len(st), 0);
    assert_int_equal(rf_infer_forward(st, ids, 8, NULL), 0);
    assert_int_equal(rf_infer_forward(st, ids, 1, NULL), RF_ERR_RANGE);
    rf_infer_reset(st);
    assert_int_equal(rf_infer_len(st), 0);
    assert_int_equal(rf_infer_forward(st, ids, 1, NULL), 0);
    rf_infer_free(st);
    rf_causal_model none = {0};
    assert_int_equal(rf_infer_new(&none, 4, 4, &st), RF_ERR_INVALID);
    rf_llama_free(m.llama);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_shared_tiny_gpt2),
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
