/* Batching: partition balance, bucketed padding, packing, the split. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/hash.h"
#include "tokenizer/batch.h"

/* Lengths shaped like real sentences: many short, a long tail. */
static uint32_t *sample_lens(size_t n) {
    uint32_t *l = malloc(n * sizeof *l);
    uint64_t s = 7;
    for (size_t i = 0; i < n; i++) {
        s = rf_mix64(s);
        l[i] = 3 + (uint32_t)(s % 20) + ((s >> 20) % 10 == 0 ? (uint32_t)(s >> 40) % 100 : 0);
    }
    return l;
}

static void test_partition(void **state) {
    size_t n = 5000;
    uint32_t *lens = sample_lens(n), *assign = malloc(n * sizeof *assign);
    rf_partition_report r;
    assert_int_equal(rf_partition_balanced(lens, n, 4, assign, &r), 0);
    uint64_t load[4] = {0}, total = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(assign[i] < 4);
        load[assign[i]] += lens[i];
        total += lens[i];
    }
    uint64_t max = 0;
    for (int p = 0; p < 4; p++)
        max = load[p] > max ? load[p] : max;
    assert_int_equal(max, r.max_tokens);
    assert_true(r.imbalance >= 1.0 && r.imbalance < 1.001); /* LPT on many items */
    assert_true(r.mean_tokens * 4 == (double)total);
    /* a single giant sequence bounds the balance: reported, not hidden */
    uint32_t skew[] = {100, 1, 1, 1};
    assert_int_equal(rf_partition_balanced(skew, 4, 2, assign, &r), 0);
    assert_int_equal(r.max_tokens, 100);
    assert_true(r.imbalance > 1.9);
    free(lens);
    free(assign);
}

static void test_bucketed_padding(void **state) {
    size_t n = 20000;
    uint32_t *lens = sample_lens(n);
    rf_batch_plan p;
    assert_int_equal(rf_batch_by_length(lens, NULL, n, 32, 1, &p), 0);
    assert_int_equal(p.n, n);
    assert_int_equal(p.n_batches, (n + 31) / 32);
    /* every index exactly once, each batch within its size */
    char *seen = calloc(n, 1);
    for (size_t i = 0; i < n; i++)
        seen[p.order[i]]++;
    for (size_t i = 0; i < n; i++)
        assert_int_equal(seen[i], 1);
    for (size_t b = 0; b < p.n_batches; b++)
        assert_true(p.batch_start[b + 1] - p.batch_start[b] <= 32);
    double bucketed = rf_padding_fraction(p.real_tokens, p.padded_tokens);
    double naive = rf_padding_fraction(p.real_tokens, rf_padded_fixed(lens, n, 0));
    double stream = rf_padding_fraction(p.real_tokens, rf_padded_stream_batches(lens, n, 32));
    printf("padding: bucketed %.4f, stream batches %.4f, fixed %.4f\n", bucketed, stream, naive);
    assert_true(bucketed < 0.05);
    assert_true(bucketed < stream && stream < naive);
    /* deterministic for a seed, different order for another */
    rf_batch_plan q;
    assert_int_equal(rf_batch_by_length(lens, NULL, n, 32, 1, &q), 0);
    assert_memory_equal(p.order, q.order, n * sizeof *p.order);
    rf_batch_plan_free(&q);
    assert_int_equal(rf_batch_by_length(lens, NULL, n, 32, 2, &q), 0);
    assert_true(memcmp(p.order, q.order, n * sizeof *p.order) != 0);
    assert_true(q.padded_tokens == p.padded_tokens);
    rf_batch_plan_free(&q);
    rf_batch_plan_free(&p);
    free(seen);
    free(lens);
}

typedef struct blocks {
    uint32_t data[64][4];
    int n;
} blocks;

static int collect(void *ctx, const uint32_t *b, uint32_t len) {
    blocks *bl = ctx;
    memcpy(bl->data[bl->n++], b, len * sizeof *b);
    return 0;
}

static void test_packing(void **state) {
    rf_packer p;
    blocks bl = {0};
    assert_int_equal(rf_packer_init(&p, 4, 99), 0);
    uint32_t a[] = {1, 2, 3}, b[] = {4, 5}, c[] = {6, 7, 8, 9, 10};
    assert_int_equal(rf_packer_add(&p, a, 3, collect, &bl), 0);
    assert_int_equal(rf_packer_add(&p, b, 2, collect, &bl), 0);
    assert_int_equal(rf_packer_add(&p, c, 5, collect, &bl), 0);
    /* stream: 1 2 3 E 4 5 E 6 7 8 9 10 E -> three blocks, one token left */
    assert_int_equal(bl.n, 3);
    uint32_t want[3][4] = {{1, 2, 3, 99}, {4, 5, 99, 6}, {7, 8, 9, 10}};
    assert_memory_equal(bl.data, want, sizeof want);
    uint32_t seg[4];
    rf_pack_segments(bl.data[1], 4, 99, seg);
    uint32_t wseg[] = {0, 0, 0, 1};
    assert_memory_equal(seg, wseg, sizeof seg);
    uint32_t left;
    assert_int_equal(rf_packer_finish(&p, true, 0, collect, &bl, &left), 0);
    assert_int_equal(left, 3);
    uint32_t last[4] = {99, 0, 0, 0};
    assert_memory_equal(bl.data[3], last, sizeof last);
    rf_packer_free(&p);
}

static void test_split(void **state) {
    size_t eval = 0, n = 100000;
    for (uint64_t c = 1; c <= n; c++)
        eval += rf_split_is_eval(c, NULL, 0, 0.1, 0);
    assert_true(eval > 9500 && eval < 10500);
    /* same cluster -> same side, whatever the document id */
    for (uint64_t c = 1; c < 1000; c++)
        assert_int_equal(rf_split_is_eval(c, "a", 1, 0.3, 5), rf_split_is_eval(c, "bb", 2, 0.3, 5));
    /* no cluster: the id decides, deterministically */
    assert_int_equal(rf_split_is_eval(0, "doc-17", 6, 0.5, 0),
                     rf_split_is_eval(0, "doc-17", 6, 0.5, 0));
    assert_false(rf_split_is_eval(42, NULL, 0, 0.0, 0));
    assert_true(rf_split_is_eval(42, NULL, 0, 1.0, 0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partition),
        cmocka_unit_test(test_bucketed_padding),
        cmocka_unit_test(test_packing),
        cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
