/* LoRA training of a Llama given as a llama.cpp GGUF (issue 18) through the
 * trainer's spec and driver (spec.c, driver.c, model_lora.c):
 *
 * - tests/fixtures/lm/tiny-llama-tied.gguf (F32 tensors, no tokenizer in its
 *   metadata, so the data is a token shard naming its eos id): 4 steps with an
 *   nf4, int8 and fp32 base, the file given directly or as the one .gguf of a
 *   folder; the loss is finite and falls, the export is the PEFT adapter naming
 *   the GGUF as its base (no tokenizer files), and it loads back over the same
 *   file (rf_lora_load_peft) with B no longer zero;
 * - refusals: base q4_1 over an F32 file (at load) and over a Hugging Face
 *   folder (at parsing), a GGUF without trainer.lora (full fine-tuning is out
 *   of scope), tp / pp with LoRA, two .gguf files in a folder;
 * - SmolLM2-135M-Instruct Q4_1 (build/models/smollm2-135m or
 *   $REFINERY_SMOLLM2_DIR; skipped when absent and under the sanitizers): 2
 *   steps over the file's Q4_1 blocks on JSONL text tokenized by the GGUF's
 *   own tokenizer; loss finite, the adapter merges back with the evaluator's
 *   rf_lm_load_adapter; peak RSS printed. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/error.h"
#include "common/sys.h"
#include "evaluator/lm.h"
#include "../support/skip.h"
#include "tokenizer/shard.h"
#include "trainer/driver.h"
#include "trainer/llama.h"
#include "trainer/lora.h"
#include "trainer/spec.h"

static char tmpdir[] = "/tmp/rf_lora_gguf_XXXXXX";
static char gguf[1024], hf[1024], shard[1024];

static int setup(void **state) {
    (void)state;
    const char *root = getenv("REFINERY_ROOT");
    snprintf(gguf, sizeof gguf, "%s/tests/fixtures/lm/tiny-llama-tied.gguf", root ? root : ".");
    snprintf(hf, sizeof hf, "%s/tests/fixtures/causal/tiny-llama-tied", root ? root : ".");
    if (!mkdtemp(tmpdir)) return -1;
    /* 24 documents of a learnable pattern (each id's successor is the next
     * one), ids in [1, 64), eos 0 */
    snprintf(shard, sizeof shard, "%s/data", tmpdir);
    rf_shard_info info = {.vocab_size = 64, .eos_id = 0, .pad_id = -1};
    rf_shard_writer *w;
    if (rf_shard_writer_open(shard, &info, &w)) return -1;
    for (int d = 0; d < 24; d++) {
        uint32_t ids[12];
        for (int k = 0; k < 12; k++)
            ids[k] = 1 + (uint32_t)((d * 5 + k) % 63);
        if (rf_shard_writer_add(w, ids, 12, -1, (uint64_t)d)) return -1;
    }
    return rf_shard_writer_close(w) ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) ? -1 : 0;
}

/* Parses a trainer section; *root keeps the strings alive. */
static int parse(const char *yaml, rf_cfg **root, rf_trainer_spec *s) {
    if (rf_cfg_load_string(yaml, strlen(yaml), "spec.yaml", root)) fail_msg("%s", rf_errmsg());
    int rc = rf_trainer_spec_parse(rf_cfg_get(*root, "trainer"), s);
    s->opts.out_dir = s->output;
    return rc;
}

static void refused(const char *yaml, int code, const char *text) {
    rf_cfg *root;
    rf_trainer_spec s;
    int rc = parse(yaml, &root, &s);
    if (!rc) {
        rf_model *m = NULL; /* what parsing lets through, the load refuses */
        rc = rf_model_load_lora(s.model, &s.lora_cfg, NULL, 1, &m);
        rf_model_free(m);
    }
    rf_cfg_free(root);
    assert_int_equal(rc, code);
    if (!strstr(rf_errmsg(), text)) fail_msg("expected '%s' in: %s", text, rf_errmsg());
    printf("  refused: %s\n", rf_errmsg());
}

