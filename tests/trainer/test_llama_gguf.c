/* GGUF "llama" files as rf_llama (trainer/llama_gguf.h), against
 * transformers loading the same files with gguf_file= (fixtures of
 * scripts/parity/lm_fixtures.py in tests/fixtures/lm/):
 *
 * - tiny-llama-tied.gguf, tests/fixtures/causal/tiny-llama-tied converted the
 *   way convert_hf_to_gguf.py does (F32, q/k rows permuted per head): every
 *   weight equals the folder's bit for bit after the loader undoes the
 *   permutation, and the logits equal transformers' from the GGUF within 1e-5;
 * - SmolLM2-135M-Instruct (Q4_1, scripts/fetch-smollm2.sh; skipped without
 *   it and under the sanitizers): the config transformers derives, and the
 *   logits of three prompts within 1e-4 of transformers' (the worse of the
 *   norm-wise relative error of 1000 strided elements and the relative error
 *   of the sum of squares), with the same arg-max at every position. Not the
 *   sum of all logits as parity_causal.h's compare() also checks: an error
 *   common to every logit of a row (the hidden state's error along the mean
 *   embedding) adds up over the 49,152 columns, so that check would measure
 *   sqrt(numel) times the relative error (2e-4 .. 4e-4 here, where the
 *   logits themselves differ by 2e-6 norm-wise);
 * - a damaged file (another architecture, a renamed tensor, a bad count)
 *   is refused with its error code. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <sys/stat.h>

#include "../support/skip.h"
#include "common/error.h"
#include "common/sys.h"
#include "parity_causal.h"
#include "trainer/llama_gguf.h"

#define SMOL_TOL 1e-4

/* Worse of the strided samples' norm-wise relative error and the sum of
 * squares' relative error, against fixture tensors samp./sumsq.<name>. */
static double sampled_err(const rf_st_file *ref, const char *name, const float *x, size_t n) {
    char key[256];
    snprintf(key, sizeof key, "samp.%s", name);
    size_t ns;
    float *samp = fx_get(ref, key, &ns), *mine = malloc(ns * sizeof(float));
    for (size_t i = 0; i < ns; i++)
        mine[i] = x[i * n / ns];
    double e = rel_err(mine, samp, ns), ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    snprintf(key, sizeof key, "sumsq.%s", name);
    float *rss = fx_get(ref, key, NULL);
    e = fmax(e, fabs(ss - rss[0]) / rss[0]);
    free(samp), free(mine), free(rss);
    return e;
}

static void test_tiny_roundtrip(void **state) {
    char *gg = root_path("tests/fixtures/lm/tiny-llama-tied.gguf"),
         *hf = root_path("tests/fixtures/causal/tiny-llama-tied"),
         *refp = root_path("tests/fixtures/lm/llama_gguf_ref.safetensors");
    rf_llama *a, *b;
    if (rf_llama_load_gguf(gg, &a)) fail_msg("%s", rf_errmsg());
    if (rf_llama_load(hf, &b)) fail_msg("%s", rf_errmsg());
    assert_int_equal(a->cfg.num_attention_heads, 6);
    assert_int_equal(a->cfg.num_key_value_heads, 2);
    assert_int_equal(a->cfg.head_dim, 6);
    assert_true(a->cfg.tie_word_embeddings);
    assert_true(a->cfg.rope_theta == b->cfg.rope_theta);
    assert_true(a->cfg.rms_norm_eps == b->cfg.rms_norm_eps);
    assert_int_equal(a->nparams, b->nparams);
    assert_memory_equal(a->params, b->params, a->nparams * sizeof(float));

    rf_st_file *ref;
    if (rf_st_open(refp, &ref)) fail_msg("%s", rf_errmsg());
    size_t n;
    int32_t *ids = fx_ints(ref, "in.ids", &n);
    assert_int_equal(rf_llama_forward(a, &(rf_causal_batch){.B = 1, .T = (int)n, .ids = ids}), 0);
    double e = compare(ref, "out.logits", a->logits, n * a->cfg.vocab_size),
           eh = compare(ref, "out.logits_hf", a->logits, n * a->cfg.vocab_size);
    printf("tiny-llama-tied.gguf: weights bitwise equal to the folder's; logits rel err %.3g "
           "(transformers, gguf_file=), %.3g (transformers, the folder)\n",
           e, eh);
    assert_true(e <= LOGIT_TOL && eh <= LOGIT_TOL);
    free(ids);
    rf_st_free(ref);
    rf_llama_free(a);
    rf_llama_free(b);
    free(gg), free(hf), free(refp);
}

/* The fixture's bytes with `from` replaced by `to` (same length) at its
 * first occurrence. */
static void expect_patched(const uint8_t *buf, size_t len, const char *from, const char *to,
                           size_t k, int want, const char *says) {
    uint8_t *p = malloc(len);
    memcpy(p, buf, len);
    uint8_t *at = memmem(p, len, from, k);
    assert_non_null(at);
    memcpy(at, to, k);
    rf_gguf_file *f;
    assert_int_equal(rf_gguf_parse(p, len, &f), 0);
    rf_llama *m = NULL;
    int rc = rf_llama_from_gguf(f, &m);
    if (rc != want || !strstr(rf_errmsg(), says))
        fail_msg("%s -> %s: got %d '%s', want %d '%s'", from, to, rc, rf_errmsg(), want, says);
    assert_null(m);
    rf_gguf_free(f);
    free(p);
}

