/* rf_ingest_buffer (ingest/buffer.h): one in-memory input gives the same
 * batches (documents and rejects) as rf_ingest_run on a file with the same
 * bytes and name; zstd works; corrupt compressed data fails; the callback's
 * error stops it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <zstd.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/stats.h"
#include "ingest/buffer.h"
#include "ingest/ingest.h"

/* A mix of kept and refused records: invalid JSON, a missing text, a blank
 * line (skipped, not a record), an over-long line, a short text. */
static char *mixed(size_t n, size_t *len) {
    rf_buf b = RF_BUF_INIT;
    for (size_t i = 0; i < n; i++) {
        switch (i % 7) {
        case 0:
            rf_buf_printf(&b, "{\"text\": \"not json\n");
            break;
        case 1:
            rf_buf_printf(&b, "{\"title\": \"no text field\"}\n");
            break;
        case 2:
            rf_buf_printf(&b, "\n");
            break;
        case 3:
            rf_buf_printf(&b, "{\"text\": \"%0300zu\"}\n", i);
            break;
        default:
            rf_buf_printf(&b, "{\"text\": \"Record %zu says something about a product\"}\n", i);
        }
    }
    *len = b.len;
    return b.data;
}

static void opts(rf_ingest_opts *o) {
    rf_ingest_opts_default(o);
    o->quality_enabled = false;
    o->format = RF_FORMAT_JSONL;
    o->max_line = 200;
}

/* What the batches handed on say, as text: each batch's counts, each
 * document as its JSON line, each reject as "line reason excerpt". */
typedef struct transcript {
    rf_buf text;
    int64_t records, kept, rejected;
    size_t batches;
} transcript;

static int record(void *ctx, rf_ingest_batch *b) {
    transcript *t = ctx;
    t->batches++;
    t->records += (int64_t)b->records;
    t->kept += b->kept;
    t->rejected += (int64_t)b->n_rejects;
    assert_int_equal(b->records, (size_t)b->kept + b->n_rejects);
    assert_int_equal(b->docs ? b->docs->n : 0, (size_t)b->kept);
    for (size_t i = 0; b->docs && i < b->docs->n; i++) {
        assert_int_equal(rf_doc_to_json(&b->docs->docs[i], &t->text), 0);
        assert_int_equal(rf_buf_putc(&t->text, '\n'), 0);
    }
    for (size_t i = 0; i < b->n_rejects; i++) {
        const rf_ingest_reject *r = &b->rejects[i];
        rf_buf_printf(&t->text, "%llu %s %.*s\n", (unsigned long long)r->line, r->reason,
                      (int)r->excerpt_len, r->excerpt);
    }
    rf_doc_batch_free(b->docs);
    return 0;
}

static void test_same_as_a_file(void **state) {
    char dir[] = "/tmp/rf_ingest_buffer_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/msg.jsonl", dir);
    size_t len;
    char *data = mixed(700, &len);
    FILE *f = fopen(path, "wb");
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);

    rf_ingest_opts o;
    opts(&o);
    o.batch_docs = 64; /* the input spans several internal batches */
    transcript from_file = {0}, from_memory = {0};
    rf_stats *stats = rf_stats_new();
    const char *inputs[] = {path};
    rf_ingest_sink sink = {.batch = record, .batch_ctx = &from_file};
    assert_int_equal(rf_ingest_run(&o, inputs, 1, &sink, stats, NULL), 0);
    assert_int_equal(rf_ingest_buffer(&o, path, data, len, record, &from_memory), 0);

    assert_true(from_memory.batches > 1);
    assert_int_equal(from_memory.batches, from_file.batches);
    assert_int_equal(from_memory.records, rf_stats_get(stats, "ingest.records_in"));
    assert_int_equal(from_memory.kept, rf_stats_get(stats, "ingest.kept"));
    assert_true(from_memory.kept > 0 && from_memory.rejected > 0);
    assert_int_equal(from_memory.text.len, from_file.text.len);
    assert_memory_equal(from_memory.text.data, from_file.text.data, from_file.text.len);

    rf_buf_free(&from_file.text);
    rf_buf_free(&from_memory.text);
    rf_stats_free(stats);
    free(data);
    unlink(path);
    rmdir(dir);
}

static int stop_at_first(void *ctx, rf_ingest_batch *b) {
    (*(int *)ctx)++;
    rf_doc_batch_free(b->docs);
    return RF_ERR_CANCELED;
}

static void test_zstd_corrupt_and_stop(void **state) {
    rf_ingest_opts o;
    opts(&o);
    size_t len;
    char *data = mixed(50, &len);
    transcript plain = {0}, z = {0}, empty = {0};
    assert_int_equal(rf_ingest_buffer(&o, "m", data, len, record, &plain), 0);
    size_t cap = ZSTD_compressBound(len);
    char *packed = malloc(cap);
    size_t n = ZSTD_compress(packed, cap, data, len, 3);
    assert_false(ZSTD_isError(n));
    assert_int_equal(rf_ingest_buffer(&o, "m", packed, n, record, &z), 0);
    assert_int_equal(z.text.len, plain.text.len);
    assert_memory_equal(z.text.data, plain.text.data, plain.text.len);

    rf_buf_free(&z.text);
    z = (transcript){0};
    packed[n / 2] ^= 0x55; /* a corrupt frame: an error, not documents */
    packed[n / 2 + 1] ^= 0x55;
    assert_true(rf_ingest_buffer(&o, "m", packed, n, record, &z) < 0);

    assert_int_equal(rf_ingest_buffer(&o, "empty", "", 0, record, &empty), 0);
    assert_int_equal(empty.records, 0);

    /* Rejects whose excerpts are all empty (no excerpt byte kept at all). */
    transcript blank = {0};
    const char only_empty[] = "{\"text\": \"\"}\n{\"text\": \"   \"}\n";
    assert_int_equal(rf_ingest_buffer(&o, "m", only_empty, sizeof only_empty - 1, record, &blank),
                     0);
    assert_int_equal(blank.records, 2);
    assert_int_equal(blank.rejected, 2);
    rf_buf_free(&blank.text);

    int calls = 0; /* the callback's error stops the run */
    o.batch_docs = 8;
    assert_int_equal(rf_ingest_buffer(&o, "m", data, len, stop_at_first, &calls), RF_ERR_CANCELED);
    assert_int_equal(calls, 1);

    rf_buf_free(&plain.text);
    rf_buf_free(&z.text);
    rf_buf_free(&empty.text);
    free(packed);
    free(data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_a_file),
        cmocka_unit_test(test_zstd_corrupt_and_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
