/* Append-only intake records of token batches; loading with seq dedup. */
#include "runtime/intake.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/sys.h"

#define MAGIC    0x31494652u /* "RFI1" */
#define HDR      16u
#define MAX_BODY (1u << 30)

struct rf_intake {
    int fd;
    uint64_t size;
    char *path;
};

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- reading records ---- */

typedef struct record {
    uint64_t off; /* of the header */
    uint32_t body_len;
    uint64_t seq;
} record;

enum { REC_OK, REC_TORN, REC_CORRUPT };

/* Whether a whole record with a matching checksum starts anywhere in
 * [from, size): then a bad record before it is damage, not a torn tail. */
static bool record_after(const uint8_t *base, uint64_t size, uint64_t from) {
    for (uint64_t q = from; q + HDR <= size; q++) {
        if (get32(base + q) != MAGIC) continue;
        uint32_t len = get32(base + q + 4);
        if (len <= MAX_BODY && len <= size - q - HDR &&
            rf_hash64(base + q + HDR, len, 0) == get64(base + q + 8))
            return true;
    }
    return false;
}

/* Checks the structure of a body whose checksum matched: everything in
 * bounds and consumed exactly. Fills seq and, when not NULL, the run id. */
static bool body_valid(const uint8_t *p, uint32_t len, uint64_t *seq, const uint8_t **run,
                       uint32_t *run_len) {
    const uint8_t *end = p + len;
    if (len < 16) return false;
    uint32_t rl = get32(p);
    p += 4;
    if (rl > (size_t)(end - p) || (size_t)(end - p) - rl < 12) return false;
    *run = p;
    *run_len = rl;
    p += rl;
    *seq = get64(p);
    uint32_t n = get32(p + 8);
    p += 12;
    for (uint32_t i = 0; i < n; i++) {
        if ((size_t)(end - p) < 8) return false;
        uint32_t k = get32(p + 4);
        p += 8;
        if (k > (size_t)(end - p) / 4) return false;
        p += (size_t)k * 4;
    }
    return p == end;
}

/* One record at base+off. A bad one is REC_CORRUPT when a whole record
 * follows it, else REC_TORN: the incomplete or garbled end of an append
 * that did not finish. */
static int read_record(const uint8_t *base, uint64_t size, uint64_t off, record *r,
                       const uint8_t **run, uint32_t *run_len) {
    const uint8_t *p = base + off;
    uint32_t len = size - off >= HDR ? get32(p + 4) : 0;
    bool ok = size - off >= HDR && get32(p) == MAGIC && len <= MAX_BODY &&
              len <= size - off - HDR && rf_hash64(p + HDR, len, 0) == get64(p + 8);
    if (!ok) return record_after(base, size, off + 1) ? REC_CORRUPT : REC_TORN;
    if (!body_valid(p + HDR, len, &r->seq, run, run_len)) return REC_CORRUPT;
    r->off = off;
    r->body_len = len;
    return REC_OK;
}

/* The size of the whole records at the start of the mapped file. */
static int scan(const char *path, const uint8_t *base, uint64_t size, uint64_t *whole) {
    uint64_t off = 0;
    while (off < size) {
        record r;
        const uint8_t *run;
        uint32_t rl;
        int k = read_record(base, size, off, &r, &run, &rl);
        if (k == REC_TORN) break;
        if (k == REC_CORRUPT)
            return rf_fail(RF_ERR_CORRUPT, "intake %s: bad record at byte %" PRIu64, path, off);
        off += HDR + r.body_len;
    }
    *whole = off;
    return RF_OK;
}

/* Reads the whole file into *base (malloc'd; NULL for an empty file).
 * Read rather than mapped: a concurrent rf_intake_open may cut a torn tail
 * off, which would make a mapping fault where a read just ends early. */
static int read_all(const char *path, int fd, const uint8_t **base, uint64_t *size) {
    struct stat st;
    *base = NULL;
    *size = 0;
    if (fstat(fd, &st) < 0) return rf_fail(RF_ERR_IO, "intake %s: %s", path, strerror(errno));
    if (!st.st_size) return RF_OK;
    uint8_t *buf = malloc((size_t)st.st_size);
    if (!buf) return RF_ERR_NOMEM;
    uint64_t got = 0;
    while (got < (uint64_t)st.st_size) {
        ssize_t r = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            free(buf);
            return rf_fail(RF_ERR_IO, "intake %s: read: %s", path, strerror(errno));
        }
        if (r == 0) break;
        got += (uint64_t)r;
    }
    *base = buf;
    *size = got;
    return RF_OK;
}

