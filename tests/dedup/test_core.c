/* Unit tests of the dedup building blocks on in-memory strings: normalization,
 * shingling, MinHash, LSH probabilities, shingle-set Jaccard, hash tables. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/rng.h"
#include "dedup/jaccard.h"
#include "dedup/minhash.h"
#include "dedup/normalize.h"
#include "dedup/shingle.h"
#include "dedup/table.h"

static char *norm(const char *s, unsigned flags) {
    rf_buf b = RF_BUF_INIT;
    assert_int_equal(rf_normalize(s, strlen(s), flags, &b), 0);
    return rf_buf_steal(&b);
}

static void test_normalize(void **state) {
    char *n = norm("  Hello,   WORLD!\tIt's  2024... ", RF_NORM_ALL);
    assert_string_equal(n, "hello world its 0000");
    free(n);
    n = norm("Hello,  World", RF_NORM_CASE);
    assert_string_equal(n, "hello,  world");
    free(n);
    n = norm("Hello,\t World 42", RF_NORM_SPACE | RF_NORM_DIGITS);
    assert_string_equal(n, "Hello, World 00");
    free(n);
    /* Unicode: case folding (ß -> ss, Σ -> σ), punctuation (« » —), spaces (NBSP),
     * digits (Arabic-Indic ٣). */
    n = norm("STRAßE\xc2\xa0\xc2\xab\xce\xa3\xc2\xbb \xe2\x80\x94 \xd9\xa3", RF_NORM_ALL);
    assert_string_equal(n, "strasse \xcf\x83 0");
    free(n);
    /* Invalid UTF-8 becomes U+FFFD, never dropped silently. */
    n = norm("a\xff"
             "b",
             0);
    assert_string_equal(n, "a\xef\xbf\xbd"
                           "b");
    free(n);
    n = norm("", RF_NORM_ALL);
    assert_string_equal(n, "");
    free(n);
}

static void test_norm_parse(void **state) {
    unsigned f;
    char buf[64];
    assert_int_equal(rf_norm_parse("case,digits", &f), 0);
    assert_int_equal(f, RF_NORM_CASE | RF_NORM_DIGITS);
    rf_norm_format(f, buf, sizeof buf);
    assert_string_equal(buf, "case,digits");
    assert_int_equal(rf_norm_parse("none", &f), 0);
    assert_int_equal(f, 0);
    assert_int_equal(rf_norm_parse("all", &f), 0);
    assert_int_equal(f, RF_NORM_ALL);
    assert_int_equal(rf_norm_parse("case,bogus", &f), RF_ERR_INVALID);
}

static size_t shingles(const char *s, int n, bool ch, rf_u64vec *v) {
    assert_int_equal(rf_shingle(s, strlen(s), n, ch, v), 0);
    return v->n;
}

static void test_shingles(void **state) {
    rf_u64vec a = {0}, b = {0};
    assert_int_equal(shingles("a b c d e f g", 5, false, &a), 3);
    assert_int_equal(shingles("a  b c d e f g ", 5, false, &b), 3); /* spacing does not matter */
    assert_memory_equal(a.v, b.v, 3 * sizeof *a.v);
    assert_int_equal(shingles("b a c d e f g", 5, false, &b), 3); /* order does */
    assert_true(a.v[0] != b.v[0]);
    assert_true(a.v[1] != b.v[1]);
    assert_true(a.v[2] == b.v[2]);
    assert_int_equal(shingles("only three words", 5, false, &a), 1);
    assert_int_equal(shingles("   ", 5, false, &a), 0);
    assert_int_equal(shingles("", 5, false, &a), 0);
    /* Character n-grams count code points, not bytes. */
    assert_int_equal(shingles("h\xc3\xa9llo", 3, true, &a), 3);
    assert_int_equal(shingles("ab", 3, true, &a), 1);
    assert_int_equal(rf_shingle("x", 1, 0, false, &a), RF_ERR_INVALID);
    rf_u64vec_free(&a);
    rf_u64vec_free(&b);
}

