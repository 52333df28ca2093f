/* The causal-LM side of the evaluator (evaluator/lm.h, perplexity.h,
 * generate.h) against transformers, through the fixtures of
 * scripts/parity/lm_fixtures.py in tests/fixtures/lm/:
 *
 * - perplexity of ppl_text.txt with ../shared/models/tiny-gpt2 at five
 *   (max_len, stride) settings (overlapping windows, none, a partial last
 *   window, stride above max_len, one window): tokens, seq_len and windows
 *   equal the HF guide's loop exactly, the perplexity within 1e-5 relative;
 * - greedy generation equal to generate(do_sample=False) token for token
 *   (tiny-gpt2: 2 prompts x 20 tokens; SmolLM2: 2 prompts x 24 tokens and 2
 *   chat prompts, whose apply_chat_template ids are matched too); the
 *   streamed text pieces add up to the decoded ids;
 * - SmolLM2's perplexity at (64, 32) within 1e-4;
 * - the sampler's rules (temperature, top-k ties, top-p, seeded draws) on a
 *   fixed distribution, the ChatML renderer on templates written both ways,
 *   and the loader's and perplexity's refusals;
 * - generated-answer accuracy (answers.h) on shards written here.
 * SmolLM2 cases need scripts/fetch-smollm2.sh and are skipped under the
 * sanitizers; tiny-gpt2 cases need ../shared. */
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
#include <unistd.h>

#include "../support/skip.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/json.h"
#include "common/sys.h"
#include "evaluator/answers.h"
#include "evaluator/generate.h"
#include "evaluator/lm.h"
#include "evaluator/perplexity.h"
#include "tokenizer/shard.h"

static char root[2048], shared[2100];

