/* rf_ingest_buffer (ingest/buffer.h): one in-memory input gives the same
 * documents and rejects as rf_ingest_run on a file with the same bytes and
 * name; several internal batches are merged in order; zstd works; corrupt
 * compressed data fails. */
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

/* The documents of out as the JSON lines rf_ingest_run writes. */
static void docs_json(const rf_ingest_out *out, rf_buf *js) {
    for (size_t i = 0; out->docs && i < out->docs->n; i++) {
        assert_int_equal(rf_doc_to_json(&out->docs->docs[i], js), 0);
        assert_int_equal(rf_buf_putc(js, '\n'), 0);
    }
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
    o.batch_docs = 64; /* the buffer spans several internal batches */
    char *docs = NULL, *rejects = NULL;
    size_t docs_len = 0, rejects_len = 0;
    FILE *fd = open_memstream(&docs, &docs_len), *fr = open_memstream(&rejects, &rejects_len);
    rf_stats *stats = rf_stats_new();
    const char *inputs[] = {path};
    rf_ingest_sink sink = {.docs = fd, .rejects = fr};
    assert_int_equal(rf_ingest_run(&o, inputs, 1, &sink, stats, NULL), 0);
    fclose(fd);
    fclose(fr);

    rf_ingest_out out = {0};
    assert_int_equal(rf_ingest_buffer(&o, path, data, len, &out), 0);
    assert_int_equal(out.records, rf_stats_get(stats, "ingest.records_in"));
    assert_int_equal(out.kept, rf_stats_get(stats, "ingest.kept"));
    assert_int_equal(out.records, out.kept + out.rejected);
    assert_true(out.kept > 0 && out.rejected > 0);
    assert_int_equal(out.docs->n, (size_t)out.kept);
    rf_buf js = RF_BUF_INIT;
    docs_json(&out, &js);
    assert_int_equal(js.len, docs_len);
    assert_memory_equal(js.data, docs, docs_len);
    assert_int_equal(out.rejects.len, rejects_len);
    assert_memory_equal(out.rejects.data, rejects, rejects_len);

    rf_buf_free(&js);
    rf_ingest_out_free(&out);
    rf_stats_free(stats);
    free(docs);
    free(rejects);
    free(data);
    unlink(path);
    rmdir(dir);
}

static void test_zstd_and_corrupt(void **state) {
    rf_ingest_opts o;
    opts(&o);
    size_t len;
    char *data = mixed(50, &len);
    rf_ingest_out plain = {0}, z = {0};
    assert_int_equal(rf_ingest_buffer(&o, "m", data, len, &plain), 0);
    size_t cap = ZSTD_compressBound(len);
    char *packed = malloc(cap);
    size_t n = ZSTD_compress(packed, cap, data, len, 3);
    assert_false(ZSTD_isError(n));
    assert_int_equal(rf_ingest_buffer(&o, "m", packed, n, &z), 0);
    assert_int_equal(z.kept, plain.kept);
    assert_int_equal(z.rejected, plain.rejected);
    rf_buf a = RF_BUF_INIT, b = RF_BUF_INIT;
    docs_json(&plain, &a);
    docs_json(&z, &b);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.data, b.data, a.len);
    rf_ingest_out_free(&z);

    packed[n / 2] ^= 0x55; /* corrupt frame: an error, not documents */
    packed[n / 2 + 1] ^= 0x55;
    assert_true(rf_ingest_buffer(&o, "m", packed, n, &z) < 0);
    rf_ingest_out_free(&z);

    assert_int_equal(rf_ingest_buffer(&o, "empty", "", 0, &z), 0);
    assert_int_equal(z.records, 0);
    assert_null(z.docs);
    rf_ingest_out_free(&z);

    rf_buf_free(&a);
    rf_buf_free(&b);
    rf_ingest_out_free(&plain);
    free(packed);
    free(data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_a_file),
        cmocka_unit_test(test_zstd_and_corrupt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
