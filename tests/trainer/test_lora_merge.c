/* Inference with a PEFT LoRA adapter merged into the base (lora.h:
 * rf_lora_merge_peft), run by the KV-cache inference (causal_infer.h):
 *
 * - peft's own adapter folders over the random tiny GPT-2 and Llama of
 *   tests/fixtures/causal/ (scripts/parity/lora_fixtures.py: r 4, alpha 12,
 *   every projection, GPT-2 with fan_in_fan_out): the logits of every
 *   unpadded position of the fixture batch equal peft's (unmerged) logits
 *   within 1e-5 (norm-wise relative, per row), and the base alone is far
 *   from them (so the check sees the adapter);
 * - an adapter over tests/fixtures/causal/tiny-llama-tied merged into the
 *   same model loaded from its GGUF file (q/k rows put back in Hugging
 *   Face's order; scripts/parity/lora_infer_fixtures.py): the same check;
 * - an adapter the trainer writes (rf_lora_save_peft, random B; GPT-2 with
 *   every target, Llama with q, v, gate, down at r 8): merged, the logits equal
 *   those of the model with the adapter attached (rf_*_forward through
 *   rf_lora_fwd) within 1e-5;
 * - bad adapters refused with their error code, the model unchanged: a
 *   missing folder or weight file, a non-LoRA peft type, another
 *   architecture's modules, shapes of another model, a tensor too many. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/rng.h"
#include "parity_causal.h"
#include "trainer/causal_infer.h"
#include "common/gguf.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/llama_gguf.h"
#include "trainer/lora.h"

/* logits [n, vocab] of ids[0..n) through a fresh inference state. */
static float *infer_logits(const rf_causal_model *cm, const int32_t *ids, int n) {
    rf_infer *s;
    assert_int_equal(rf_infer_new(cm, n, n, &s), RF_OK);
    const rf_causal_dims *d = rf_infer_dims(s);
    float *h = malloc(sizeof(float) * (size_t)n * d->C);
    float *lg = malloc(sizeof(float) * (size_t)n * d->vocab);
    assert_int_equal(rf_infer_forward(s, ids, n, h), RF_OK);
    assert_int_equal(rf_infer_logits(s, h, n, lg), RF_OK);
    free(h);
    rf_infer_free(s);
    return lg;
}

/* The worst per-row relative error of the model's logits against the
 * fixture's out.logits [B, T, V] over each row's unpadded positions (in.mask;
 * one row of all positions without a mask). */
static double worst_err(const rf_causal_model *cm, const rf_st_file *ref, int V) {
    size_t n;
    int32_t *ids = fx_ints(ref, "in.ids", &n);
    float *logits = fx_get(ref, "out.logits", NULL);
    float *mask = rf_st_find(ref, "in.mask") ? fx_get(ref, "in.mask", NULL) : NULL;
    const rf_st_tensor *t = rf_st_find(ref, "in.ids");
    int B = t->ndim == 2 ? (int)t->shape[0] : 1, T = (int)(n / (size_t)B);
    double worst = 0;
    for (int b = 0; b < B; b++) {
        int len = 0;
        while (len < T && (!mask || mask[b * T + len] > 0))
            len++;
        float *lg = infer_logits(cm, ids + b * T, len);
        double e = rel_err(lg, logits + (size_t)b * T * V, (size_t)len * V);
        worst = fmax(worst, e);
        free(lg);
    }
    free(ids), free(logits), free(mask);
    return worst;
}

static void check_merged(const char *base, const char *adapter, const char *refname, bool gguf) {
    char *bp = root_path(base), *ap = root_path(adapter), *rp = root_path(refname);
    rf_causal_model cm = {0};
    int rc;
    if (gguf)
        rc = rf_llama_load_gguf(bp, &cm.llama);
    else if (strstr(base, "gpt2"))
        rc = rf_gpt2_load(bp, &cm.gpt2);
    else
        rc = rf_llama_load(bp, &cm.llama);
    if (rc) fail_msg("%s", rf_errmsg());
    rf_st_file *ref;
    if (rf_st_open(rp, &ref)) fail_msg("%s", rf_errmsg());
    rf_causal_dims d;
    assert_int_equal(rf_causal_dims_of(&cm, &d), RF_OK);
    double before = worst_err(&cm, ref, d.vocab);
    rc = rf_lora_merge_peft(cm.gpt2, cm.llama, ap);
    if (rc) fail_msg("%s", rf_errmsg());
    double after = worst_err(&cm, ref, d.vocab);
    printf("%s + %s: logits vs peft's, worst row rel err %.3g merged (base alone %.3g)\n", base,
           adapter, after, before);
    assert_true(after <= LOGIT_TOL);
    assert_true(before > 1e-2);
    rf_st_free(ref);
    rf_gpt2_free(cm.gpt2);
    rf_llama_free(cm.llama);
    free(bp), free(ap), free(rp);
}

