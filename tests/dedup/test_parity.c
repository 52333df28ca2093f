/* Parity with datasketch on committed pairs (tests/fixtures/dedup/minhash_pairs.json,
 * made by scripts/parity/dedup_minhash_fixture.py): refinery's shingling gives
 * exactly the Python word-5-gram Jaccard, and its 100-permutation MinHash
 * estimates are unbiased and as accurate as datasketch's on the same pairs. */
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
#include "common/json.h"
#include "common/sys.h"
#include "dedup/minhash.h"
#include "dedup/normalize.h"
#include "dedup/shingle.h"

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

/* Sorted distinct shingle hashes of text in *v. */
static void shingle_set(const char *text, size_t len, rf_buf *norm, rf_u64vec *v) {
    /* The fixture tokens carry digits ("t042"), so digits stay as they are. */
    assert_int_equal(rf_normalize(text, len, RF_NORM_CASE | RF_NORM_PUNCT | RF_NORM_SPACE, norm),
                     0);
    assert_int_equal(rf_shingle(norm->data, norm->len, 5, false, v), 0);
    qsort(v->v, v->n, sizeof *v->v, cmp_u64);
    size_t m = 0;
    for (size_t i = 0; i < v->n; i++)
        if (!m || v->v[i] != v->v[m - 1]) v->v[m++] = v->v[i];
    v->n = m;
}

static double exact_jaccard(const rf_u64vec *a, const rf_u64vec *b) {
    size_t i = 0, j = 0, both = 0;
    while (i < a->n && j < b->n) {
        if (a->v[i] < b->v[j])
            i++;
        else if (b->v[j] < a->v[i])
            j++;
        else
            i++, j++, both++;
    }
    return (double)both / (double)(a->n + b->n - both);
}

static void test_matches_datasketch(void **state) {
    const char *root = getenv("REFINERY_ROOT");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/dedup/minhash_pairs.json", root ? root : ".");
    char *text;
    size_t len;
    assert_int_equal(rf_read_file(path, 8u << 20, &text, &len), 0);
    rf_json_doc *jd = rf_json_doc_new();
    const rf_json *fix;
    assert_int_equal(rf_json_parse(jd, text, len, &fix), 0);
    const rf_json *pairs = rf_json_get(fix, "pairs");
    assert_non_null(pairs);
    assert_true(pairs->len >= 200);

    rf_minhash mh;
    assert_int_equal(rf_minhash_init(&mh, 20, 5, 0x5eedd0d0ull), 0);
    rf_buf norm = RF_BUF_INIT;
    rf_u64vec a = {0}, b = {0};
    uint32_t sa[100], sb[100];
    double ours_abs = 0, ours_signed = 0, ref_abs = 0;
    for (size_t p = 0; p < pairs->len; p++) {
        const rf_json *pr = &pairs->u.items[p];
        const rf_json *ta = rf_json_get(pr, "a"), *tb = rf_json_get(pr, "b");
        double truth = rf_json_get(pr, "jaccard")->num, ref = rf_json_get(pr, "datasketch")->num;
        shingle_set(ta->u.str, ta->len, &norm, &a);
        shingle_set(tb->u.str, tb->len, &norm, &b);
        /* Same shingles as Python's string 5-grams: the exact Jaccard agrees. */
        assert_true(fabs(exact_jaccard(&a, &b) - truth) < 1e-12);
        rf_minhash_sign(&mh, a.v, a.n, sa);
        rf_minhash_sign(&mh, b.v, b.n, sb);
        int eq = 0;
        for (int i = 0; i < 100; i++)
            eq += sa[i] == sb[i];
        double est = eq / 100.0;
        ours_abs += fabs(est - truth);
        ours_signed += est - truth;
        ref_abs += fabs(ref - truth);
    }
    double n = (double)pairs->len;
    printf("mean |error| refinery %.4f datasketch %.4f, mean error refinery %+.4f over %zu pairs\n",
           ours_abs / n, ref_abs / n, ours_signed / n, pairs->len);
    assert_true(ours_abs / n <= 1.25 * ref_abs / n + 0.005);
    assert_true(fabs(ours_signed / n) < 0.01);
    rf_u64vec_free(&a);
    rf_u64vec_free(&b);
    rf_buf_free(&norm);
    rf_minhash_free(&mh);
    rf_json_doc_free(jd);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matches_datasketch)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