static int setup(void **state) {
    const char *r = getenv("REFINERY_ROOT"), *s = getenv("SHARED");
    snprintf(root, sizeof root, "%s", r ? r : ".");
    if (s)
        snprintf(shared, sizeof shared, "%s", s);
    else
        snprintf(shared, sizeof shared, "%s/../shared", root);
    return 0;
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* tiny-gpt2 from ../shared, or skip. */
static rf_lm *tiny_gpt2(void) {
    char p[4200];
    snprintf(p, sizeof p, "%s/models/tiny-gpt2", shared);
    if (!exists(p)) return NULL;
    rf_lm *lm;
    if (rf_lm_load(p, &lm)) fail_msg("%s", rf_errmsg());
    return lm;
}

static const char *smollm2_dir(char *buf, size_t n) {
    const char *d = getenv("REFINERY_SMOLLM2_DIR");
    if (d && *d)
        snprintf(buf, n, "%s", d);
    else
        snprintf(buf, n, "%s/build/models/smollm2-135m", root);
    return buf;
}

#define SKIP_SMOLLM2(dir)                                                                          \
    do {                                                                                           \
        if (getenv("REFINERY_SANITIZED"))                                                          \
            RF_SKIP("SmolLM2 (135M parameters) is not run under the sanitizers; make test "        \
                    "runs it");                                                                    \
        char f_[4400];                                                                             \
        snprintf(f_, sizeof f_, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);                        \
        if (!exists(f_)) RF_SKIP("SmolLM2 not found at %s (run scripts/fetch-smollm2.sh)", f_);    \
    } while (0)

typedef struct fixture {
    char *text;
    rf_json_doc *doc;
    const rf_json *root;
} fixture;

static void fixture_open(fixture *f, const char *name) {
    char p[4200];
    size_t len;
    snprintf(p, sizeof p, "%s/tests/fixtures/lm/%s", root, name);
    assert_int_equal(rf_read_file(p, 1 << 20, &f->text, &len), 0);
    f->doc = rf_json_doc_new();
    if (rf_json_parse(f->doc, f->text, len, &f->root)) fail_msg("%s: %s", p, rf_errmsg());
}

static void fixture_close(fixture *f) {
    rf_json_doc_free(f->doc);
    free(f->text);
}

static int64_t jint(const rf_json *o, const char *key) {
    int64_t v;
    const rf_json *x = rf_json_get(o, key);
    if (!x || rf_json_int64(x, &v)) fail_msg("fixture: no integer '%s'", key);
    return v;
}

static double jnum(const rf_json *o, const char *key) {
    const rf_json *x = rf_json_get(o, key);
    if (!x || x->type != RF_JSON_NUMBER) fail_msg("fixture: no number '%s'", key);
    return x->num;
}

/* An integer array as int32 (malloc'd). */
static int32_t *jids(const rf_json *o, const char *key, int *n) {
    const rf_json *a = rf_json_get(o, key);
    if (!a || a->type != RF_JSON_ARRAY) fail_msg("fixture: no array '%s'", key);
    int32_t *v = malloc((a->len + 1) * sizeof *v);
    for (size_t i = 0; i < a->len; i++) {
        int64_t x;
        assert_int_equal(rf_json_int64(&a->u.items[i], &x), 0);
        v[i] = (int32_t)x;
    }
    *n = (int)a->len;
    return v;
}

static char *ppl_text(size_t *len) {
    char p[4200], *t;
    snprintf(p, sizeof p, "%s/tests/fixtures/lm/ppl_text.txt", root);
    assert_int_equal(rf_read_file(p, 1 << 20, &t, len), 0);
    return t;
}

/* ---- perplexity ---- */

static void check_ppl(const rf_lm *lm, const rf_json *cases, double tol, const char *what) {
    size_t len;
    char *text = ppl_text(&len);
    for (size_t i = 0; i < cases->len; i++) {
        const rf_json *c = &cases->u.items[i];
        rf_ppl_opts o = {.max_len = (int)jint(c, "max_len"), .stride = (int)jint(c, "stride")};
        rf_ppl_result r;
        if (rf_perplexity_text(lm, text, len, &o, &r)) fail_msg("%s", rf_errmsg());
        double want = jnum(c, "perplexity"), e = fabs(r.perplexity - want) / want;
        printf("%s max_len %d stride %d: perplexity %.6f (transformers %.6f, rel diff %.2g), "
               "tokens %lld, windows %d\n",
               what, o.max_len, o.stride, r.perplexity, want, e, (long long)r.tokens, r.windows);
        assert_int_equal(r.tokens, jint(c, "tokens"));
        assert_int_equal(r.seq_len, jint(c, "seq_len"));
        assert_int_equal(r.windows, jint(c, "windows"));
        assert_int_equal(rf_ppl_windows(r.seq_len, o.max_len, o.stride), r.windows);
        assert_true(e <= tol);
        assert_true(fabs(r.nll - jnum(c, "nll")) <= tol * 10);
    }
    free(text);
}

static void test_ppl_tiny_gpt2(void **state) {
    rf_lm *lm = tiny_gpt2();
    if (!lm) RF_SKIP("%s/models/tiny-gpt2 is missing", shared);
    fixture f;
    fixture_open(&f, "ppl_ref.json");
    check_ppl(lm, rf_json_get(f.root, "tiny_gpt2_ppl"), 1e-5, "tiny-gpt2");
    fixture_close(&f);
    rf_lm_free(lm);
}

static void test_ppl_refusals(void **state) {
    rf_lm *lm = tiny_gpt2();
    if (!lm) RF_SKIP("%s/models/tiny-gpt2 is missing", shared);
    rf_ppl_result r;
    rf_ppl_opts o = {0};
    int32_t one = 5, ids[3] = {1, 2, 50257};
    assert_int_equal(rf_perplexity_ids(lm, &one, 1, &o, &r), RF_ERR_INVALID);
    assert_int_equal(rf_perplexity_ids(lm, ids, 3, &o, &r), RF_ERR_RANGE); /* id past vocab */
    o.max_len = 1025;
    assert_int_equal(rf_perplexity_ids(lm, ids, 2, &o, &r), RF_ERR_RANGE);
    assert_non_null(strstr(rf_errmsg(), "1024"));
    o.max_len = 0;
    assert_int_equal(rf_perplexity_ids(lm, ids, 2, &o, &r), 0);
    assert_int_equal(r.max_len, 1024); /* the model's positions */
    assert_int_equal(r.stride, 512);
    assert_int_equal(r.tokens, 1);
    assert_int_equal(rf_perplexity_text(lm, "x", 1, &o, &r), RF_ERR_INVALID);
    /* the run: a missing file, a file that is not UTF-8 */
    char p[4200], bad[] = "/tmp/rf-lm-badutf8-XXXXXX";
    snprintf(p, sizeof p, "%s/models/tiny-gpt2", shared);
    assert_int_equal(rf_perplexity_run(p, "/nonexistent/x.txt", &o, NULL, NULL), RF_ERR_NOT_FOUND);
    int fd = mkstemp(bad);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "ok \xff\xfe text", 10), 10);
    close(fd);
    assert_int_equal(rf_perplexity_run(p, bad, &o, NULL, NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "UTF-8"));
    unlink(bad);
    rf_lm_free(lm);
    /* the window loop's count */
    assert_int_equal(rf_ppl_windows(10, 4, 2), 4); /* 0-4, 2-6, 4-8, 6-10 */
    assert_int_equal(rf_ppl_windows(10, 20, 5), 1);
    assert_int_equal(rf_ppl_windows(10, 3, 5), 2); /* 0-3, 5-8, then 10 is past the end */
}