/* ---- appending ---- */

static int sync_parent(const char *path) {
    char *copy = strdup(path);
    if (!copy) return RF_ERR_NOMEM;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    free(copy);
    if (fd < 0) return rf_fail(RF_ERR_IO, "intake %s: parent directory: %s", path, strerror(errno));
    int rc = fsync(fd) < 0 ? rf_fail(RF_ERR_IO, "intake %s: fsync dir: %s", path, strerror(errno))
                           : RF_OK;
    close(fd);
    return rc;
}

int rf_intake_open(const char *path, rf_intake **out) {
    char *dir = strdup(path);
    if (!dir) return RF_ERR_NOMEM;
    int rc = rf_mkdir_p(dirname(dir));
    free(dir);
    if (rc) return rf_fail_ctx(rc, "intake %s", path);
    bool existed = access(path, F_OK) == 0;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return rf_fail(RF_ERR_IO, "intake %s: %s", path, strerror(errno));
    const uint8_t *base = NULL;
    uint64_t size = 0, whole = 0;
    rc = read_all(path, fd, &base, &size);
    if (!rc) rc = scan(path, base, size, &whole);
    free((void *)base);
    if (!rc && whole < size) {
        rf_warn("intake", "%s: cutting off a torn last record (%" PRIu64 " bytes at %" PRIu64 ")",
                path, size - whole, whole);
        if (ftruncate(fd, (off_t)whole) < 0 || fdatasync(fd) < 0)
            rc = rf_fail(RF_ERR_IO, "intake %s: truncate: %s", path, strerror(errno));
    }
    if (!rc && !existed) rc = sync_parent(path);
    rf_intake *in = NULL;
    if (!rc && (!(in = calloc(1, sizeof *in)) || !(in->path = strdup(path)))) rc = RF_ERR_NOMEM;
    if (rc) {
        if (in) free(in->path);
        free(in);
        close(fd);
        return rc;
    }
    in->fd = fd;
    in->size = whole;
    *out = in;
    return RF_OK;
}

void rf_intake_close(rf_intake *in) {
    if (!in) return;
    close(in->fd);
    free(in->path);
    free(in);
}

uint64_t rf_intake_size(const rf_intake *in) {
    return in->size;
}

static int encode(const Refinery__V1__TokenBatch *b, uint8_t **out, size_t *len) {
    size_t run_len = strlen(b->run_id), body = 4 + run_len + 8 + 4;
    for (size_t i = 0; i < b->n_seqs; i++)
        body += 8 + b->seqs[i]->n_ids * 4;
    if (body > MAX_BODY || b->n_seqs > UINT32_MAX)
        return rf_fail(RF_ERR_RANGE, "intake: batch %s/%" PRIu64 " too large (%zu bytes)",
                       b->run_id, b->seq, body);
    uint8_t *buf = malloc(HDR + body), *p = buf + HDR;
    if (!buf) return RF_ERR_NOMEM;
    put32(p, (uint32_t)run_len);
    memcpy(p + 4, b->run_id, run_len);
    p += 4 + run_len;
    put64(p, b->seq);
    put32(p + 8, (uint32_t)b->n_seqs);
    p += 12;
    for (size_t i = 0; i < b->n_seqs; i++) {
        const Refinery__V1__TokenSequence *q = b->seqs[i];
        put32(p, (uint32_t)q->label);
        put32(p + 4, (uint32_t)q->n_ids);
        p += 8;
        for (size_t k = 0; k < q->n_ids; k++, p += 4)
            put32(p, q->ids[k]);
    }
    put32(buf, MAGIC);
    put32(buf + 4, (uint32_t)body);
    put64(buf + 8, rf_hash64(buf + HDR, body, 0));
    *out = buf;
    *len = HDR + body;
    return RF_OK;
}