static void test_gpt2(void **state) {
    (void)state;
    check_merged("tests/fixtures/causal/tiny-gpt2-rand", "tests/fixtures/lora/gpt2_lora",
                 "tests/fixtures/lora/gpt2_lora_ref.safetensors", false);
}

static void test_llama(void **state) {
    (void)state;
    check_merged("tests/fixtures/causal/tiny-llama-rand", "tests/fixtures/lora/llama_lora",
                 "tests/fixtures/lora/llama_lora_ref.safetensors", false);
}

static void test_llama_gguf(void **state) {
    (void)state;
    check_merged("tests/fixtures/lm/tiny-llama-tied.gguf", "tests/fixtures/lora/llama_tied_lora",
                 "tests/fixtures/lora/llama_tied_lora_ref.safetensors", true);
}

/* The trainer's adapter files, merged, against the attached adapter. */
static void check_trainer_written(bool llama) {
    char *dir = root_path(llama ? "tests/fixtures/causal/tiny-llama-rand"
                                : "tests/fixtures/causal/tiny-gpt2-rand");
    rf_causal_model a = {0}, b = {0};
    int rc = llama ? rf_llama_load(dir, &a.llama) || rf_llama_load(dir, &b.llama)
                   : rf_gpt2_load(dir, &a.gpt2) || rf_gpt2_load(dir, &b.gpt2);
    if (rc) fail_msg("%s", rf_errmsg());
    rf_lora_config c = rf_lora_defaults();
    c.targets = llama ? RF_LORA_Q | RF_LORA_V | RF_LORA_GATE | RF_LORA_DOWN
                      : RF_LORA_Q | RF_LORA_K | RF_LORA_V | RF_LORA_O | RF_LORA_UP | RF_LORA_DOWN;
    rf_lora *lo;
    rc = llama ? rf_lora_new_llama(a.llama, &c, 3, &lo) : rf_lora_new_gpt2(a.gpt2, &c, 3, &lo);
    if (rc) fail_msg("%s", rf_errmsg());
    rf_rng rng;
    rf_rng_seed(&rng, 17);
    for (size_t t = 1; t < lo->ntensors; t += 2) /* B is zero at init: make it count */
        for (size_t i = 0; i < lo->tensors[t].numel; i++)
            lo->params[lo->tensors[t].offset + i] = (float)((rf_rng_double(&rng) * 2 - 1) * 0.3);
    char tmp[] = "/tmp/rf_lora_merge_XXXXXX";
    assert_non_null(mkdtemp(tmp));
    assert_int_equal(rf_lora_save_peft(lo, tmp, "tiny"), RF_OK);
    rc = llama ? rf_lora_attach_llama(lo, a.llama, false) : rf_lora_attach_gpt2(lo, a.gpt2);
    if (rc) fail_msg("%s", rf_errmsg());
    enum { T = 12 };
    int32_t ids[T];
    for (int i = 0; i < T; i++)
        ids[i] = (int32_t)((i * 37 + 5) % 64);
    rf_causal_batch bt = {.B = 1, .T = T, .ids = ids};
    rc = llama ? rf_llama_reserve(a.llama, 1, T) || rf_llama_forward(a.llama, &bt)
               : rf_gpt2_reserve(a.gpt2, 1, T) || rf_gpt2_forward(a.gpt2, &bt);
    if (rc) fail_msg("%s", rf_errmsg());
    const float *want = llama ? a.llama->logits : a.gpt2->logits;
    float *base = infer_logits(&b, ids, T);
    if (rf_lora_merge_peft(b.gpt2, b.llama, tmp)) fail_msg("%s", rf_errmsg());
    float *got = infer_logits(&b, ids, T);
    double e = rel_err(got, want, (size_t)T * 64), eb = rel_err(base, want, (size_t)T * 64);
    printf("%s, the trainer's adapter files merged: logits vs the attached adapter's rel err "
           "%.3g (base alone %.3g)\n",
           llama ? "Llama" : "GPT-2", e, eb);
    assert_true(e <= LOGIT_TOL);
    assert_true(eb > 1e-2);
    /* an attached model is not merged into */
    rc = llama ? rf_lora_merge_llama(lo, a.llama) : rf_lora_merge_gpt2(lo, a.gpt2);
    assert_int_equal(rc, RF_ERR_INVALID);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
    free(base), free(got), free(dir);
    rf_gpt2_free(a.gpt2), rf_gpt2_free(b.gpt2);
    rf_llama_free(a.llama), rf_llama_free(b.llama);
    rf_lora_free(lo);
}