/* ---- generation ---- */

typedef struct collected {
    rf_buf text;
    int32_t ids[256];
    int n;
    const char *finish;
} collected;

static int collect(void *user, int32_t id, const char *piece, size_t len, const char *finish) {
    collected *c = user;
    assert_true(c->n < 256);
    assert_null(c->finish); /* only the last token has a finish reason */
    c->ids[c->n++] = id;
    c->finish = finish;
    return rf_buf_append(&c->text, piece, len);
}

/* Greedy generation of each fixture case equals transformers'. */
static void check_greedy(const rf_lm *lm, const rf_json *g, const char *list, bool chat) {
    const rf_json *cases = rf_json_get(g, list);
    int max_new = (int)jint(g, "max_new_tokens");
    for (size_t i = 0; i < cases->len; i++) {
        const rf_json *c = &cases->u.items[i], *pr = rf_json_get(c, "prompt");
        assert_true(rf_json_is_str(pr));
        int np, nw;
        int32_t *want_prompt = jids(c, "prompt_ids", &np), *want = jids(c, "ids", &nw), *pids;
        int n;
        assert_int_equal(rf_gen_prompt_ids(lm, pr->u.str, chat, &pids, &n), 0);
        assert_int_equal(n, np);
        assert_memory_equal(pids, want_prompt, (size_t)n * sizeof *pids);
        rf_gen_opts o = {.max_new_tokens = max_new, .chat = chat};
        collected col = {.text = RF_BUF_INIT};
        rf_gen_result res;
        if (rf_generate(lm, pr->u.str, &o, collect, &col, &res)) fail_msg("%s", rf_errmsg());
        int same = 0;
        while (same < res.n && same < nw && res.ids[same] == want[same])
            same++;
        printf("%s %s %zu: %d of %d tokens equal transformers' (finish %s)\n", lm->arch, list, i,
               same, nw, res.finish);
        assert_int_equal(res.n, nw);
        assert_int_equal(same, nw);
        assert_int_equal(col.n, res.n);
        assert_memory_equal(col.ids, res.ids, (size_t)res.n * sizeof *res.ids);
        assert_string_equal(col.finish, res.finish);
        assert_string_equal(res.finish, rf_lm_is_eos(lm, want[nw - 1]) ? "eos" : "length");
        /* the streamed pieces add up to the decoded text */
        rf_buf dec = RF_BUF_INIT;
        assert_int_equal(
            rf_tok_decode(lm->tok, (const uint32_t *)res.ids, (size_t)res.n, true, &dec), 0);
        assert_int_equal(col.text.len, dec.len);
        if (dec.len) assert_memory_equal(col.text.data, dec.data, dec.len);
        const rf_json *t = rf_json_get(c, "text");
        if (rf_json_is_str(t)) assert_string_equal(dec.data ? dec.data : "", t->u.str);
        rf_buf_free(&dec);
        rf_buf_free(&col.text);
        rf_gen_result_free(&res);
        free(pids), free(want_prompt), free(want);
    }
}

