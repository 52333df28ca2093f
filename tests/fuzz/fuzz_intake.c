/* Fuzzes the intake file reader (runtime/intake.h): the input (after its first
 * byte) is written as an intake file and loaded; when the first byte is
 * even, the record checksums are recomputed first, so that mutations get
 * past them into the body checks; when odd, the bytes are used as they are
 * (framing, checksum and torn-tail paths). A file that loads is then opened
 * for appending (cutting a torn tail), appended to, and must load again with
 * one more batch. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "refinery.pb-c.h"
#include "runtime/intake.h"

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Rewrites the checksum of every complete record (16-byte headers). */
static void fix_checksums(uint8_t *p, size_t n) {
    size_t off = 0;
    while (off + 16 <= n) {
        uint32_t len = get32(p + off + 4);
        if (len > n - off - 16) break;
        uint64_t sum = rf_hash64(p + off + 16, len, 0);
        for (int i = 0; i < 8; i++)
            p[off + 8 + i] = (uint8_t)(sum >> (8 * i));
        off += 16 + (size_t)len;
    }
}

static char dir[64];
static char path[128];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_intake_XXXXXX");
        if (!mkdtemp(dir)) abort();
        snprintf(path, sizeof path, "%s/eval.intake", dir);
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

    rf_dataset d = {0};
    rf_intake_info info;
    int rc = rf_intake_load(path, NULL, 8, &d, &info);
    rf_dataset_free(&d);
    if (rc == RF_OK) {
        rf_intake *in;
        if (rf_intake_open(path, &in) != RF_OK) abort(); /* loadable => openable */
        uint32_t ids[] = {2, 7, 3};
        Refinery__V1__TokenSequence q = REFINERY__V1__TOKEN_SEQUENCE__INIT, *qp = &q;
        q.ids = ids;
        q.n_ids = 3;
        q.label = 1;
        Refinery__V1__TokenBatch b = REFINERY__V1__TOKEN_BATCH__INIT;
        b.run_id = "fuzz";
        b.seq = UINT64_MAX; /* after every other seq */
        b.seqs = &qp;
        b.n_seqs = 1;
        if (rf_intake_append(in, &b) != RF_OK) abort();
        rf_intake_close(in);
        rf_intake_info again;
        if (rf_intake_load(path, NULL, 8, &d, &again) != RF_OK) abort();
        if (again.torn_bytes || again.records != info.records + 1) abort();
        rf_dataset_free(&d);
    }
    unlink(path);
    return 0;
}