static void test_refusals(void **state) {
    (void)state;
    char y[8192], dir[1024], cmd[8192];
    snprintf(y, sizeof y, "trainer:\n  task: causal_lm\n  model: %s\n  lora: {base: q4_1}\n", gguf);
    refused(y, RF_ERR_UNSUPPORTED, "are F32: use base nf4, int8 or fp32");
    snprintf(y, sizeof y, "trainer:\n  task: causal_lm\n  model: %s\n  lora: {base: q4_1}\n", hf);
    refused(y, RF_ERR_UNSUPPORTED, "is not a GGUF");
    /* the load refuses it too (a spec parsed before its model was there) */
    rf_lora_config c = rf_lora_defaults();
    c.base = RF_QT_Q4_1;
    rf_model *m = NULL;
    assert_int_equal(rf_model_load_lora(hf, &c, NULL, 1, &m), RF_ERR_UNSUPPORTED);
    assert_null(m);
    assert_non_null(strstr(rf_errmsg(), "is a Hugging Face folder"));
    snprintf(y, sizeof y, "trainer:\n  task: causal_lm\n  model: %s\n", gguf);
    refused(y, RF_ERR_UNSUPPORTED, "full fine-tuning of a llama.cpp file is out of scope");
    snprintf(y, sizeof y,
             "trainer:\n  task: causal_lm\n  model: %s\n  lora: {base: nf4}\n"
             "  parallel: {pp: 2}\n",
             gguf);
    refused(y, RF_ERR_UNSUPPORTED, "trainer.lora: parallel tp 1 x pp 2");
    snprintf(dir, sizeof dir, "%s/two", tmpdir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s %s/a.gguf && cp %s %s/b.gguf", dir, gguf, dir,
             gguf, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(y, sizeof y, "trainer:\n  task: causal_lm\n  model: %s\n  lora: {base: nf4}\n", dir);
    refused(y, RF_ERR_INVALID, "2 .gguf files and no config.json");
}

/* The losses of OUT/metrics.jsonl (one per step). */
static int losses(const char *out, double *l, int cap) {
    char path[4096], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("no %s", path);
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"loss\":");
        if (p) l[n++] = strtod(p + 7, NULL);
    }
    fclose(f);
    return n;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void train_tiny(const char *name, const char *base, bool as_folder) {
    char model[1024], out[1024], exp[1024], y[8192], path[8192];
    snprintf(model, sizeof model, "%s", gguf);
    if (as_folder) { /* a folder holding the one .gguf (no config.json) */
        snprintf(model, sizeof model, "%s/%s-model", tmpdir, name);
        snprintf(path, sizeof path, "mkdir -p %s && cp %s %s/tiny.gguf", model, gguf, model);
        assert_int_equal(system(path), 0);
    }
    snprintf(out, sizeof out, "%s/%s", tmpdir, name);
    snprintf(exp, sizeof exp, "%s/%s/adapter", tmpdir, name);
    snprintf(y, sizeof y,
             "trainer:\n  task: causal_lm\n  model: %s\n  train: %s\n  output: %s\n"
             "  export: %s\n  max_steps: 4\n  batch_size: 16\n  max_len: 24\n  lr: 0.05\n"
             "  log_every: 1\n  threads: 1\n  shuffle: false\n"
             "  lora: {rank: 4, alpha: 8, targets: [q, k, v, o, gate, up, down], base: %s}\n",
             model, shard, out, exp, base);
    rf_cfg *root;
    rf_trainer_spec s;
    if (parse(y, &root, &s)) fail_msg("%s", rf_errmsg());
    rf_train_result r;
    if (rf_trainer_run(&s, NULL, &r)) fail_msg("%s", rf_errmsg());
    double l[16];
    int n = losses(out, l, 16);
    assert_int_equal(n, 4);
    printf("  tiny GGUF%s, %s base: loss %.4f -> %.4f over %d steps\n",
           as_folder ? " (folder)" : "", base, l[0], l[n - 1], n);
    for (int i = 0; i < n; i++)
        assert_true(isfinite(l[i]));
    assert_true(l[n - 1] < l[0] - 0.1);
    /* the export: the PEFT adapter over the GGUF, no tokenizer files */
    snprintf(path, sizeof path, "%s/adapter_config.json", exp);
    char *text;
    size_t len;
    if (rf_read_file(path, 1 << 20, &text, &len)) fail_msg("%s", rf_errmsg());
    char want[8192];
    snprintf(want, sizeof want, "\"base_model_name_or_path\": \"%s\"", model);
    if (!strstr(text, want)) fail_msg("%s lacks %s:\n%s", path, want, text);
    free(text);
    snprintf(path, sizeof path, "%s/tokenizer.json", exp);
    assert_false(exists(path));
    /* it loads back over the same file; training moved B off its zeros */
    rf_llama *m;
    rf_lora *lo;
    if (rf_lora_load_llama_gguf(gguf, &s.lora_cfg, 7, &m, &lo)) fail_msg("%s", rf_errmsg());
    double b0 = 0, b1 = 0;
    for (size_t i = 0; i < lo->ntensors; i++)
        if (strstr(lo->tensors[i].name, "lora_B"))
            for (size_t k = 0; k < lo->tensors[i].numel; k++)
                b0 += fabs(lo->params[lo->tensors[i].offset + k]);
    if (rf_lora_load_peft(lo, exp)) fail_msg("%s", rf_errmsg());
    for (size_t i = 0; i < lo->ntensors; i++)
        if (strstr(lo->tensors[i].name, "lora_B"))
            for (size_t k = 0; k < lo->tensors[i].numel; k++)
                b1 += fabs(lo->params[lo->tensors[i].offset + k]);
    printf("  the adapter loads back: sum |B| %.3g (initial %.3g)\n", b1, b0);
    assert_true(b0 == 0 && b1 > 0);
    rf_lora_free(lo);
    rf_llama_free(m);
    rf_cfg_free(root);
}

