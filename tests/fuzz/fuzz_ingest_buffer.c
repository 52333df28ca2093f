/* libFuzzer target: one Kafka message through the ingest library's in-memory
 * entry point (ingest/buffer.h), as the ingest service's Kafka source feeds
 * it: the compression sniffing (plain, gzip, zstd), the record splitting of
 * each format, field mapping, cleaning and filters. The first byte picks the
 * format and options; the rest is the message. Every batch handed on must
 * account for its records, and its documents must be the kept ones. */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/doc.h"
#include "ingest/buffer.h"
#include "ingest/ingest.h"

static int check(void *ctx, rf_ingest_batch *b) {
    int64_t *records = ctx;
    assert(b->records == (size_t)b->kept + b->n_rejects);
    assert((b->docs ? b->docs->n : 0) == (size_t)b->kept);
    for (size_t i = 0; i < b->n_rejects; i++) {
        assert(b->rejects[i].reason && b->rejects[i].reason[0]);
        assert(b->rejects[i].excerpt_len <= 80);
    }
    for (size_t i = 0; b->docs && i < b->docs->n; i++)
        assert(b->docs->docs[i].id && b->docs->docs[i].text);
    *records += (int64_t)b->records;
    rf_doc_batch_free(b->docs);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    static const rf_ingest_format formats[] = {RF_FORMAT_JSONL, RF_FORMAT_CSV, RF_FORMAT_TSV,
                                               RF_FORMAT_TEXT};
    uint8_t mode = data[0];
    rf_ingest_opts o;
    rf_ingest_opts_default(&o);
    o.format = formats[mode & 3];
    o.header = (mode & 4) != 0;
    o.paragraphs = (mode & 8) != 0;
    o.quality_enabled = (mode & 16) != 0;
    o.clean.utf8 = (mode & 32) ? RF_UTF8_REJECT : RF_UTF8_REPAIR;
    o.max_line = (mode & 64) ? 64 : 1 << 20;
    o.batch_docs = (mode & 128) ? 3 : 1024;
    if (o.format != RF_FORMAT_JSONL) {
        o.text_fields[0] = o.header ? "text" : "0";
        o.n_text_fields = 1;
    }
    int64_t records = 0;
    int rc = rf_ingest_buffer(&o, "docs.raw[0]@1", data + 1, size - 1, check, &records);
    assert(rc <= 0);
    rf_ingest_opts_free(&o);
    return 0;
}