static void test_trainer_written(void **state) {
    (void)state;
    check_trainer_written(false);
    check_trainer_written(true);
}

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...) {
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    assert_int_equal(system(cmd), 0);
}

/* rf_lora_merge_peft of dir into m must fail with want, m unchanged. */
static void refused(rf_gpt2 *g, rf_llama *l, const char *dir, int want) {
    size_t n = g ? g->nparams : l->nparams;
    float *p = g ? g->params : l->params, *copy = malloc(n * sizeof(float));
    memcpy(copy, p, n * sizeof(float));
    int rc = rf_lora_merge_peft(g, l, dir);
    printf("  %s: %d %s\n", dir, rc, rf_errmsg());
    assert_int_equal(rc, want);
    assert_true(strlen(rf_errmsg()) > 0);
    assert_memory_equal(copy, p, n * sizeof(float));
    free(copy);
}

static void test_bad_adapters(void **state) {
    (void)state;
    char *root = root_path("");
    rf_gpt2 *g;
    rf_llama *l;
    char *gp = root_path("tests/fixtures/causal/tiny-gpt2-rand");
    char *lp = root_path("tests/fixtures/causal/tiny-llama-rand");
    if (rf_gpt2_load(gp, &g) || rf_llama_load(lp, &l)) fail_msg("%s", rf_errmsg());
    char tmp[] = "/tmp/rf_lora_merge_XXXXXX";
    assert_non_null(mkdtemp(tmp));
    char dir[4200];

    snprintf(dir, sizeof dir, "%s/none", tmp);
    refused(g, NULL, dir, RF_ERR_NOT_FOUND);
    /* the config without the weights */
    snprintf(dir, sizeof dir, "%s/noweights", tmp);
    sh("mkdir '%s' && cp '%s/tests/fixtures/lora/gpt2_lora/adapter_config.json' '%s/'", dir, root,
       dir);
    refused(g, NULL, dir, RF_ERR_NOT_FOUND);
    /* another peft type */
    snprintf(dir, sizeof dir, "%s/ia3", tmp);
    sh("cp -r '%s/tests/fixtures/lora/gpt2_lora' '%s' && "
       "sed -i 's/\"LORA\"/\"IA3\"/' '%s/adapter_config.json'",
       root, dir, dir);
    refused(g, NULL, dir, RF_ERR_UNSUPPORTED);
    /* a Llama adapter over GPT-2, a GPT-2 adapter over Llama */
    snprintf(dir, sizeof dir, "%s/tests/fixtures/lora/llama_lora", root);
    refused(g, NULL, dir, RF_ERR_UNSUPPORTED);
    snprintf(dir, sizeof dir, "%s/tests/fixtures/lora/gpt2_lora", root);
    refused(NULL, l, dir, RF_ERR_UNSUPPORTED);
    /* tiny-gpt2's adapter (hidden size 2) over a GPT-2 of hidden size 32 */
    snprintf(dir, sizeof dir, "%s/tests/fixtures/lora/tiny_gpt2_lora", root);
    refused(g, NULL, dir, RF_ERR_INVALID);
    /* tiny-llama-tied's adapter (6 heads of 6) over tiny-llama-rand */
    snprintf(dir, sizeof dir, "%s/tests/fixtures/lora/llama_tied_lora", root);
    refused(NULL, l, dir, RF_ERR_INVALID);
    /* fewer targets in the config than tensors in the file */
    snprintf(dir, sizeof dir, "%s/extra", tmp);
    sh("cp -r '%s/tests/fixtures/lora/llama_lora' '%s' && "
       "sed -i '/\"down_proj\",/d' '%s/adapter_config.json'",
       root, dir, dir);
    refused(NULL, l, dir, RF_ERR_INVALID);

    sh("rm -rf '%s'", tmp);
    rf_gpt2_free(g);
    rf_llama_free(l);
    free(gp), free(lp), free(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),         cmocka_unit_test(test_llama),
        cmocka_unit_test(test_llama_gguf),   cmocka_unit_test(test_trainer_written),
        cmocka_unit_test(test_bad_adapters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