static void test_refusals(void **state) {
    char *gg = root_path("tests/fixtures/lm/tiny-llama-tied.gguf");
    char *buf;
    size_t len;
    assert_int_equal(rf_read_file(gg, 1 << 20, &buf, &len), 0);
    const uint8_t *b = (const uint8_t *)buf;
    /* general.architecture's value: length 5, "llama" */
    expect_patched(b, len, "\x05\0\0\0\0\0\0\0llama", "\x05\0\0\0\0\0\0\0llamb", 13,
                   RF_ERR_UNSUPPORTED, "architecture");
    expect_patched(b, len, "blk.1.attn_q.weight", "blk.1.attn_x.weight", 19, RF_ERR_NOT_FOUND,
                   "blk.1.attn_q.weight");
    /* a tensor of a layer the config does not have: the real one is missing */
    expect_patched(b, len, "blk.0.ffn_up.weight", "blk.9.ffn_up.weight", 19, RF_ERR_NOT_FOUND,
                   "blk.0.ffn_up.weight");
    /* a head count that does not divide the embedding */
    expect_patched(b, len, "llama.attention.head_count\x04\0\0\0\x06",
                   "llama.attention.head_count\x04\0\0\0\x07", 31, RF_ERR_INVALID, "head");
    rf_llama *m;
    char missing[4200];
    snprintf(missing, sizeof missing, "%s.missing", gg);
    assert_int_equal(rf_llama_load_gguf(missing, &m), RF_ERR_IO);
    assert_non_null(strstr(rf_errmsg(), ".missing"));
    rf_gguf_file *f;
    assert_int_equal(rf_gguf_parse(b, len / 2, &f), RF_ERR_CORRUPT);
    free(buf);
    free(gg);
}

static void test_smollm2(void **state) {
    const char *d = getenv("REFINERY_SMOLLM2_DIR");
    char p[4096];
    if (d && *d) {
        snprintf(p, sizeof p, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d);
    } else {
        char *q = root_path("build/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf");
        snprintf(p, sizeof p, "%s", q);
        free(q);
    }
    if (getenv("REFINERY_SANITIZED"))
        RF_SKIP("SmolLM2 (135M parameters) is not run under the sanitizers; make test runs it");
    struct stat st;
    if (stat(p, &st) != 0) RF_SKIP("SmolLM2 not found at %s (run scripts/fetch-smollm2.sh)", p);
    double t0 = rf_now();
    rf_llama *m;
    if (rf_llama_load_gguf(p, &m)) fail_msg("%s", rf_errmsg());
    double t_load = rf_now() - t0;
    const rf_llama_config *c = &m->cfg;
    /* what transformers 5.24 builds from the file's metadata */
    assert_int_equal(c->vocab_size, 49152);
    assert_int_equal(c->hidden_size, 576);
    assert_int_equal(c->intermediate_size, 1536);
    assert_int_equal(c->num_hidden_layers, 30);
    assert_int_equal(c->num_attention_heads, 9);
    assert_int_equal(c->num_key_value_heads, 3);
    assert_int_equal(c->head_dim, 64);
    assert_int_equal(c->max_position_embeddings, 8192);
    assert_true(c->rope_theta == 100000.0f);
    assert_true(c->rms_norm_eps == 1e-5f);
    assert_true(c->tie_word_embeddings);

    char *refp = root_path("tests/fixtures/lm/smollm2_ref.safetensors");
    rf_st_file *ref;
    if (rf_st_open(refp, &ref)) fail_msg("%s", rf_errmsg());
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "in.ids.%d", i);
        size_t T;
        int32_t *ids = fx_ints(ref, name, &T);
        snprintf(name, sizeof name, "out.argmax.%d", i);
        int32_t *am = fx_ints(ref, name, NULL);
        assert_int_equal(rf_llama_forward(m, &(rf_causal_batch){.B = 1, .T = (int)T, .ids = ids}),
                         0);
        snprintf(name, sizeof name, "out.logits.%d", i);
        double e = sampled_err(ref, name, m->logits, T * c->vocab_size);
        int diff = 0;
        for (size_t t = 0; t < T; t++) {
            const float *z = m->logits + t * c->vocab_size;
            int best = 0;
            for (int v = 1; v < c->vocab_size; v++)
                if (z[v] > z[best]) best = v;
            diff += best != am[t];
        }
        printf("SmolLM2 prompt %d (%zu tokens): logits rel err %.3g, arg-max differs at %d "
               "positions\n",
               i, T, e, diff);
        worst = e > worst ? e : worst;
        assert_int_equal(diff, 0);
        free(ids), free(am);
    }
    printf("SmolLM2-135M from GGUF: load + dequantize %.2f s, worst logits rel err %.3g (limit "
           "%g)\n",
           t_load, worst, SMOL_TOL);
    assert_true(worst <= SMOL_TOL);
    rf_st_free(ref);
    free(refp);
    rf_llama_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_roundtrip),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_smollm2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