static void test_generate_tiny_gpt2(void **state) {
    rf_lm *lm = tiny_gpt2();
    if (!lm) RF_SKIP("%s/models/tiny-gpt2 is missing", shared);
    assert_int_equal(lm->n_eos, 1);
    assert_int_equal(lm->eos[0], 50256);
    fixture f;
    fixture_open(&f, "generate_ref.json");
    check_greedy(lm, rf_json_get(f.root, "tiny_gpt2"), "generate", false);
    fixture_close(&f);

    /* sampling: the same seed, the same tokens; top_k 1 is greedy */
    rf_gen_opts o = {.max_new_tokens = 12, .sampling = {.temperature = 1.0f, .seed = 11}};
    rf_gen_result a, b, c, g;
    assert_int_equal(rf_generate(lm, "Hello", &o, NULL, NULL, &a), 0);
    assert_int_equal(rf_generate(lm, "Hello", &o, NULL, NULL, &b), 0);
    o.sampling.seed = 12;
    assert_int_equal(rf_generate(lm, "Hello", &o, NULL, NULL, &c), 0);
    assert_int_equal(a.n, 12);
    assert_memory_equal(a.ids, b.ids, 12 * sizeof *a.ids);
    assert_true(memcmp(a.ids, c.ids, 12 * sizeof *a.ids) != 0);
    rf_gen_result_free(&b);
    o.sampling.top_k = 1;
    assert_int_equal(rf_generate(lm, "Hello", &o, NULL, NULL, &b), 0);
    rf_gen_opts greedy = {.max_new_tokens = 12};
    assert_int_equal(rf_generate(lm, "Hello", &greedy, NULL, NULL, &g), 0);
    assert_memory_equal(b.ids, g.ids, 12 * sizeof *g.ids);
    rf_gen_result_free(&a), rf_gen_result_free(&b), rf_gen_result_free(&c);
    rf_gen_result_free(&g);

    /* positions run out: 1024 - prompt; the prompt may not fill them */
    int32_t *ids = malloc(1024 * sizeof *ids);
    for (int i = 0; i < 1024; i++)
        ids[i] = i % 50000;
    o = (rf_gen_opts){.max_new_tokens = 50};
    assert_int_equal(rf_generate_ids(lm, ids, 1020, &o, NULL, NULL, &a), 0);
    assert_int_equal(a.n, 5); /* 1020 + 4 fed, the 5th chosen from position 1023 */
    assert_string_equal(a.finish, "length");
    rf_gen_result_free(&a);
    assert_int_equal(rf_generate_ids(lm, ids, 1024, &o, NULL, NULL, &a), RF_ERR_RANGE);
    assert_int_equal(rf_generate_ids(lm, ids, 0, &o, NULL, NULL, &a), RF_ERR_INVALID);
    free(ids);
    /* no chat template in tiny-gpt2 */
    int32_t *p;
    int n;
    assert_int_equal(rf_gen_prompt_ids(lm, "hi", true, &p, &n), RF_ERR_NOT_FOUND);
    rf_lm_free(lm);
}

static void test_smollm2(void **state) {
    char dir[4096];
    smollm2_dir(dir, sizeof dir);
    SKIP_SMOLLM2(dir);
    rf_lm *lm;
    if (rf_lm_load(dir, &lm)) fail_msg("%s", rf_errmsg());
    assert_string_equal(lm->arch, "llama");
    assert_int_equal(lm->n_eos, 1);
    assert_int_equal(lm->eos[0], 2);
    assert_non_null(lm->chat_template);
    fixture f;
    fixture_open(&f, "generate_ref.json");
    const rf_json *g = rf_json_get(f.root, "smollm2");
    check_greedy(lm, g, "generate", false);
    check_greedy(lm, g, "chat", true);
    fixture_close(&f);
    fixture_open(&f, "ppl_ref.json");
    check_ppl(lm, rf_json_get(f.root, "smollm2_ppl"), 1e-4, "SmolLM2");
    fixture_close(&f);
    rf_lm_free(lm);
}

