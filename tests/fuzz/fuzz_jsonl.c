/* libFuzzer target: JSON Lines field extraction (ingest/jsonl.h) under every
 * mapping shape: joined text fields, dotted paths, labels with and without a
 * map, ids. The first byte picks the mapping; the rest is split into lines. */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/doc.h"
#include "ingest/jsonl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static rf_json_doc *doc;
    static rf_label_map map;
    if (!doc) {
        doc = rf_json_doc_new();
        rf_label_map_parse("1-2:0,3-5:1", &map);
    }
    if (size == 0) return 0;
    static const char *const fields[] = {"summary", "reviewText", "a.b.c", "text"};
    static const rf_label_map none = {0};
    uint8_t mode = data[0];
    rf_field_map fm = {fields + (mode & 1),
                       1 + (mode >> 1 & 3) % 3,
                       "\n",
                       (mode & 8) ? "overall" : NULL,
                       (mode & 16) ? "id" : NULL,
                       (mode & 32) ? &map : &none,
                       (mode & 64) != 0};
    rf_buf text = RF_BUF_INIT, norm = RF_BUF_INIT;
    const char *p = (const char *)data + 1, *end = (const char *)data + size;
    while (p <= end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        rf_record_fields out = {.text = &text, .norm = &norm};
        const char *why = rf_jsonl_extract(doc, p, n, &fm, &out);
        if (!why) {
            assert(out.text_data && out.text_data[out.text_len] == '\0');
            assert(!fm.label_field || out.label >= 0);
            assert(!fm.id_field || (out.id && out.id_len > 0));
        }
        if (!nl) break;
        p = nl + 1;
    }
    rf_buf_free(&text);
    rf_buf_free(&norm);
    return 0;
}
