/* The dedup engine on in-memory documents: exact and near decisions,
 * representatives, independence from the thread count, restart from the index,
 * and clear errors for a corrupt or mismatched index. */
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
#include "common/hash.h"
#include "common/rng.h"
#include "dedup/dedup.h"
#include "dedup/index_log.h"

#define NDOCS 600

static const char *vocab[] = {"the",  "blender", "works",     "great", "and",   "motor", "is",
                              "loud", "but",     "price",     "was",   "fair",  "I",     "would",
                              "buy",  "again",   "filter",    "broke", "after", "two",   "weeks",
                              "of",   "use",     "very",      "happy", "with",  "this",  "dryer",
                              "part", "fits",    "perfectly", "my"};

/* A stream with originals, exact copies (case/punctuation changes) and near
 * copies (one word inserted in a 60-word text). */
static rf_doc *make_stream(size_t n) {
    rf_doc *docs = calloc(n, sizeof *docs);
    rf_rng r;
    rf_rng_seed(&r, 42);
    for (size_t i = 0; i < n; i++) {
        char id[32], text[2048];
        snprintf(id, sizeof id, "doc-%zu", i);
        size_t len = 0;
        if (i >= 10 && i % 5 == 0) { /* exact copy of an earlier doc, shouted */
            const char *src = docs[rf_rng_below(&r, i)].text;
            for (; src[len]; len++)
                text[len] = (char)(src[len] >= 'a' && src[len] <= 'z' ? src[len] - 32 : src[len]);
            text[len++] = '!';
        } else if (i >= 10 && i % 5 == 1) { /* near copy of an original: one word inserted */
            size_t j;
            do
                j = rf_rng_below(&r, i);
            while (j >= 10 && j % 5 < 2);
            const char *src = docs[j].text;
            const char *mid = strchr(src + strlen(src) / 2, ' ');
            size_t head = mid ? (size_t)(mid - src) : strlen(src);
            memcpy(text, src, head);
            len = head + (size_t)snprintf(text + head, sizeof text - head, " q%c%c%c",
                                          (char)('a' + i % 26), (char)('a' + i / 26 % 26),
                                          (char)('a' + i / 676 % 26));
            len += (size_t)snprintf(text + len, sizeof text - len, "%s", src + head);
        } else {
            for (int w = 0; w < 60; w++)
                len += (size_t)snprintf(text + len, sizeof text - len, "%s%s", w ? " " : "",
                                        vocab[rf_rng_below(&r, sizeof vocab / sizeof *vocab)]);
        }
        text[len] = '\0';
        docs[i].id = strdup(id);
        docs[i].text = strdup(text);
        docs[i].text_len = len;
    }
    return docs;
}

static void free_stream(rf_doc *docs, size_t n) {
    for (size_t i = 0; i < n; i++)
        rf_doc_clear(&docs[i]);
    free(docs);
}

static char *tmpdir(void) {
    char tmpl[] = "/tmp/rf_dedup_test_XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static void rmdir_index(char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, RF_DDLOG_FILE);
    unlink(path);
    rmdir(dir);
    free(dir);
}

/* Runs docs[from..to) in batches of `batch` on an open engine. */
static void run(rf_dedup *d, const rf_doc *docs, size_t from, size_t to, size_t batch,
                rf_dd_result *res) {
    for (size_t i = from; i < to; i += batch) {
        size_t n = to - i < batch ? to - i : batch;
        assert_int_equal(rf_dedup_process(d, docs + i, n, res + i), 0);
        assert_int_equal(rf_dedup_commit(d, i + n, 0), 0);
    }
}

static rf_dd_result *full_run(const rf_doc *docs, int threads, size_t batch) {
    rf_dedup_opts o;
    rf_dedup_opts_default(&o);
    o.threads = threads;
    char *dir = tmpdir();
    rf_dedup *d;
    assert_int_equal(rf_dedup_open(&o, dir, &d), 0);
    rf_dd_result *res = calloc(NDOCS, sizeof *res);
    run(d, docs, 0, NDOCS, batch, res);
    rf_dedup_close(d);
    rmdir_index(dir);
    return res;
}

