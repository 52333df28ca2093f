/* libFuzzer target: the CSV/TSV record parser (ingest/csv.h). The first byte
 * picks the dialect (delimiter, quoting, a small record limit); the rest is fed
 * line by line as the reader would, then finished. Every complete record's
 * fields must lie inside the parser's buffer and be NUL-terminated. */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ingest/csv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    uint8_t mode = data[0];
    rf_csv_opts o = {(mode & 1) ? '\t' : ',', (mode & 2) ? -1 : '"', (mode & 4) ? 256 : 0};
    rf_csv p;
    rf_csv_init(&p, &o);
    const char *s = (const char *)data + 1, *end = (const char *)data + size;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
        rf_csv_status st = rf_csv_feed(&p, s, n);
        if (st == RF_CSV_RECORD) {
            for (size_t i = 0; i < p.nfields; i++) {
                size_t len;
                const char *f = rf_csv_field(&p, i, &len);
                assert(f >= p.buf.data && f + len < p.buf.data + p.buf.len + 1);
                assert(f[len] == '\0');
            }
        }
        if (st != RF_CSV_MORE) assert(!rf_csv_open(&p));
        if (o.max_record) assert(p.buf.len <= 2 * o.max_record + n + 2);
        if (!nl) break;
        s = nl + 1;
    }
    rf_csv_finish(&p);
    assert(!rf_csv_open(&p));
    rf_csv_free(&p);
    return 0;
}
