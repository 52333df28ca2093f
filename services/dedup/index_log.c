#include "dedup/index_log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/sys.h"

#define MAGIC_FILE "RFDEDUP"
#define MAGIC_REC  0x42444652u /* "RFDB" */
#define VERSION    1u
#define REC_PREFIX 8u

struct rf_ddlog {
    int fd;
    char *path;
    uint64_t size;
    rf_buf pending;
};

static void put32(unsigned char *p, uint32_t v) {
    memcpy(p, &v, 4);
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void encode_header(const rf_ddlog_params *p, unsigned char h[RF_DDLOG_HEADER_SIZE]) {
    memset(h, 0, RF_DDLOG_HEADER_SIZE);
    memcpy(h, MAGIC_FILE, 8);
    uint32_t f[8] = {VERSION, p->ngram, p->char_mode, p->bands,
                     p->rows, p->norm,  p->verify,    p->set_cap};
    memcpy(h + 8, f, sizeof f);
    memcpy(h + 40, &p->threshold, 8);
    memcpy(h + 48, &p->seed, 8);
    uint64_t sum = rf_hash64(h, 56, 0);
    memcpy(h + 56, &sum, 8);
}

static int decode_header(const char *path, const unsigned char h[RF_DDLOG_HEADER_SIZE],
                         rf_ddlog_params *p) {
    if (memcmp(h, MAGIC_FILE, 8))
        return rf_fail(RF_ERR_CORRUPT, "%s: not a dedup index (bad magic)", path);
    if (get64(h + 56) != rf_hash64(h, 56, 0))
        return rf_fail(RF_ERR_CORRUPT, "%s: header checksum mismatch", path);
    if (get32(h + 8) != VERSION)
        return rf_fail(RF_ERR_UNSUPPORTED, "%s: index format version %u, this build reads %u", path,
                       get32(h + 8), VERSION);
    p->ngram = get32(h + 12);
    p->char_mode = get32(h + 16);
    p->bands = get32(h + 20);
    p->rows = get32(h + 24);
    p->norm = get32(h + 28);
    p->verify = get32(h + 32);
    p->set_cap = get32(h + 36);
    memcpy(&p->threshold, h + 40, 8);
    p->seed = get64(h + 48);
    return RF_OK;
}

static int same_params(const char *path, const rf_ddlog_params *have, const rf_ddlog_params *want) {
    if (have->ngram == want->ngram && have->char_mode == want->char_mode &&
        have->bands == want->bands && have->rows == want->rows && have->norm == want->norm &&
        have->verify == want->verify && have->set_cap == want->set_cap &&
        have->threshold == want->threshold && have->seed == want->seed)
        return RF_OK;
    return rf_fail(RF_ERR_INVALID,
                   "%s was built with ngram=%u%s bands=%u rows=%u norm=0x%x verify=%u "
                   "threshold=%g set_cap=%u; this run asks ngram=%u%s bands=%u rows=%u norm=0x%x "
                   "verify=%u threshold=%g set_cap=%u (use the same options or a new index)",
                   path, have->ngram, have->char_mode ? "(char)" : "", have->bands, have->rows,
                   have->norm, have->verify, have->threshold, have->set_cap, want->ngram,
                   want->char_mode ? "(char)" : "", want->bands, want->rows, want->norm,
                   want->verify, want->threshold, want->set_cap);
}

static int read_full(int fd, void *dst, size_t len, uint64_t off, size_t *got) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)dst + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return rf_fail(RF_ERR_IO, "index read: %s", strerror(errno));
        }
        if (n == 0) break;
        done += (size_t)n;
    }
    *got = done;
    return RF_OK;
}

static int write_full(int fd, const void *src, size_t len, uint64_t off) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(fd, (const char *)src + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return rf_fail(RF_ERR_IO, "index write: %s", strerror(errno));
        }
        done += (size_t)n;
    }
    return RF_OK;
}

/* Replays records from RF_DDLOG_HEADER_SIZE; sets log->size to the end of the
 * last valid record. */
static int replay(rf_ddlog *log, uint64_t file_size, rf_ddlog_apply_fn apply, void *ctx) {
    uint64_t off = RF_DDLOG_HEADER_SIZE;
    unsigned char prefix[REC_PREFIX];
    rf_buf payload = RF_BUF_INIT;
    int rc = RF_OK;
    size_t got;
    while (off < file_size) {
        const char *torn = NULL;
        if ((rc = read_full(log->fd, prefix, REC_PREFIX, off, &got))) break;
        uint32_t len = get32(prefix + 4);
        if (got < REC_PREFIX) {
            torn = "record prefix";
        } else if (get32(prefix) != MAGIC_REC) {
            rc = rf_fail(RF_ERR_CORRUPT, "%s: bad record magic at offset %llu", log->path,
                         (unsigned long long)off);
            break;
        } else if (len > RF_DDLOG_MAX_PAYLOAD) {
            rc = rf_fail(RF_ERR_CORRUPT, "%s: record at offset %llu claims %u bytes", log->path,
                         (unsigned long long)off, len);
            break;
        } else if (off + REC_PREFIX + len + 8 > file_size) {
            torn = "record body";
        }
        if (!torn) {
            rf_buf_reset(&payload);
            if ((rc = rf_buf_reserve(&payload, (size_t)len + 8))) break;
            if ((rc = read_full(log->fd, payload.data, (size_t)len + 8, off + REC_PREFIX, &got)))
                break;
            if (got < (size_t)len + 8) {
                torn = "record body";
            } else if (get64((unsigned char *)payload.data + len) !=
                       rf_hash64(payload.data, len, len)) {
                if (off + REC_PREFIX + len + 8 < file_size) {
                    rc = rf_fail(RF_ERR_CORRUPT, "%s: checksum mismatch in record at offset %llu",
                                 log->path, (unsigned long long)off);
                    break;
                }
                torn = "last record checksum";
            }
        }
        if (torn) {
            rf_warn("dedup",
                    "%s: dropping an incomplete last batch at offset %llu (%s); its "
                    "documents will be processed again",
                    log->path, (unsigned long long)off, torn);
            if (ftruncate(log->fd, (off_t)off) != 0) {
                rc = rf_fail(RF_ERR_IO, "%s: truncate: %s", log->path, strerror(errno));
            }
            break;
        }
        if ((rc = apply(ctx, (unsigned char *)payload.data, len, off + REC_PREFIX))) break;
        off += REC_PREFIX + len + 8;
    }
    rf_buf_free(&payload);
    log->size = off;
    return rc;
}