/* ---- sampler ---- */

/* Frequencies of n draws from logits z (4 tokens). */
static void draw(const rf_sampling *s, const float *z, int n, double *freq) {
    rf_sampler sm;
    assert_int_equal(rf_sampler_init(&sm, s, 4), 0);
    int cnt[4] = {0};
    for (int i = 0; i < n; i++)
        cnt[rf_sampler_next(&sm, z)]++;
    for (int i = 0; i < 4; i++)
        freq[i] = (double)cnt[i] / n;
    rf_sampler_free(&sm);
}

static void test_sampler(void **state) {
    /* probabilities .5 .3 .15 .05 */
    float z[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    double f[4];
    const int N = 40000;
    const double tol = 0.01; /* about 4 standard deviations at N = 40000 */
    rf_sampling s = {.temperature = 1, .seed = 3};
    draw(&s, z, N, f);
    double p1[4] = {0.5, 0.3, 0.15, 0.05};
    for (int i = 0; i < 4; i++)
        assert_true(fabs(f[i] - p1[i]) < tol);
    /* temperature 2: p^(1/2) renormalised */
    s.temperature = 2;
    draw(&s, z, N, f);
    double q[4], qs = 0;
    for (int i = 0; i < 4; i++)
        qs += q[i] = sqrt(p1[i]);
    for (int i = 0; i < 4; i++)
        assert_true(fabs(f[i] - q[i] / qs) < tol);
    /* top-k 2: .5/.8 and .3/.8 */
    s = (rf_sampling){.temperature = 1, .top_k = 2, .seed = 4};
    draw(&s, z, N, f);
    assert_true(fabs(f[0] - 0.625) < tol && fabs(f[1] - 0.375) < tol && f[2] == 0 && f[3] == 0);
    /* top-p 0.7: .5 (before it 0 < .7) and .3 (before it .5 < .7); not .15 (.8) */
    s = (rf_sampling){.temperature = 1, .top_p = 0.7f, .seed = 5};
    draw(&s, z, N, f);
    assert_true(fabs(f[0] - 0.625) < tol && f[2] == 0 && f[3] == 0);
    /* top-p 0.8 stops at exactly .8 before the third: still two kept */
    s.top_p = 0.81f;
    draw(&s, z, N, f);
    assert_true(f[2] > 0.1 && f[3] == 0);
    /* top-p below the first probability keeps one: greedy */
    s.top_p = 0.1f;
    draw(&s, z, 1000, f);
    assert_true(f[0] == 1.0);
    /* top-k keeps ties at its threshold */
    float tie[4] = {1, 2, 2, 0};
    s = (rf_sampling){.temperature = 1, .top_k = 1, .seed = 6};
    draw(&s, tie, N, f);
    assert_true(fabs(f[1] - 0.5) < tol && fabs(f[2] - 0.5) < tol && f[0] == 0);
    /* greedy: the first of equal maxima */
    s = (rf_sampling){0};
    draw(&s, tie, 10, f);
    assert_true(f[1] == 1.0);
    /* seeded */
    rf_sampler a, b;
    s = (rf_sampling){.temperature = 0.7f, .top_p = 0.95f, .seed = 99};
    assert_int_equal(rf_sampler_init(&a, &s, 4), 0);
    assert_int_equal(rf_sampler_init(&b, &s, 4), 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(rf_sampler_next(&a, z), rf_sampler_next(&b, z));
    rf_sampler_free(&a), rf_sampler_free(&b);
    /* refused settings */
    rf_sampling bad[] = {{.temperature = -1},
                         {.temperature = NAN},
                         {.top_p = 1.5f},
                         {.top_p = -0.1f},
                         {.top_k = -2}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(rf_sampler_init(&a, &bad[i], 4), RF_ERR_INVALID);
}

/* ---- chat template ---- */

static void test_chat_render(void **state) {
    /* the SmolLM2 template as its GGUF stores it (newlines inside the
     * literals) and as tokenizer_config.json files often spell it ('\n') */
    const char *smol =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
        "'<|im_start|>assistant\n' }}{% endif %}";
    const char *escaped =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
        "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    rf_chat_msg user = {"user", "Hi there"}, two[] = {{"system", "Be brief."}, {"user", "Hi"}};
    rf_buf b = RF_BUF_INIT;
    assert_int_equal(rf_chat_render(smol, &user, 1, true, &b), 0);
    assert_string_equal(b.data, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                                "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi "
                                "there<|im_end|>\n<|im_start|>assistant\n");
    rf_buf_reset(&b);
    assert_int_equal(rf_chat_render(smol, two, 2, true, &b), 0); /* a system message: no default */
    assert_string_equal(b.data, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                                "Hi<|im_end|>\n<|im_start|>assistant\n");
    rf_buf_reset(&b);
    assert_int_equal(rf_chat_render(escaped, &user, 1, true, &b), 0); /* no default system block */
    assert_string_equal(b.data, "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
    rf_buf_reset(&b);
    assert_int_equal(rf_chat_render("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }}"
                                    "{% endfor %}",
                                    &user, 1, true, &b),
                     RF_ERR_UNSUPPORTED);
    assert_int_equal(rf_chat_render(NULL, &user, 1, true, &b), RF_ERR_NOT_FOUND);
    rf_buf_free(&b);
}

/* ---- loading ---- */

static void test_load_refusals(void **state) {
    rf_lm *lm;
    char p[4200], tmp[] = "/tmp/rf-lm-XXXXXX";
    assert_int_equal(rf_lm_load("/nonexistent/model", &lm), RF_ERR_NOT_FOUND);
    assert_non_null(mkdtemp(tmp));
    assert_int_equal(rf_lm_load(tmp, &lm), RF_ERR_NOT_FOUND); /* empty folder */
    assert_non_null(strstr(rf_errmsg(), ".gguf"));
    /* two GGUF files: which one is meant? */
    char cmd[9000];
    snprintf(cmd, sizeof cmd,
             "cp '%s/tests/fixtures/lm/tiny-llama-tied.gguf' '%s/a.gguf' && "
             "cp '%s/a.gguf' '%s/b.gguf'",
             root, tmp, tmp, tmp);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(rf_lm_load(tmp, &lm), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "2 .gguf files"));
    /* one GGUF without tokenizer metadata */
    snprintf(p, sizeof p, "%s/b.gguf", tmp);
    unlink(p);
    assert_int_equal(rf_lm_load(tmp, &lm), RF_ERR_NOT_FOUND);
    assert_non_null(strstr(rf_errmsg(), "tokenizer"));
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
    /* a classifier folder is not a causal LM */
    snprintf(p, sizeof p, "%s/tests/fixtures/trainer/tiny-bert", root);
    assert_int_equal(rf_lm_load(p, &lm), RF_ERR_UNSUPPORTED);
    assert_non_null(strstr(rf_errmsg(), "model_type"));
}

static void test_cache(void **state) {
    char p[4200];
    snprintf(p, sizeof p, "%s/models/tiny-gpt2", shared);
    if (!exists(p)) RF_SKIP("%s is missing", p);
    rf_lm_cache *cc;
    rf_lm *a, *b;
    assert_int_equal(rf_lm_cache_new(1, &cc), 0);
    assert_int_equal(rf_lm_cache_get(cc, p, &a), 0);
    assert_int_equal(rf_lm_cache_get(cc, p, &b), 0);
    assert_ptr_equal(a, b);
    assert_int_equal(rf_lm_cache_loads(cc), 1);
    assert_int_equal(rf_lm_cache_get(cc, "/nonexistent", &b), RF_ERR_NOT_FOUND);
    rf_lm_cache_release(cc, a);
    rf_lm_cache_release(cc, a);
    rf_lm_cache_free(cc);
}

/* Generated-answer accuracy (answers.h) on shards written here: per
 * conversation a prompt (mask 0) and a reference (mask 1). The first
 * reference is tiny-gpt2's own greedy continuation (correct), the second
 * another text (wrong), the third has no mask-1 token (skipped); then the
 * refusals: no .mask, a .mask of the wrong size. */
static void test_answers(void **state) {
    (void)state;
    rf_lm *lm = tiny_gpt2();
    if (!lm) RF_SKIP("%s/models/tiny-gpt2 is missing", shared);
    int32_t prompt[] = {464, 3290, 318, 257};
    rf_gen_opts go = {.max_new_tokens = 1};
    rf_gen_result g = {0};
    assert_int_equal(rf_generate_ids(lm, prompt, 4, &go, NULL, NULL, &g), 0);
    /* tiny-gpt2 repeats one token and never ends a text: that token is made
     * its end id, so its answer is empty; the reference " " (white space
     * only, trimmed to "") is then correct and "." is not. */
    lm->eos[lm->n_eos++] = g.ids[0];
    char dir[] = "/tmp/rf_answers_XXXXXX", prefix[64], path[80];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/eval", dir);
    rf_shard_info info = {.vocab_size = 50257, .eos_id = -1, .pad_id = -1};
    rf_shard_writer *w;
    assert_int_equal(rf_shard_writer_open(prefix, &info, &w), 0);
    uint32_t a[6], b[6];
    uint8_t mask[16] = {0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0};
    for (int i = 0; i < 4; i++)
        a[i] = b[i] = (uint32_t)prompt[i];
    a[4] = 220, b[4] = 13; /* " " and "." */
    a[5] = b[5] = (uint32_t)g.ids[0];
    int L = 1;
    uint32_t n = (uint32_t)(4 + L + 1); /* prompt, reference, end id */
    assert_int_equal(rf_shard_writer_add(w, a, n, -1, 1), 0);
    assert_int_equal(rf_shard_writer_add(w, b, n, -1, 2), 0);
    assert_int_equal(rf_shard_writer_add(w, a, 4, -1, 3), 0); /* no answer: skipped */
    assert_int_equal(rf_shard_writer_close(w), 0);
    size_t total = 2 * n + 4;
    rf_buf json = RF_BUF_INIT;
    rf_answers r;
    assert_int_equal(rf_lm_answers(lm, prefix, 0, &json, &r), RF_ERR_NOT_FOUND);
    snprintf(path, sizeof path, "%s.mask", prefix);
    assert_int_equal(rf_write_file_atomic(path, mask, total - 1), 0);
    assert_int_equal(rf_lm_answers(lm, prefix, 0, &json, &r), RF_ERR_CORRUPT);
    assert_int_equal(rf_write_file_atomic(path, mask, total), 0);
    rf_buf_reset(&json);
    assert_int_equal(rf_lm_answers(lm, prefix, 0, &json, &r), 0);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.correct, 1);
    assert_int_equal(r.skipped, 1);
    assert_true(fabs(r.accuracy - 0.5) < 1e-12);
    rf_json_doc *d = rf_json_doc_new();
    const rf_json *root;
    assert_int_equal(rf_json_parse(d, json.data, json.len, &root), 0);
    const rf_json *ex = rf_json_get(root, "examples");
    assert_int_equal(ex->len, 2);
    assert_int_equal(rf_json_get(&ex->u.items[0], "correct")->type, RF_JSON_TRUE);
    assert_int_equal(rf_json_get(&ex->u.items[1], "correct")->type, RF_JSON_FALSE);
    assert_string_equal(rf_json_get(&ex->u.items[1], "reference")->u.str, ".");
    rf_json_doc_free(d);
    rf_buf_reset(&json);
    assert_int_equal(rf_lm_answers(lm, prefix, 1, &json, &r), 0); /* the first only */
    assert_int_equal(r.n, 1);
    assert_int_equal(r.correct, 1);
    rf_buf_free(&json);
    rf_gen_result_free(&g);
    rf_lm_free(lm);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ppl_tiny_gpt2),
        cmocka_unit_test(test_ppl_refusals),
        cmocka_unit_test(test_generate_tiny_gpt2),
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_chat_render),
        cmocka_unit_test(test_load_refusals),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_answers),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
