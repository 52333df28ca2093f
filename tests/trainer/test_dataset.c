/* Training data from token shards (prefix and directory forms, truncation
 * keeping the closing token) and padded batch collation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "tokenizer/shard.h"
#include "trainer/dataset.h"

static char tmpdir[] = "/tmp/rf_ds_XXXXXX";

static void write_shard(const char *prefix, int first_label) {
    rf_shard_info info = {0};
    info.vocab_size = 100;
    info.eos_id = -1;
    info.pad_id = 0;
    rf_shard_writer *w;
    assert_int_equal(rf_shard_writer_open(prefix, &info, &w), 0);
    uint32_t a[4] = {2, 10, 11, 3}, b[8] = {2, 20, 21, 22, 23, 24, 25, 3};
    assert_int_equal(rf_shard_writer_add(w, a, 4, first_label, 1), 0);
    assert_int_equal(rf_shard_writer_add(w, b, 8, first_label + 1, 2), 0);
    assert_int_equal(rf_shard_writer_close(w), 0);
}

static void test_shards(void **state) {
    char dir[300], prefix[400];
    snprintf(dir, sizeof dir, "%s/shards", tmpdir);
    assert_int_equal(rf_mkdir_p(dir), 0);
    snprintf(prefix, sizeof prefix, "%s/a", dir);
    write_shard(prefix, 0);
    snprintf(prefix, sizeof prefix, "%s/b", dir);
    write_shard(prefix, 2);

    rf_dataset d = {0};
    assert_int_equal(rf_dataset_load(&d, prefix, NULL, 6, NULL, NULL), 0); /* one prefix */
    assert_int_equal(d.n, 2);
    assert_int_equal(d.len[1], 6);
    assert_int_equal(d.tokens[d.start[1] + 5], 3); /* [SEP] kept after truncation */
    assert_int_equal(d.tokens[d.start[1] + 4], 23);
    assert_int_equal(d.label[1], 3);
    rf_dataset_free(&d);

    assert_int_equal(rf_dataset_load(&d, dir, NULL, 128, NULL, NULL), 0); /* directory */
    assert_int_equal(d.n, 4);
    assert_int_equal(d.label[0], 0); /* a before b */
    assert_int_equal(d.label[3], 3);
    assert_int_equal(rf_dataset_num_labels(&d), 4);

    size_t idx[2] = {0, 1};
    rf_batch_buf bb = {0};
    assert_int_equal(rf_batch_collate(&bb, &d, idx, 2), 0);
    assert_int_equal(bb.T, 8);
    assert_int_equal(bb.ids[4], 0); /* padding */
    assert_int_equal(bb.valid[3], 1);
    assert_int_equal(bb.valid[4], 0);
    assert_int_equal(bb.valid[8 + 7], 1);
    assert_int_equal(bb.labels[1], 1);
    rf_batch_buf_free(&bb);
    rf_dataset_free(&d);

    /* a corrupt shard is an error, not an empty dataset */
    char idxp[500];
    snprintf(idxp, sizeof idxp, "%s.idx", prefix);
    assert_int_equal(rf_write_file_atomic(idxp, "RFTOKIDX", 8), 0);
    assert_int_not_equal(rf_dataset_load(&d, prefix, NULL, 128, NULL, NULL), 0);
    rf_dataset_free(&d);
    char empty[400];
    snprintf(empty, sizeof empty, "%s/empty", tmpdir);
    assert_int_equal(rf_mkdir_p(empty), 0);
    assert_int_equal(rf_dataset_load(&d, empty, NULL, 128, NULL, NULL), RF_ERR_NOT_FOUND);
    rf_dataset_free(&d);
}

/* GLUE-style TSV through the tiny fixture's WordPiece vocabulary. */
static void test_tsv(void **state) {
    char path[300], model[4096];
    snprintf(path, sizeof path, "%s/dev.tsv", tmpdir);
    snprintf(model, sizeof model, "%s/tests/fixtures/trainer/tiny-bert",
             getenv("REFINERY_ROOT") ? getenv("REFINERY_ROOT") : ".");
    const char *tsv = "sentence\tlabel\r\na good movie\t1\r\nbad plot\t0\r\nno label\t\r\n"
                      "dull\tx\r\n";
    assert_int_equal(rf_write_file_atomic(path, tsv, strlen(tsv)), 0);
    rf_dataset d = {0};
    if (rf_dataset_load(&d, path, model, 16, NULL, NULL)) fail_msg("%s", rf_errmsg());
    assert_int_equal(d.n, 2);
    assert_int_equal(d.skipped, 2);
    /* [CLS] a good movie [SEP] with the fixture vocabulary: 2 18 5 9 3 */
    uint32_t want[5] = {2, 18, 5, 9, 3};
    assert_int_equal(d.len[0], 5);
    assert_memory_equal(d.tokens + d.start[0], want, sizeof want);
    assert_int_equal(d.label[0], 1);
    assert_int_equal(d.label[1], 0);
    rf_dataset_free(&d);
    assert_int_equal(rf_write_file_atomic(path, "text\tscore\n", 11), 0);
    assert_int_equal(rf_dataset_load(&d, path, model, 16, NULL, NULL), RF_ERR_PARSE);
    assert_non_null(strstr(rf_errmsg(), "label"));
    rf_dataset_free(&d);
}

static int setup(void **state) {
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_shards), cmocka_unit_test(test_tsv)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
