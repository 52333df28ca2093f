/* The causal-LM export (rf_export_model): each tiny random fixture (GPT-2,
 * untied and tied Llama) and, when ../shared is there, sshleifer/tiny-gpt2
 * are trained for two steps through rf_train_model, exported, reloaded with
 * rf_model_load: the reloaded model's parameters and logits are bitwise the
 * trained model's, the config says float32, a tied head is not written, and
 * exporting the reloaded model again gives the same model.safetensors bytes.
 *
 * With REFINERY_CAUSAL_EXPORT_OUT=DIR the exports and the C logits
 * (DIR/<name>/ and DIR/<name>.logits.safetensors: ids, mask, logits) are
 * kept there for scripts/parity/causal_export_check.py, which loads them in
 * transformers (run by hand: it needs torch); REFINERY_CAUSAL_EXPORT_FROM=M
 * adds M (an exported folder, e.g. a run's model/) as DIR/extra.logits.safetensors,
 * its logits as loaded, without training. */
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

#include "common/error.h"
#include "common/sys.h"
#include "../support/skip.h"
#include "trainer/lm_data.h"
#include "trainer/model_iface.h"
#include "trainer/safetensors.h"
#include "trainer/train.h"

static char tmpdir[] = "/tmp/test_causal_export_XXXXXX";

static rf_model *load(const char *dir) {
    rf_model *m;
    if (rf_model_load(dir, NULL, rf_backend_cpu(), &m)) fail_msg("%s: %s", dir, rf_errmsg());
    return m;
}

static char *slurp(const char *path, size_t *len) {
    char *d;
    if (rf_read_file(path, (size_t)1 << 30, &d, len)) fail_msg("%s", rf_errmsg());
    return d;
}

/* A right-padded 2 x 7 batch of ids below vocab. */
typedef struct batch {
    int32_t ids[14];
    uint8_t valid[14];
    rf_model_batch b;
} batch;

static void make_batch(int vocab, batch *x) {
    for (int n = 0; n < 14; n++) {
        x->ids[n] = (int32_t)((n * 37 + 11) % vocab);
        x->valid[n] = n < 7 || n < 7 + 4;
    }
    x->b = (rf_model_batch){.B = 2, .T = 7, .ids = x->ids, .valid = x->valid};
}

static float *logits_copy(rf_model *m, const batch *x, size_t *n) {
    assert_int_equal(rf_model_forward(m, &x->b, false, 0), 0);
    const float *l;
    size_t row;
    assert_int_equal(rf_model_logits(m, &l, &row), 0);
    *n = row * (size_t)x->b.B * x->b.T;
    float *c = malloc(*n * sizeof *c);
    memcpy(c, l, *n * sizeof *c);
    return c;
}

static void keep_logits(const char *keep, const char *name, const batch *x, const float *l,
                        size_t n) {
    char path[4096];
    float ids[14], mask[14];
    for (int i = 0; i < 14; i++) {
        ids[i] = (float)x->ids[i];
        mask[i] = x->valid[i];
    }
    rf_st_out t[3] = {{"ids", 2, {2, 7}, ids},
                      {"mask", 2, {2, 7}, mask},
                      {"logits", 2, {14, (int64_t)(n / 14)}, l}};
    snprintf(path, sizeof path, "%s/%s.logits.safetensors", keep, name);
    assert_int_equal(rf_st_write(path, t, 3), 0);
    print_message("kept %s\n", path);
}