static void assert_same(const rf_dd_result *a, const rf_dd_result *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(a[i].kind, b[i].kind);
        assert_true(a[i].cluster == b[i].cluster);
        if (a[i].kept_id || b[i].kept_id) assert_string_equal(a[i].kept_id, b[i].kept_id);
        assert_true(a[i].jaccard == b[i].jaccard);
    }
}

static void test_decisions(void **state) {
    rf_doc *docs = make_stream(NDOCS);
    rf_dd_result *res = full_run(docs, 1, 64);
    size_t count[3] = {0};
    for (size_t i = 0; i < NDOCS; i++) {
        count[res[i].kind]++;
        if (i >= 10 && i % 5 == 0) assert_int_equal(res[i].kind, RF_DD_EXACT);
        if (i >= 10 && i % 5 == 1) {
            /* One inserted word in 60 keeps Jaccard ~ 0.92 with 5-grams. */
            assert_int_equal(res[i].kind, RF_DD_NEAR);
            assert_true(res[i].verified && res[i].jaccard >= 0.7f);
        }
        if (res[i].kind == RF_DD_KEPT) {
            assert_null(res[i].kept_id);
            char id[32];
            snprintf(id, sizeof id, "doc-%zu", i);
            assert_true(res[i].cluster == rf_hash64(id, strlen(id), 0));
        } else {
            /* The representative is an earlier document, and kept. */
            assert_non_null(res[i].kept_id);
            size_t k = (size_t)atol(res[i].kept_id + 4);
            assert_true(k < i);
            assert_int_equal(res[k].kind, RF_DD_KEPT);
            assert_true(res[i].cluster == res[k].cluster);
        }
    }
    /* Random 60-word texts over 32 words share no 5-gram pattern at 0.7. */
    assert_int_equal(count[RF_DD_KEPT], NDOCS - count[RF_DD_EXACT] - count[RF_DD_NEAR]);
    assert_true(count[RF_DD_EXACT] >= (NDOCS - 10) / 5);
    assert_true(count[RF_DD_NEAR] >= (NDOCS - 10) / 5 - 5);
    rf_dd_results_clear(res, NDOCS);
    free(res);
    free_stream(docs, NDOCS);
}

static void test_threads_and_batches_do_not_matter(void **state) {
    rf_doc *docs = make_stream(NDOCS);
    rf_dd_result *a = full_run(docs, 1, 64);
    rf_dd_result *b = full_run(docs, 4, 100); /* batches >= 64 use the helper threads */
    rf_dd_result *c = full_run(docs, 3, 7);
    assert_same(a, b, NDOCS);
    assert_same(a, c, NDOCS);
    rf_dd_results_clear(c, NDOCS);
    free(c);
    rf_dd_results_clear(a, NDOCS);
    rf_dd_results_clear(b, NDOCS);
    free(a);
    free(b);
    free_stream(docs, NDOCS);
}

