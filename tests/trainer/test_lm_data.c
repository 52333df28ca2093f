/* Causal-LM data (lm_data.h): packing documents into rows with EOS, segments,
 * restarting positions and -100 at each document's first token; loss masks
 * (SFT); every source format (shards with and without a .mask file, packed
 * shards, JSONL text and prompt/completion, plain text); the errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "tokenizer/shard.h"
#include "trainer/lm_data.h"

/* Collates every row of d (one batch) into bb. */
static void collate_all(const rf_dataset *d, rf_batch_buf *bb) {
    size_t idx[64];
    assert_true(d->n <= 64);
    for (size_t i = 0; i < d->n; i++)
        idx[i] = i;
    assert_int_equal(rf_batch_collate(bb, d, idx, (int)d->n), 0);
}

static void expect_row(const rf_batch_buf *bb, int r, const int32_t *ids, const int32_t *labels,
                       const int32_t *pos, const int32_t *seg, int len) {
    for (int t = 0; t < bb->T; t++) {
        size_t o = (size_t)r * bb->T + t;
        if (t >= len) {
            assert_int_equal(bb->valid[o], 0);
            assert_int_equal(bb->labels[o], -100);
            continue;
        }
        assert_int_equal(bb->valid[o], 1);
        assert_int_equal(bb->ids[o], ids[t]);
        assert_int_equal(bb->labels[o], labels[t]);
        assert_int_equal(bb->pos[o], pos[t]);
        assert_int_equal(bb->seg[o], seg[t]);
    }
}

/* The labels the causal loss counts (t >= 1, label >= 0) equal rf_lm_row_targets. */
static void check_targets(const rf_dataset *d, const rf_batch_buf *bb) {
    for (size_t r = 0; r < d->n; r++) {
        uint32_t c = 0;
        for (int t = 1; t < bb->T; t++)
            c += bb->labels[r * bb->T + t] >= 0;
        assert_int_equal(c, rf_lm_row_targets(d, r));
    }
}

static void test_pack(void **state) {
    (void)state;
    rf_dataset d = {0};
    rf_lm_packer *p;
    assert_int_equal(rf_lm_packer_new(&d, 4, 9, &p), 0);
    uint32_t a[] = {1, 2, 3}, b[] = {4, 5}, c[] = {6, 7, 8, 10, 11, 12}, e[] = {13, 9};
    uint8_t cm[] = {0, 0, 1, 1, 1, 0}; /* a prompt, a response, a last token not a target */
    assert_int_equal(rf_lm_packer_add(p, a, NULL, 3), 0);
    assert_int_equal(rf_lm_packer_add(p, b, NULL, 2), 0);
    assert_int_equal(rf_lm_packer_add(p, c, cm, 6), 0);
    assert_int_equal(rf_lm_packer_add(p, e, NULL, 2), 0); /* ends with EOS already */
    assert_int_equal(rf_lm_packer_add(p, e, NULL, 0), 0); /* empty: nothing */
    assert_int_equal(rf_lm_packer_finish(p), 0);
    /* stream: 1 2 3 9 | 4 5 9 6 | 7 8 10 11 | 12 9 13 9 */
    assert_int_equal(d.n, 4);
    rf_batch_buf bb = {0};
    collate_all(&d, &bb);
    assert_int_equal(bb.T, 4);
    expect_row(&bb, 0, (int32_t[]){1, 2, 3, 9}, (int32_t[]){1, 2, 3, 9}, (int32_t[]){0, 1, 2, 3},
               (int32_t[]){0, 0, 0, 0}, 4);
    /* b at position 0 of a row; c starts at t = 3: its first token is not
     * predicted from b's EOS, its position and segment restart */
    expect_row(&bb, 1, (int32_t[]){4, 5, 9, 6}, (int32_t[]){4, 5, 9, -100}, (int32_t[]){0, 1, 2, 0},
               (int32_t[]){0, 0, 0, 1}, 4);
    /* c continues: 7 is a prompt token (mask 0), 8 10 11 targets */
    expect_row(&bb, 2, (int32_t[]){7, 8, 10, 11}, (int32_t[]){-100, 8, 10, 11},
               (int32_t[]){0, 1, 2, 3}, (int32_t[]){0, 0, 0, 0}, 4);
    /* c's last token (mask 0) and so its EOS are no targets; e keeps its own EOS */
    expect_row(&bb, 3, (int32_t[]){12, 9, 13, 9}, (int32_t[]){-100, -100, -100, 9},
               (int32_t[]){0, 1, 0, 1}, (int32_t[]){0, 0, 1, 1}, 4);
    check_targets(&d, &bb);
    /* a short last row is padded */
    rf_dataset d2 = {0};
    assert_int_equal(rf_lm_packer_new(&d2, 8, 9, &p), 0);
    assert_int_equal(rf_lm_packer_add(p, a, NULL, 3), 0);
    assert_int_equal(rf_lm_packer_finish(p), 0);
    assert_int_equal(d2.n, 1);
    assert_int_equal(d2.len[0], 4);
    /* classifier sequences and rows do not mix */
    uint32_t x[] = {1};
    rf_dataset d3 = {0};
    assert_int_equal(rf_dataset_add(&d3, x, 1, 0), 0);
    assert_int_equal(rf_dataset_add_row(&d3, x, (uint8_t[]){1}, 1), RF_ERR_INVALID);
    assert_int_equal(rf_lm_data_load(&d3, "unused", "unused", 8, 9, NULL, NULL), RF_ERR_INVALID);
    /* no EOS id */
    assert_int_equal(rf_lm_packer_new(&d2, 8, -1, &p), 0);
    assert_int_equal(rf_lm_packer_add(p, a, NULL, 3), RF_ERR_INVALID);
    rf_lm_packer_free(p);
    rf_batch_buf_free(&bb);
    rf_dataset_free(&d);
    rf_dataset_free(&d2);
    rf_dataset_free(&d3);
}

