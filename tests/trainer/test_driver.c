/* The trainer driver (trainer/driver.h) on the tiny BERT fixture (16
 * positions, 100 ids): max_len capped at the model's positions where the data
 * is loaded (texts longer than 16 tokens train with max_len 128, which
 * failed before the driver), token ids outside the vocabulary refused, fewer
 * than two labels refused, the export written only when training finished,
 * hooks (stats, checkpoint callback, cancel) honoured. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/stats.h"
#include "parity_util.h"
#include "tokenizer/shard.h"
#include "trainer/driver.h"

static char tmpdir[] = "/tmp/rf_driver_XXXXXX";
static char *tiny;

static int setup(void **state) {
    (void)state;
    tiny = fixture_path("tiny-bert");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    free(tiny);
    return system(cmd) ? -1 : 0;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* A spec for a short run into tmpdir/<name>. */
static rf_trainer_spec spec_for(const char *name, const char *train, char *out, char *export_dir) {
    rf_trainer_spec s = {0};
    s.model = tiny;
    s.train = train;
    s.max_len = 128;
    s.threads = 1;
    s.opts = rf_train_defaults();
    s.opts.max_steps = 3;
    s.opts.batch_size = 4;
    s.opts.log_every = 0;
    snprintf(out, 512, "%s/%s", tmpdir, name);
    snprintf(export_dir, 512, "%s/%s/model", tmpdir, name);
    s.output = out;
    s.opts.out_dir = out;
    s.export_dir = export_dir;
    return s;
}

/* n records of 30 words each (over 16 tokens with [CLS]/[SEP]), labels i % k. */
static void write_jsonl(const char *path, int n, int k) {
    static const char *words[] = {"good", "bad", "great", "awful", "movie", "film", "plot"};
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"id\":\"d%d\",\"text\":\"", i);
        for (int w = 0; w < 30; w++)
            fprintf(f, "%s%s", w ? " " : "", words[(i + w) % 7]);
        fprintf(f, "\",\"label\":%d}\n", i % k);
    }
    fclose(f);
}

static void test_max_len(void **state) {
    (void)state;
    int ml;
    assert_int_equal(rf_trainer_max_len(tiny, 128, &ml), RF_OK);
    assert_int_equal(ml, 16);
    assert_int_equal(rf_trainer_max_len(tiny, 8, &ml), RF_OK);
    assert_int_equal(ml, 8);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/nope", tmpdir);
    assert_int_not_equal(rf_trainer_max_len(missing, 8, &ml), RF_OK);
    assert_non_null(strstr(rf_errmsg(), "nope"));
}

static int checkpoints;
static int count_checkpoint(void *user, const rf_bert *m, const rf_train_checkpoint *c) {
    (void)m;
    assert_ptr_equal(user, &checkpoints);
    assert_true(c->step >= 1 && c->step <= c->total);
    checkpoints++;
    return RF_OK;
}

/* Sequences longer than the model's positions with max_len 128: loaded at 16,
 * trained, exported; stats and the checkpoint hook see the run. */
static void test_long_texts_train(void **state) {
    (void)state;
    char data[600], out[512], exp[512], path[600];
    snprintf(data, sizeof data, "%s/long.jsonl", tmpdir);
    write_jsonl(data, 12, 2);
    rf_trainer_spec s = spec_for("long", data, out, exp);
    rf_stats *st = rf_stats_new();
    assert_non_null(st);
    checkpoints = 0;
    rf_trainer_hooks h = {.stats = st, .on_checkpoint = count_checkpoint, .user = &checkpoints};
    rf_train_result res;
    int rc = rf_trainer_run(&s, &h, &res);
    if (rc) fail_msg("%s", rf_errmsg());
    assert_true(res.finished);
    assert_int_equal(res.steps, 3);
    assert_int_equal(checkpoints, 1); /* the last step */
    snprintf(path, sizeof path, "%s/model.safetensors", exp);
    assert_true(exists(path));
    assert_int_equal(rf_stats_get(st, "trainer.steps"), 3);
    assert_int_equal(rf_stats_get(st, "trainer.sequences"), 12);
    /* 12 sequences cut to 16 tokens, 3 steps of 4: every token counted once */
    assert_int_equal(rf_stats_get(st, "trainer.tokens"), 12 * 16);
    rf_stats_free(st);
}

/* A shard written for a larger vocabulary: refused before the model loads. */
static void test_vocab(void **state) {
    (void)state;
    char prefix[600], out[512], exp[512];
    snprintf(prefix, sizeof prefix, "%s/bigvocab", tmpdir);
    rf_shard_info info = {0};
    info.vocab_size = 1000;
    info.eos_id = -1;
    info.pad_id = 0;
    rf_shard_writer *w;
    assert_int_equal(rf_shard_writer_open(prefix, &info, &w), 0);
    uint32_t a[] = {2, 5, 9, 3}, b[] = {2, 6, 500, 3};
    assert_int_equal(rf_shard_writer_add(w, a, 4, 0, 1), 0);
    assert_int_equal(rf_shard_writer_add(w, b, 4, 1, 2), 0);
    assert_int_equal(rf_shard_writer_close(w), 0);
    rf_trainer_spec s = spec_for("vocab", prefix, out, exp);
    assert_int_equal(rf_trainer_run(&s, NULL, NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "token id 500 is outside the vocabulary"));
    assert_false(exists(out)); /* nothing trained */
}

static void test_one_label(void **state) {
    (void)state;
    char data[600], out[512], exp[512];
    snprintf(data, sizeof data, "%s/one.jsonl", tmpdir);
    write_jsonl(data, 6, 1);
    rf_trainer_spec s = spec_for("one", data, out, exp);
    assert_int_equal(rf_trainer_run(&s, NULL, NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "1 label(s)"));
    /* num_labels given: two classes even though the data has one */
    s.num_labels = 2;
    assert_int_equal(rf_trainer_run(&s, NULL, NULL), RF_OK);
}

/* Cancelled before the first step: RF_OK, not finished, no export. */
static void test_cancel(void **state) {
    (void)state;
    char data[600], out[512], exp[512];
    snprintf(data, sizeof data, "%s/long.jsonl", tmpdir);
    rf_trainer_spec s = spec_for("cancel", data, out, exp);
    volatile int cancel = 1;
    rf_trainer_hooks h = {.cancel = &cancel};
    rf_train_result res;
    assert_int_equal(rf_trainer_run(&s, &h, &res), RF_OK);
    assert_false(res.finished);
    assert_false(exists(exp));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_max_len), cmocka_unit_test(test_long_texts_train),
        cmocka_unit_test(test_vocab),   cmocka_unit_test(test_one_label),
        cmocka_unit_test(test_cancel),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