static void check_export(const char *name, const char *src) {
    char out[512], exp1[600], exp2[600], path[700];
    snprintf(out, sizeof out, "%s/%s", tmpdir, name);
    rf_model *m = load(src);
    rf_model_info in = rf_model_info_of(m);
    assert_int_equal(in.task, RF_TASK_CAUSAL_LM);
    /* a few documents below the vocabulary, two optimizer steps at a large lr */
    rf_dataset d = {0};
    rf_lm_packer *p;
    int eos = in.eos_token_id >= 0 ? in.eos_token_id : 0;
    assert_int_equal(rf_lm_packer_new(&d, 12, eos, &p), 0);
    for (int k = 0; k < 8; k++) {
        uint32_t ids[9];
        for (int t = 0; t < 9; t++)
            ids[t] = (uint32_t)((k * 13 + t * 7 + 1) % in.vocab);
        assert_int_equal(rf_lm_packer_add(p, ids, NULL, 4 + (size_t)(k % 5)), 0);
    }
    assert_int_equal(rf_lm_packer_finish(p), 0);
    rf_train_opts o = rf_train_defaults();
    o.out_dir = out;
    o.batch_size = 2;
    o.max_steps = 2;
    o.log_every = 0;
    o.optim.lr = 1e-2f;
    o.optim.warmup_steps = 0;
    rf_train_result r;
    if (rf_train_model(&o, &d, m, &r)) fail_msg("%s: %s", name, rf_errmsg());
    assert_int_equal(r.steps, 2);
    batch x;
    make_batch(in.vocab, &x);
    size_t n;
    float *l1 = logits_copy(m, &x, &n);

    snprintf(exp1, sizeof exp1, "%s/export", out);
    if (rf_export_model(m, src, exp1)) fail_msg("%s: %s", name, rf_errmsg());
    snprintf(path, sizeof path, "%s/config.json", exp1);
    size_t len;
    char *cfg = slurp(path, &len);
    assert_non_null(strstr(cfg, "\"float32\""));
    assert_non_null(strstr(cfg, in.arch));
    free(cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", exp1);
    rf_st_file *st;
    assert_int_equal(rf_st_open(path, &st), 0);
    assert_true((rf_st_find(st, "lm_head.weight") != NULL) == !in.tied);
    rf_st_free(st);

    rf_model *back = load(exp1);
    rf_model_blocks a, b;
    assert_int_equal(rf_model_blocks_of(m, &a), 0);
    assert_int_equal(rf_model_blocks_of(back, &b), 0);
    assert_int_equal(a.nparams, b.nparams);
    assert_memory_equal(a.params, b.params, a.nparams * sizeof(float));
    size_t n2;
    float *l2 = logits_copy(back, &x, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(l1, l2, n * sizeof(float));
    snprintf(exp2, sizeof exp2, "%s/export2", out);
    assert_int_equal(rf_export_model(back, exp1, exp2), 0);
    char p1[700], p2[700];
    snprintf(p1, sizeof p1, "%s/model.safetensors", exp1);
    snprintf(p2, sizeof p2, "%s/model.safetensors", exp2);
    size_t n1b, n2b;
    char *s1 = slurp(p1, &n1b), *s2 = slurp(p2, &n2b);
    assert_int_equal(n1b, n2b);
    assert_memory_equal(s1, s2, n1b);
    free(s1);
    free(s2);
    print_message("%s: trained 2 steps (loss %.4f), exported, reloaded: parameters and %zu logits "
                  "bitwise equal, re-export byte-identical\n",
                  name, r.last_loss, n);

    const char *keep = getenv("REFINERY_CAUSAL_EXPORT_OUT");
    if (keep && keep[0]) { /* for scripts/parity/causal_export_check.py */
        char dir[700];
        snprintf(dir, sizeof dir, "%s/%s", keep, name);
        assert_int_equal(rf_export_model(m, src, dir), 0);
        keep_logits(keep, name, &x, l1, n);
    }
    free(l1);
    free(l2);
    rf_dataset_free(&d);
    rf_model_free(m);
    rf_model_free(back);
}

static char *fx(const char *rel) {
    const char *root = getenv("REFINERY_ROOT");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/tests/fixtures/causal/%s", root ? root : ".", rel);
    return p;
}

static void test_gpt2(void **state) {
    (void)state;
    char *d = fx("tiny-gpt2-rand");
    check_export("gpt2-rand", d);
    free(d);
}

static void test_llama(void **state) {
    (void)state;
    char *d = fx("tiny-llama-rand"), *t = fx("tiny-llama-tied");
    check_export("llama-rand", d);
    check_export("llama-tied", t);
    free(d);
    free(t);
}

static void test_shared_tiny_gpt2(void **state) {
    (void)state;
    const char *shared = getenv("SHARED");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/tiny-gpt2", shared ? shared : "../shared");
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        RF_SKIP("%s not found (../shared)", dir);
        return;
    }
    check_export("tiny-gpt2", dir);
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const char *from = getenv("REFINERY_CAUSAL_EXPORT_FROM"),
               *keep = getenv("REFINERY_CAUSAL_EXPORT_OUT");
    if (from && from[0] && keep && keep[0]) { /* by hand, for causal_export_check.py */
        rf_model *m;
        if (rf_model_load(from, NULL, rf_backend_cpu(), &m)) {
            fprintf(stderr, "%s: %s\n", from, rf_errmsg());
            return 1;
        }
        batch x;
        make_batch(rf_model_info_of(m).vocab, &x);
        size_t n;
        float *l = logits_copy(m, &x, &n);
        keep_logits(keep, "extra", &x, l, n);
        free(l);
        rf_model_free(m);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_shared_tiny_gpt2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
