/* Fuzzes the dedup index reader: the input is written as dir/index.rfdd and
 * opened with the default parameters (the seeds are real indexes built with
 * them). When the first byte is even, the record checksums are recomputed
 * first, so that mutations get past them into the field checks of the replay;
 * when odd, the bytes are used as they are (framing and checksum paths). An
 * index that opens is then used: two documents are processed (replayed or
 * decided, reading ids and shingle sets back from the file). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/log.h"
#include "dedup/dedup.h"
#include "dedup/index_log.h"

/* Rewrites the checksum of every complete record after the 64-byte header. */
static void fix_checksums(uint8_t *p, size_t n) {
    size_t off = RF_DDLOG_HEADER_SIZE;
    while (off + 8 <= n) {
        uint32_t len;
        memcpy(&len, p + off + 4, 4);
        if (len > n - off - 8 || n - off - 8 - len < 8) break;
        uint64_t sum = rf_hash64(p + off + 8, len, len);
        memcpy(p + off + 8 + len, &sum, 8);
        off += 16 + (size_t)len;
    }
}

static char dir[64];
static char path[128];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_dedup_index_XXXXXX");
        if (!mkdtemp(dir)) abort();
        snprintf(path, sizeof path, "%s/%s", dir, RF_DDLOG_FILE);
        rf_log_set_level(RF_LOG_ERROR);
    }
    if (!size) return 0;
    uint8_t *buf = malloc(size);
    if (!buf) abort();
    memcpy(buf, data + 1, size - 1);
    if (!(data[0] & 1)) fix_checksums(buf, size - 1);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size > 1 && fwrite(buf, 1, size - 1, f) != size - 1) abort();
    fclose(f);
    free(buf);

    rf_dedup_opts o;
    rf_dedup_opts_default(&o);
    rf_dedup *d;
    if (rf_dedup_open(&o, dir, &d) == 0) {
        char id0[] = "Appliances_5:1", id1[] = "fuzz-doc";
        char t0[] = "I like this as a vent as well as something that will keep house warmer";
        char t1[] = "one two three four five six seven eight nine ten";
        rf_doc docs[2] = {{.id = id0, .text = t0, .text_len = sizeof t0 - 1},
                          {.id = id1, .text = t1, .text_len = sizeof t1 - 1}};
        rf_dd_result res[2];
        if (rf_dedup_process(d, docs, 1, res) == 0) {
            rf_dd_results_clear(res, 1);
            if (rf_dedup_process(d, docs + 1, 1, res) == 0) rf_dd_results_clear(res, 1);
        }
        rf_dedup_close(d);
    }
    unlink(path);
    return 0;
}