/* Two sets with a known Jaccard: shared values plus disjoint values. */
static void make_pair(rf_rng *r, int shared, int only, rf_u64vec *a, rf_u64vec *b) {
    a->n = b->n = 0;
    for (int i = 0; i < shared + only; i++) {
        uint64_t x = rf_rng_next(r), y = rf_rng_next(r);
        if (a->n == a->cap) {
            a->cap = a->cap ? 2 * a->cap : 256;
            a->v = realloc(a->v, a->cap * 8);
            b->v = realloc(b->v, a->cap * 8);
        }
        a->v[a->n++] = x;
        b->v[b->n++] = i < shared ? x : y;
    }
}

static void test_minhash_estimates_jaccard(void **state) {
    rf_minhash mh;
    assert_int_equal(rf_minhash_init(&mh, 64, 16, 7), 0); /* 1024 permutations */
    rf_rng r;
    rf_rng_seed(&r, 1);
    rf_u64vec a = {0}, b = {0};
    uint32_t sa[1024], sb[1024];
    const double targets[] = {0.1, 0.3, 0.5, 0.7, 0.9};
    for (size_t t = 0; t < 5; t++) {
        /* shared / (shared + 2*only) = J */
        int shared = 400, only = (int)lround(shared * (1 - targets[t]) / (2 * targets[t]));
        make_pair(&r, shared, only, &a, &b);
        rf_minhash_sign(&mh, a.v, a.n, sa);
        rf_minhash_sign(&mh, b.v, b.n, sb);
        int eq = 0;
        for (int i = 0; i < 1024; i++)
            eq += sa[i] == sb[i];
        double est = eq / 1024.0, truth = shared / (double)(shared + 2 * only);
        double sd = sqrt(truth * (1 - truth) / 1024);
        assert_true(fabs(est - truth) < 4 * sd + 0.005);
    }
    /* Order and repetition of shingles do not change the signature. */
    make_pair(&r, 50, 0, &a, &b);
    rf_minhash_sign(&mh, a.v, a.n, sa);
    for (size_t i = 0; i < b.n / 2; i++) {
        uint64_t t = b.v[i];
        b.v[i] = b.v[b.n - 1 - i];
        b.v[b.n - 1 - i] = t;
    }
    b.v[0] = b.v[1];
    b.v[b.n++] = b.v[2];
    b.v[0] = a.v[b.n - 2]; /* restore the lost element */
    rf_minhash_sign(&mh, b.v, b.n, sb);
    assert_memory_equal(sa, sb, sizeof sa);
    uint64_t ka[64], kb[64];
    rf_minhash_band_keys(&mh, sa, ka);
    rf_minhash_band_keys(&mh, sb, kb);
    assert_memory_equal(ka, kb, sizeof ka);
    for (int i = 0; i < 64; i++)
        assert_true(ka[i] != 0);
    rf_u64vec_free(&a);
    rf_u64vec_free(&b);
    rf_minhash_free(&mh);
    assert_int_equal(rf_minhash_init(&mh, 0, 5, 1), RF_ERR_INVALID);
}

/* The vectorized path computes exactly what the portable loop does, for
 * permutation counts that are and are not multiples of the vector width. */
static void test_minhash_simd_matches_scalar(void **state) {
    const int shapes[][2] = {{20, 5}, {14, 8}, {3, 3}, {1, 1}};
    rf_rng r;
    rf_rng_seed(&r, 11);
    uint64_t sh[300];
    for (int i = 0; i < 300; i++)
        sh[i] = rf_rng_next(&r);
    for (size_t s = 0; s < 4; s++) {
        rf_minhash mh;
        assert_int_equal(rf_minhash_init(&mh, shapes[s][0], shapes[s][1], 99), 0);
        uint32_t a[128], b[128];
        for (size_t n = 0; n <= 300; n += 60) {
            rf_minhash_sign(&mh, sh, n, a);
            rf_minhash_sign_scalar(&mh, sh, n, b);
            assert_memory_equal(a, b, sizeof(uint32_t) * (size_t)mh.nperm);
        }
        rf_minhash_free(&mh);
    }
}