int rf_ddlog_open(const char *dir, const rf_ddlog_params *want, rf_ddlog_apply_fn apply, void *ctx,
                  rf_ddlog **out) {
    *out = NULL;
    int rc = rf_mkdir_p(dir);
    if (rc) return rc;
    rf_ddlog *log = calloc(1, sizeof *log);
    if (!log) return RF_ERR_NOMEM;
    log->fd = -1;
    size_t plen = strlen(dir) + sizeof(RF_DDLOG_FILE) + 2;
    if (!(log->path = malloc(plen))) {
        free(log);
        return RF_ERR_NOMEM;
    }
    snprintf(log->path, plen, "%s/%s", dir, RF_DDLOG_FILE);
    log->fd = open(log->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (log->fd < 0) {
        rc = rf_fail(RF_ERR_IO, "%s: %s", log->path, strerror(errno));
        goto fail;
    }
    if (flock(log->fd, LOCK_EX | LOCK_NB) != 0) {
        rc = rf_fail(RF_ERR_IO, "%s: in use by another process", log->path);
        goto fail;
    }
    struct stat st;
    if (fstat(log->fd, &st) != 0) {
        rc = rf_fail(RF_ERR_IO, "%s: %s", log->path, strerror(errno));
        goto fail;
    }
    unsigned char h[RF_DDLOG_HEADER_SIZE];
    if (st.st_size == 0) {
        encode_header(want, h);
        if ((rc = write_full(log->fd, h, sizeof h, 0))) goto fail;
        if (fsync(log->fd) != 0) {
            rc = rf_fail(RF_ERR_IO, "%s: fsync: %s", log->path, strerror(errno));
            goto fail;
        }
        log->size = sizeof h;
    } else {
        size_t got;
        rf_ddlog_params have = {0};
        if ((rc = read_full(log->fd, h, sizeof h, 0, &got))) goto fail;
        if (got < sizeof h) {
            rc = rf_fail(RF_ERR_CORRUPT, "%s: truncated header (%zu bytes)", log->path, got);
            goto fail;
        }
        if ((rc = decode_header(log->path, h, &have)) || (rc = same_params(log->path, &have, want)))
            goto fail;
        if ((rc = replay(log, (uint64_t)st.st_size, apply, ctx))) goto fail;
    }
    *out = log;
    return RF_OK;
fail:
    rf_ddlog_close(log);
    return rc;
}

void rf_ddlog_close(rf_ddlog *log) {
    if (!log) return;
    if (log->fd >= 0) close(log->fd);
    rf_buf_free(&log->pending);
    free(log->path);
    free(log);
}

rf_buf *rf_ddlog_pending(rf_ddlog *log) {
    return &log->pending;
}

uint64_t rf_ddlog_pending_voff(const rf_ddlog *log) {
    return log->size + REC_PREFIX;
}

uint64_t rf_ddlog_size(const rf_ddlog *log) {
    return log->size;
}

int rf_ddlog_commit(rf_ddlog *log) {
    size_t len = log->pending.len;
    if (len > RF_DDLOG_MAX_PAYLOAD)
        return rf_fail(RF_ERR_RANGE, "dedup batch record of %zu bytes is too large", len);
    unsigned char prefix[REC_PREFIX];
    put32(prefix, MAGIC_REC);
    put32(prefix + 4, (uint32_t)len);
    uint64_t sum = rf_hash64(log->pending.data, len, len);
    int rc;
    if ((rc = write_full(log->fd, prefix, REC_PREFIX, log->size)) ||
        (rc = write_full(log->fd, log->pending.data, len, log->size + REC_PREFIX)) ||
        (rc = write_full(log->fd, &sum, 8, log->size + REC_PREFIX + len))) {
        /* Do not leave a partial record behind a later, shorter one. */
        if (ftruncate(log->fd, (off_t)log->size) != 0)
            rf_warn("dedup", "%s: truncate failed", log->path);
        return rc;
    }
    if (fdatasync(log->fd) != 0)
        return rf_fail(RF_ERR_IO, "%s: fsync: %s", log->path, strerror(errno));
    log->size += REC_PREFIX + len + 8;
    rf_buf_reset(&log->pending);
    return RF_OK;
}

int rf_ddlog_read(const rf_ddlog *log, uint64_t voff, void *dst, size_t len) {
    uint64_t pend = log->size + REC_PREFIX;
    if (voff >= pend) {
        uint64_t pos = voff - pend;
        if (pos > log->pending.len || len > log->pending.len - pos)
            return rf_fail(RF_ERR_INTERNAL, "index read past the pending batch");
        memcpy(dst, log->pending.data + pos, len);
        return RF_OK;
    }
    size_t got;
    int rc = read_full(log->fd, dst, len, voff, &got);
    if (rc) return rc;
    if (got < len)
        return rf_fail(RF_ERR_CORRUPT, "%s: short read at offset %llu", log->path,
                       (unsigned long long)voff);
    return RF_OK;
}
