/* The intake file shared by the trainer and evaluator services: round trip in
 * (seq, position) order, the first record of a seq winning, max_len
 * truncation, a torn tail (ignored when loading, cut off when reopening),
 * corruption in the middle, a record of another run. */
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
#include "refinery.pb-c.h"
#include "runtime/intake.h"

/* A batch of n sequences; sequence i has label base+i and i+1 ids base*100+j. */
typedef struct tbatch {
    Refinery__V1__TokenBatch b;
    Refinery__V1__TokenSequence seqs[4], *ptrs[4];
    uint32_t ids[4][8];
} tbatch;

static void make_batch(tbatch *t, const char *run, uint64_t seq, int base, size_t n) {
    refinery__v1__token_batch__init(&t->b);
    t->b.run_id = (char *)run;
    t->b.seq = seq;
    t->b.seqs = t->ptrs;
    t->b.n_seqs = n;
    for (size_t i = 0; i < n; i++) {
        refinery__v1__token_sequence__init(&t->seqs[i]);
        t->seqs[i].label = base + (int)i;
        t->seqs[i].n_ids = i + 1;
        t->seqs[i].ids = t->ids[i];
        for (size_t j = 0; j <= i; j++)
            t->ids[i][j] = (uint32_t)(base * 100 + (int)j);
        t->ptrs[i] = &t->seqs[i];
    }
}

static void append(const char *path, const char *run, uint64_t seq, int base, size_t n) {
    tbatch t;
    rf_intake *in;
    make_batch(&t, run, seq, base, n);
    assert_int_equal(rf_intake_open(path, &in), RF_OK);
    assert_int_equal(rf_intake_append(in, &t.b), RF_OK);
    rf_intake_close(in);
}

static off_t file_size(const char *path) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_size;
}

static void test_round_trip(void **state) {
    char dir[] = "/tmp/rf-intake-XXXXXX", path[96];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/sub/run.intake", dir); /* parents are created */
    append(path, "r", 5, 5, 2);
    append(path, "r", 2, 2, 3);
    append(path, "r", 5, 9, 1); /* a replay of seq 5 with other content: ignored */
    append(path, "r", 7, 7, 0); /* an empty batch counts as a batch */

    rf_dataset d = {0};
    rf_intake_info info;
    assert_int_equal(rf_intake_load(path, "r", 0, &d, &info), RF_OK);
    assert_int_equal(info.records, 4);
    assert_int_equal(info.batches, 3);
    assert_int_equal(info.replays, 1);
    assert_int_equal(info.sequences, 5);
    assert_int_equal(info.torn_bytes, 0);
    /* (seq, position): seq 2's three sequences, then seq 5's two. */
    const int32_t labels[] = {2, 3, 4, 5, 6};
    const uint32_t lens[] = {1, 2, 3, 1, 2};
    assert_int_equal(d.n, 5);
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(d.label[i], labels[i]);
        assert_int_equal(d.len[i], lens[i]);
        uint32_t base = i < 3 ? 200 : 500;
        for (uint32_t j = 0; j < d.len[i]; j++)
            assert_int_equal(d.tokens[d.start[i] + j], base + j);
    }
    rf_dataset_free(&d);

    /* max_len 2: the three-id sequence keeps its first and last id. */
    assert_int_equal(rf_intake_load(path, NULL, 2, &d, NULL), RF_OK);
    assert_int_equal(d.len[2], 2);
    assert_int_equal(d.tokens[d.start[2]], 200);
    assert_int_equal(d.tokens[d.start[2] + 1], 202);
    rf_dataset_free(&d);

    /* Every record must be of the run asked for. */
    assert_int_equal(rf_intake_load(path, "other", 0, &d, NULL), RF_ERR_CORRUPT);
    rf_dataset_free(&d);
    snprintf(path, sizeof path, "%s/missing.intake", dir);
    assert_int_equal(rf_intake_load(path, "r", 0, &d, NULL), RF_ERR_NOT_FOUND);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_torn_tail(void **state) {
    char dir[] = "/tmp/rf-intake-XXXXXX", path[96];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/run.intake", dir);
    append(path, "r", 1, 1, 2);
    off_t one = file_size(path);
    append(path, "r", 2, 2, 3);
    off_t two = file_size(path);

    rf_dataset d = {0};
    rf_intake_info info;
    /* Every cut inside the second record: the first one loads, the rest is torn. */
    for (off_t cut = two - 1; cut > one; cut -= 7) {
        assert_int_equal(truncate(path, cut), 0);
        assert_int_equal(rf_intake_load(path, "r", 0, &d, &info), RF_OK);
        assert_int_equal(info.batches, 1);
        assert_int_equal(d.n, 2);
        assert_int_equal(info.torn_bytes, (uint64_t)(cut - one));
        rf_dataset_free(&d);
    }
    /* Zeros where a record should be (a crash after the size grew). */
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    for (int i = 0; i < 40; i++)
        fputc(0, f);
    fclose(f);
    assert_int_equal(rf_intake_load(path, "r", 0, &d, &info), RF_OK);
    assert_int_equal(d.n, 2);
    rf_dataset_free(&d);

    /* Reopening cuts the torn tail off, so the next append is loadable. */
    append(path, "r", 3, 3, 1);
    assert_int_equal(rf_intake_load(path, "r", 0, &d, &info), RF_OK);
    assert_int_equal(info.torn_bytes, 0);
    assert_int_equal(info.batches, 2);
    assert_int_equal(d.n, 3);
    assert_int_equal(d.label[2], 3);
    rf_dataset_free(&d);

    /* A flipped byte in a record that is not the last: corrupt, for load and open. */
    f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 20, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 20, SEEK_SET);
    fputc(c ^ 0x55, f);
    fclose(f);
    assert_int_equal(rf_intake_load(path, "r", 0, &d, &info), RF_ERR_CORRUPT);
    rf_dataset_free(&d);
    rf_intake *in;
    assert_int_equal(rf_intake_open(path, &in), RF_ERR_CORRUPT);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_torn_tail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