static char tmpdir[] = "/tmp/test_lm_data_XXXXXX";

static void write_shard(const char *prefix, bool packed, uint32_t block, int eos,
                        const uint32_t *const *docs, const uint32_t *lens, int n) {
    rf_shard_info info = {.flags = packed ? RF_SHARD_PACKED : 0,
                          .vocab_size = 100,
                          .eos_id = eos,
                          .pad_id = -1,
                          .block_len = packed ? block : 0};
    rf_shard_writer *w;
    assert_int_equal(rf_shard_writer_open(prefix, &info, &w), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(rf_shard_writer_add(w, docs[i], lens[i], -1, 0), 0);
    assert_int_equal(rf_shard_writer_close(w), 0);
}

static void write_file(const char *path, const void *data, size_t len) {
    assert_int_equal(rf_write_file_atomic(path, data, len), 0);
}

static void test_shards(void **state) {
    (void)state;
    char prefix[256], path[300];
    /* documents, the header's EOS 9, and a loss mask */
    snprintf(prefix, sizeof prefix, "%s/docs", tmpdir);
    const uint32_t a[] = {1, 2, 3}, b[] = {4, 5, 6, 7};
    const uint32_t *docs[] = {a, b};
    write_shard(prefix, false, 0, 9, docs, (uint32_t[]){3, 4}, 2);
    rf_dataset d = {0};
    assert_int_equal(rf_lm_data_load(&d, prefix, "unused", 16, -1, NULL, NULL), 0);
    rf_batch_buf bb = {0};
    collate_all(&d, &bb);
    assert_int_equal(d.n, 1);
    expect_row(&bb, 0, (int32_t[]){1, 2, 3, 9, 4, 5, 6, 7, 9},
               (int32_t[]){1, 2, 3, 9, -100, 5, 6, 7, 9}, (int32_t[]){0, 1, 2, 3, 0, 1, 2, 3, 4},
               (int32_t[]){0, 0, 0, 0, 1, 1, 1, 1, 1}, 9);
    rf_dataset_free(&d);
    snprintf(path, sizeof path, "%s.mask", prefix);
    write_file(path, (uint8_t[]){1, 1, 1, 0, 0, 1, 1}, 7); /* b: a 2-token prompt */
    assert_int_equal(rf_lm_data_load(&d, prefix, "unused", 16, -1, NULL, NULL), 0);
    collate_all(&d, &bb);
    expect_row(&bb, 0, (int32_t[]){1, 2, 3, 9, 4, 5, 6, 7, 9},
               (int32_t[]){1, 2, 3, 9, -100, -100, 6, 7, 9}, (int32_t[]){0, 1, 2, 3, 0, 1, 2, 3, 4},
               (int32_t[]){0, 0, 0, 0, 1, 1, 1, 1, 1}, 9);
    check_targets(&d, &bb);
    rf_dataset_free(&d);
    write_file(path, (uint8_t[]){1, 1, 1, 0, 2, 1, 1}, 7);
    assert_int_equal(rf_lm_data_load(&d, prefix, "unused", 16, -1, NULL, NULL), RF_ERR_CORRUPT);
    rf_dataset_free(&d);
    write_file(path, (uint8_t[]){1, 1, 1}, 3);
    assert_int_equal(rf_lm_data_load(&d, prefix, "unused", 16, -1, NULL, NULL), RF_ERR_CORRUPT);
    rf_dataset_free(&d);
    unlink(path);
    /* no EOS in the header: the model's; none at all: an error */
    snprintf(prefix, sizeof prefix, "%s/noeos", tmpdir);
    write_shard(prefix, false, 0, -1, docs, (uint32_t[]){3, 4}, 2);
    assert_int_equal(rf_lm_data_load(&d, prefix, "unused", 16, 0, NULL, NULL), 0);
    assert_int_equal(d.ntokens, 9);
    assert_int_equal(d.tokens[3], 0);
    rf_dataset_free(&d);
    assert_int_equal(rf_lm_data_load(&d, prefix, "unused", 16, -1, NULL, NULL), RF_ERR_INVALID);
    rf_dataset_free(&d);
    /* packed rows (the tokenizer stage's pack: true) are used as they are */
    snprintf(prefix, sizeof prefix, "%s/packed", tmpdir);
    const uint32_t r0[] = {1, 2, 9, 4, 5}, r1[] = {6, 9, 7, 8, 9};
    const uint32_t *rows[] = {r0, r1};
    write_shard(prefix, true, 5, 9, rows, (uint32_t[]){5, 5}, 2);
    assert_int_equal(rf_lm_data_load(&d, prefix, "unused", 8, -1, NULL, NULL), 0);
    assert_int_equal(d.n, 2);
    collate_all(&d, &bb);
    expect_row(&bb, 0, (int32_t[]){1, 2, 9, 4, 5}, (int32_t[]){1, 2, 9, -100, 5},
               (int32_t[]){0, 1, 2, 0, 1}, (int32_t[]){0, 0, 0, 1, 1}, 5);
    expect_row(&bb, 1, (int32_t[]){6, 9, 7, 8, 9}, (int32_t[]){6, 9, -100, 8, 9},
               (int32_t[]){0, 1, 0, 1, 2}, (int32_t[]){0, 0, 1, 1, 1}, 5);
    rf_dataset_free(&d);
    assert_int_equal(rf_lm_data_load(&d, prefix, "unused", 4, -1, NULL, NULL), RF_ERR_INVALID);
    rf_dataset_free(&d);
    /* a directory: its shards in name order */
    assert_int_equal(rf_lm_data_load(&d, tmpdir, "unused", 16, 0, NULL, NULL), 0);
    assert_true(d.n >= 3);
    rf_dataset_free(&d);
    rf_batch_buf_free(&bb);
}

static void test_text(void **state) {
    (void)state;
    char model[256], path[300];
    snprintf(model, sizeof model, "%s/model", tmpdir);
    assert_int_equal(rf_mkdir_p(model), 0);
    snprintf(path, sizeof path, "%s/vocab.txt", model);
    const char vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\nworld\nq\na\n[MASK]\n";
    write_file(path, vocab, sizeof vocab - 1);
    snprintf(path, sizeof path, "%s/d.jsonl", tmpdir);
    const char jl[] = "{\"text\":\"hello world\"}\n"
                      "not json\n"
                      "{\"prompt\":\"q hello\",\"completion\":\"a\"}\n"
                      "{\"id\":\"no text\"}\n"
                      "{\"text\":\"\"}\n";
    write_file(path, jl, sizeof jl - 1);
    rf_dataset d = {0};
    if (rf_lm_data_load(&d, path, model, 32, 0, NULL, NULL)) fail_msg("%s", rf_errmsg());
    assert_int_equal(d.skipped, 3);
    rf_batch_buf bb = {0};
    collate_all(&d, &bb);
    /* hello world [EOS 0] | q hello (prompt) a [EOS] */
    expect_row(&bb, 0, (int32_t[]){4, 5, 0, 6, 4, 7, 0}, (int32_t[]){4, 5, 0, -100, -100, 7, 0},
               (int32_t[]){0, 1, 2, 0, 1, 2, 3}, (int32_t[]){0, 0, 0, 1, 1, 1, 1}, 7);
    rf_dataset_free(&d);
    snprintf(path, sizeof path, "%s/d.txt", tmpdir);
    const char txt[] = "hello world\r\n\r\nworld\n";
    write_file(path, txt, sizeof txt - 1);
    assert_int_equal(rf_lm_data_load(&d, path, model, 32, 0, NULL, NULL), 0);
    collate_all(&d, &bb);
    expect_row(&bb, 0, (int32_t[]){4, 5, 0, 5, 0}, (int32_t[]){4, 5, 0, -100, 0},
               (int32_t[]){0, 1, 2, 0, 1}, (int32_t[]){0, 0, 0, 1, 1}, 5);
    rf_dataset_free(&d);
    /* text needs the model's EOS */
    assert_int_equal(rf_lm_data_load(&d, path, model, 32, -1, NULL, NULL), RF_ERR_INVALID);
    rf_dataset_free(&d);
    rf_batch_buf_free(&bb);
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
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_text),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