static void test_restart_continues(void **state) {
    rf_doc *docs = make_stream(NDOCS);
    rf_dd_result *ref = full_run(docs, 1, 50);
    rf_dedup_opts o;
    rf_dedup_opts_default(&o);
    char *dir = tmpdir();
    rf_dedup *d;
    rf_dd_result *res = calloc(NDOCS, sizeof *res);
    /* First process: commits 200 documents, then decides 50 more that are lost. */
    assert_int_equal(rf_dedup_open(&o, dir, &d), 0);
    run(d, docs, 0, 200, 50, res);
    assert_int_equal(rf_dedup_process(d, docs + 200, 50, res + 200), 0);
    rf_dedup_close(d);
    rf_dd_results_clear(res, NDOCS);
    /* Second process: replays the committed 200, decides the rest. */
    assert_int_equal(rf_dedup_open(&o, dir, &d), 0);
    assert_int_equal(rf_dedup_committed(d), 200);
    uint64_t kept_bytes, dups_bytes;
    rf_dedup_out_sizes(d, &kept_bytes, &dups_bytes);
    assert_int_equal(kept_bytes, 200);
    run(d, docs, 0, NDOCS, 50, res);
    for (size_t i = 0; i < NDOCS; i++)
        assert_int_equal(res[i].replayed, i < 200);
    assert_same(ref, res, NDOCS);
    /* Counters are rebuilt from the index too. */
    rf_stats *s = rf_stats_new();
    assert_int_equal(rf_dedup_report(d, s, "dedup."), 0);
    assert_int_equal(rf_stats_get(s, "dedup.docs"), NDOCS);
    assert_int_equal(rf_stats_get(s, "dedup.kept") + rf_stats_get(s, "dedup.exact") +
                         rf_stats_get(s, "dedup.near"),
                     NDOCS);
    assert_int_equal(rf_stats_sum_prefix(s, "dedup.cluster_size."),
                     rf_stats_get(s, "dedup.clusters"));
    rf_stats_free(s);
    rf_dedup_close(d);
    /* A different input on the same index is refused. */
    assert_int_equal(rf_dedup_open(&o, dir, &d), 0);
    assert_int_equal(rf_dedup_process(d, docs + 1, 1, res), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "differs"));
    rf_dedup_close(d);
    /* Other parameters on the same index are refused. */
    o.bands = 10;
    assert_int_equal(rf_dedup_open(&o, dir, &d), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "bands=20"));
    rf_dd_results_clear(res, NDOCS);
    rf_dd_results_clear(ref, NDOCS);
    free(res);
    free(ref);
    rmdir_index(dir);
    free_stream(docs, NDOCS);
}

static void flip_byte(const char *dir, long off) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, RF_DDLOG_FILE);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    if (off < 0) {
        fseek(f, 0, SEEK_END);
        off += ftell(f);
    }
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static void test_corrupt_index(void **state) {
    rf_doc *docs = make_stream(NDOCS);
    rf_dedup_opts o;
    rf_dedup_opts_default(&o);
    rf_dd_result *res = calloc(NDOCS, sizeof *res);
    const long offsets[] = {3, 20, RF_DDLOG_HEADER_SIZE + 2, RF_DDLOG_HEADER_SIZE + 100};
    for (size_t t = 0; t < 4; t++) {
        char *dir = tmpdir();
        rf_dedup *d;
        assert_int_equal(rf_dedup_open(&o, dir, &d), 0);
        run(d, docs, 0, 100, 50, res);
        rf_dedup_close(d);
        rf_dd_results_clear(res, NDOCS);
        flip_byte(dir, offsets[t]);
        assert_int_equal(rf_dedup_open(&o, dir, &d), RF_ERR_CORRUPT);
        assert_non_null(strstr(rf_errmsg(), RF_DDLOG_FILE));
        rmdir_index(dir);
    }
    /* A damaged last record is a torn append: dropped, and redone on restart. */
    char *dir = tmpdir();
    rf_dedup *d;
    assert_int_equal(rf_dedup_open(&o, dir, &d), 0);
    run(d, docs, 0, 100, 50, res);
    rf_dedup_close(d);
    rf_dd_results_clear(res, NDOCS);
    flip_byte(dir, -20);
    assert_int_equal(rf_dedup_open(&o, dir, &d), 0);
    assert_int_equal(rf_dedup_committed(d), 50);
    rf_dedup_close(d);
    rmdir_index(dir);
    free(res);
    free_stream(docs, NDOCS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decisions),
        cmocka_unit_test(test_threads_and_batches_do_not_matter),
        cmocka_unit_test(test_restart_continues),
        cmocka_unit_test(test_corrupt_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