static void test_lsh_curve(void **state) {
    assert_true(fabs(rf_lsh_prob(0.7, 20, 5) - (1 - pow(1 - pow(0.7, 5), 20))) < 1e-12);
    assert_true(rf_lsh_prob(0, 20, 5) == 0);
    assert_true(rf_lsh_prob(1, 20, 5) == 1);
    double t = rf_lsh_threshold(14, 8);
    assert_true(fabs(rf_lsh_prob(t, 14, 8) - 0.5) < 1e-9);
    assert_true(t > 0.68 && t < 0.69); /* datatrove's 14x8: P = 1/2 at J = 0.685 */
}

static void test_shset_jaccard(void **state) {
    uint32_t a[] = {5, 1, 3, 3, 9, 7}, b[] = {3, 5, 11, 13};
    size_t na = rf_shset_build(a, 6), nb = rf_shset_build(b, 4);
    assert_int_equal(na, 5);
    bool exact;
    double j = rf_shset_jaccard((rf_shset){a, 5, 5}, (rf_shset){b, 4, 4}, &exact);
    assert_true(exact);
    assert_true(fabs(j - 2.0 / 7.0) < 1e-12); /* {3,5} of {1,3,5,7,9,11,13} */
    /* Bottom-k estimate on large sets with J = 1/3, truncated at 1024. */
    rf_rng r;
    rf_rng_seed(&r, 3);
    size_t n = 20000;
    uint32_t *x = malloc(n * 4), *y = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)rf_rng_next(&r);
        x[i] = v;
        y[i] = i < n / 2 ? v : (uint32_t)rf_rng_next(&r);
    }
    size_t nx = rf_shset_build(x, n), ny = rf_shset_build(y, n);
    j = rf_shset_jaccard((rf_shset){x, 1024, (uint32_t)nx}, (rf_shset){y, 1024, (uint32_t)ny},
                         &exact);
    assert_false(exact);
    assert_true(fabs(j - 1.0 / 3.0) < 0.06);
    free(x);
    free(y);
    (void)nb;
}

static void test_tables(void **state) {
    rf_band_table bt = {0};
    rf_exact_table et = {0};
    for (uint32_t i = 0; i < 50000; i++) {
        assert_int_equal(rf_band_table_put_new(&bt, rf_mix64(i) | 1, i), 0);
        assert_int_equal(rf_exact_table_put_new(&et, (rf_hash128){rf_mix64(i), i}, i), 0);
    }
    assert_int_equal(rf_band_table_put_new(&bt, rf_mix64(7) | 1, 99), 0); /* first wins */
    for (uint32_t i = 0; i < 50000; i++) {
        assert_int_equal(rf_band_table_get(&bt, rf_mix64(i) | 1), i);
        assert_int_equal(rf_exact_table_get(&et, (rf_hash128){rf_mix64(i), i}), i);
    }
    assert_int_equal(rf_exact_table_get(&et, (rf_hash128){rf_mix64(3), 4}), RF_TABLE_MISSING);
    assert_int_equal(rf_exact_table_put_new(&et, (rf_hash128){0, 0}, 5), 0);
    assert_int_equal(rf_exact_table_get(&et, (rf_hash128){0, 0}), 5);
    assert_int_equal(rf_band_table_put_new(&bt, 0, 1), RF_ERR_INTERNAL);
    rf_band_table_free(&bt);
    rf_exact_table_free(&et);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normalize),
        cmocka_unit_test(test_norm_parse),
        cmocka_unit_test(test_shingles),
        cmocka_unit_test(test_minhash_estimates_jaccard),
        cmocka_unit_test(test_minhash_simd_matches_scalar),
        cmocka_unit_test(test_lsh_curve),
        cmocka_unit_test(test_shset_jaccard),
        cmocka_unit_test(test_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