static void test_tiny_nf4(void **state) {
    (void)state;
    train_tiny("nf4", "nf4", false);
}

static void test_tiny_int8_folder(void **state) {
    (void)state;
    train_tiny("int8", "int8", true);
}

static void test_tiny_fp32(void **state) {
    (void)state;
    train_tiny("fp32", "fp32", false);
}

static void test_smollm2_q4_1(void **state) {
    (void)state;
    char path[1024], out[1024], exp[1024], data[1024], y[16384];
    const char *d = getenv("REFINERY_SMOLLM2_DIR"), *root = getenv("REFINERY_ROOT");
    if (d && *d)
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d);
    else
        snprintf(path, sizeof path, "%s/build/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
                 root ? root : ".");
    const char *san = getenv("REFINERY_SANITIZED");
    if (san && strcmp(san, "1") == 0)
        RF_SKIP("SmolLM2 training is slow under the sanitizers (the case runs in make test)");
    if (access(path, R_OK) != 0)
        RF_SKIP("SmolLM2 not found at %s (run scripts/fetch-smollm2.sh)", path);
    snprintf(data, sizeof data, "%s/smol.jsonl", tmpdir);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    static const char *const texts[] = {
        "The cat sat on the mat.",
        "Paris is the capital of France.",
        "Water boils at one hundred degrees Celsius.",
        "The quick brown fox jumps over the lazy dog.",
        "Bees make honey from the nectar of flowers.",
        "The sun rises in the east and sets in the west.",
        "A triangle has three sides.",
        "Rain falls from clouds in the sky.",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        fprintf(f, "{\"text\": \"%s\"}\n", texts[i]);
    fprintf(f, "{\"prompt\": \"What is 2+2? \", \"completion\": \"4\"}\n");
    fclose(f);
    snprintf(out, sizeof out, "%s/smol", tmpdir);
    snprintf(exp, sizeof exp, "%s/smol/adapter", tmpdir);
    snprintf(y, sizeof y,
             "trainer:\n  task: causal_lm\n  model: %s\n  train: %s\n  output: %s\n"
             "  export: %s\n  max_steps: 2\n  batch_size: 2\n  max_len: 32\n  lr: 0.001\n"
             "  log_every: 1\n  lora: {rank: 8, targets: [q, v], base: q4_1}\n",
             path, data, out, exp);
    rf_cfg *cfg;
    rf_trainer_spec s;
    if (parse(y, &cfg, &s)) fail_msg("%s", rf_errmsg());
    rf_train_result r;
    if (rf_trainer_run(&s, NULL, &r)) fail_msg("%s", rf_errmsg());
    double l[4];
    int n = losses(out, l, 4);
    assert_int_equal(n, 2);
    printf("  SmolLM2 Q4_1 base, LoRA r8 on q,v: loss %.4f, %.4f (2 steps, %.1f s, %llu tokens); "
           "peak RSS %lld KiB\n",
           l[0], l[1], r.seconds, (unsigned long long)r.tokens, (long long)rf_peak_rss_kb());
    assert_true(isfinite(l[0]) && isfinite(l[1]) && l[0] > 0 && l[0] < 20);
    rf_lm *lm; /* the evaluator merges it over the fp32 model from the same file */
    if (rf_lm_load_adapter(path, exp, &lm)) fail_msg("%s", rf_errmsg());
    rf_lm_free(lm);
    rf_cfg_free(cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),         cmocka_unit_test(test_tiny_nf4),
        cmocka_unit_test(test_tiny_int8_folder), cmocka_unit_test(test_tiny_fp32),
        cmocka_unit_test(test_smollm2_q4_1),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