int rf_intake_append(rf_intake *in, const Refinery__V1__TokenBatch *b) {
    uint8_t *buf = NULL;
    size_t len = 0, done = 0;
    int rc = encode(b, &buf, &len);
    if (rc) return rc;
    while (done < len && !rc) {
        ssize_t w = pwrite(in->fd, buf + done, len - done, (off_t)(in->size + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            rc = rf_fail(RF_ERR_IO, "intake %s: write: %s", in->path, strerror(errno));
        else
            done += (size_t)w;
    }
    if (!rc && fdatasync(in->fd) < 0)
        rc = rf_fail(RF_ERR_IO, "intake %s: fdatasync: %s", in->path, strerror(errno));
    free(buf);
    if (rc) {
        if (ftruncate(in->fd, (off_t)in->size) < 0)
            rf_warn("intake", "%s: cannot cut back a failed append: %s", in->path, strerror(errno));
        return rc;
    }
    in->size += len;
    return RF_OK;
}

/* ---- loading ---- */

static int cmp_record(const void *a, const void *b) {
    const record *x = a, *y = b;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Adds one record's sequences to d. */
static int add_record(const uint8_t *body, int max_len, rf_dataset *d, rf_intake_info *info,
                      uint32_t **buf, size_t *cap) {
    const uint8_t *p = body;
    p += 4 + get32(p);
    uint32_t n = get32(p + 8);
    p += 12;
    for (uint32_t i = 0; i < n; i++) {
        int32_t label = (int32_t)get32(p);
        size_t k = get32(p + 4);
        const uint8_t *ids = p + 8;
        p += 8 + k * 4;
        if (k == 0) {
            d->skipped++;
            info->empty++;
            continue;
        }
        if (k > *cap) {
            uint32_t *nb = realloc(*buf, k * sizeof *nb);
            if (!nb) return RF_ERR_NOMEM;
            *buf = nb;
            *cap = k;
        }
        for (size_t j = 0; j < k; j++)
            (*buf)[j] = get32(ids + 4 * j);
        if (max_len > 0 && k > (size_t)max_len) { /* keep the closing [SEP] */
            (*buf)[max_len - 1] = (*buf)[k - 1];
            k = (size_t)max_len;
        }
        int rc = rf_dataset_add(d, *buf, k, label);
        if (rc) return rc;
        info->sequences++;
    }
    return RF_OK;
}

int rf_intake_load(const char *path, const char *run_id, int max_len, rf_dataset *d,
                   rf_intake_info *info_out) {
    rf_intake_info info = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? rf_fail(RF_ERR_NOT_FOUND, "intake %s: no such file", path)
                               : rf_fail(RF_ERR_IO, "intake %s: %s", path, strerror(errno));
    const uint8_t *base = NULL;
    uint64_t size = 0, off = 0;
    record *recs = NULL;
    size_t n = 0, cap = 0, id_cap = 0;
    uint32_t *ids = NULL;
    int rc = read_all(path, fd, &base, &size);
    close(fd);
    while (!rc && off < size) {
        record r;
        const uint8_t *run;
        uint32_t rl;
        int k = read_record(base, size, off, &r, &run, &rl);
        if (k == REC_TORN) {
            info.torn_bytes = size - off;
            break;
        }
        if (k == REC_CORRUPT) {
            rc = rf_fail(RF_ERR_CORRUPT, "intake %s: bad record at byte %" PRIu64, path, off);
            break;
        }
        if (run_id && (strlen(run_id) != rl || memcmp(run, run_id, rl))) {
            rc = rf_fail(RF_ERR_CORRUPT, "intake %s: record at byte %" PRIu64 " is of run %.*s",
                         path, off, (int)(rl < 128 ? rl : 128), (const char *)run);
            break;
        }
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            record *nr = realloc(recs, nc * sizeof *nr);
            if (!nr) {
                rc = RF_ERR_NOMEM;
                break;
            }
            recs = nr;
            cap = nc;
        }
        recs[n++] = r;
        off += HDR + r.body_len;
    }
    info.records = n;
    if (!rc) qsort(recs, n, sizeof *recs, cmp_record);
    for (size_t i = 0; i < n && !rc; i++) {
        if (i > 0 && recs[i].seq == recs[i - 1].seq) {
            info.replays++;
            continue;
        }
        info.batches++;
        rc = add_record(base + recs[i].off + HDR, max_len, d, &info, &ids, &id_cap);
    }
    free((void *)base);
    free(recs);
    free(ids);
    if (!rc && info.torn_bytes)
        rf_warn("intake", "%s: ignoring a torn last record (%" PRIu64 " bytes)", path,
                info.torn_bytes);
    if (info_out) *info_out = info;
    return rc;
}
