/* Token shards: round trip, and every corruption check of the reader. */
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
#include "tokenizer/shard.h"

static char dir[] = "/tmp/rf_shard_testXXXXXX";
static char prefix[256];

static void write_sample(uint32_t flags, uint32_t block) {
    rf_shard_info info = {
        .flags = flags, .vocab_size = 100, .eos_id = 7, .pad_id = -1, .block_len = block};
    rf_shard_writer *w;
    assert_int_equal(rf_shard_writer_open(prefix, &info, &w), 0);
    uint32_t a[] = {1, 2, 3, 4}, b[] = {99, 0, 5, 6};
    assert_int_equal(rf_shard_writer_add(w, a, 4, 1, 42), 0);
    assert_int_equal(rf_shard_writer_add(w, b, 4, -1, 0xFFFFFFFFFFFFull), 0);
    uint32_t bad[] = {100, 1, 2, 3};
    assert_int_equal(rf_shard_writer_add(w, bad, 4, 0, 0), RF_ERR_RANGE);
    if (!flags) assert_int_equal(rf_shard_writer_add(w, a, 0, 0, 9), 0);
    assert_int_equal(rf_shard_writer_close(w), 0);
}

static void test_round_trip(void **state) {
    write_sample(0, 0);
    rf_shard *s;
    assert_int_equal(rf_shard_open(prefix, &s), 0);
    const rf_shard_info *in = rf_shard_get_info(s);
    assert_int_equal(in->n_seqs, 3);
    assert_int_equal(in->n_tokens, 8);
    assert_int_equal(in->eos_id, 7);
    assert_int_equal(in->pad_id, -1);
    rf_shard_seq q;
    assert_int_equal(rf_shard_get(s, 1, &q), 0);
    assert_int_equal(q.len, 4);
    assert_int_equal(q.ids[0], 99);
    assert_int_equal(q.label, -1);
    assert_true(q.cluster == 0xFFFFFFFFFFFFull);
    assert_int_equal(rf_shard_get(s, 2, &q), 0);
    assert_int_equal(q.len, 0);
    assert_int_equal(rf_shard_get(s, 3, &q), RF_ERR_RANGE);
    rf_shard_close(s);
}

static void test_packed_length_enforced(void **state) {
    rf_shard_info info = {.flags = RF_SHARD_PACKED, .vocab_size = 10, .block_len = 2};
    rf_shard_writer *w;
    assert_int_equal(rf_shard_writer_open(prefix, &info, &w), 0);
    uint32_t a[] = {1, 2, 3};
    assert_int_equal(rf_shard_writer_add(w, a, 3, 0, 0), RF_ERR_RANGE);
    assert_int_equal(rf_shard_writer_add(w, a, 2, 0, 0), 0);
    assert_int_equal(rf_shard_writer_close(w), 0);
    rf_shard *s;
    assert_int_equal(rf_shard_open(prefix, &s), 0);
    assert_int_equal(rf_shard_get_info(s)->block_len, 2);
    rf_shard_close(s);
}

static void patch(const char *ext, long off, const void *bytes, size_t n) {
    char p[300];
    snprintf(p, sizeof p, "%s%s", prefix, ext);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, off, SEEK_SET);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

static void expect_corrupt(const char *needle) {
    rf_shard *s = NULL;
    assert_int_equal(rf_shard_open(prefix, &s), RF_ERR_CORRUPT);
    assert_null(s);
    if (!strstr(rf_errmsg(), needle)) fail_msg("message '%s' lacks '%s'", rf_errmsg(), needle);
}

static void test_corruption_detected(void **state) {
    char p[300];
    write_sample(0, 0);
    patch(".idx", 0, "X", 1);
    expect_corrupt("magic");
    write_sample(0, 0);
    patch(".idx", 64 + 8, "\x05", 1); /* first record's length */
    expect_corrupt("checksum");
    write_sample(0, 0);
    uint32_t big = 500;
    patch(".bin", 4, &big, 4);
    expect_corrupt("out of vocabulary");
    write_sample(0, 0);
    snprintf(p, sizeof p, "%s.bin", prefix);
    assert_int_equal(truncate(p, 12), 0);
    expect_corrupt(".bin size");
    write_sample(0, 0);
    snprintf(p, sizeof p, "%s.idx", prefix);
    assert_int_equal(truncate(p, 64 + 24), 0);
    expect_corrupt("index size");
    assert_int_equal(truncate(p, 10), 0);
    expect_corrupt("magic");
    unlink(p);
    rf_shard *s;
    assert_int_equal(rf_shard_open(prefix, &s), RF_ERR_NOT_FOUND);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    snprintf(prefix, sizeof prefix, "%s/train", dir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_packed_length_enforced),
        cmocka_unit_test(test_corruption_detected),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char p[300];
    snprintf(p, sizeof p, "%s.bin", prefix);
    unlink(p);
    snprintf(p, sizeof p, "%s.idx", prefix);
    unlink(p);
    rmdir(dir);
    return rc;
}
