#include "dedup/server/dedup_journal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/error.h"

#define JOURNAL_MAGIC 0x4a444652u /* "RFDJ" */

struct rf_dedup_journal {
    FILE *f;
    char *path;
    uint64_t size;
};

int rf_dedup_journal_open(const char *path, uint64_t size, rf_dedup_journal **out) {
    rf_dedup_journal *j = calloc(1, sizeof *j);
    if (!j || !(j->path = strdup(path))) {
        free(j);
        return RF_ERR_NOMEM;
    }
    j->f = fopen(path, "a+b");
    struct stat st;
    int rc = RF_OK;
    if (!j->f || fstat(fileno(j->f), &st) != 0)
        rc = rf_fail(RF_ERR_IO, "dedup journal %s: %s", path, strerror(errno));
    else if ((uint64_t)st.st_size < size)
        rc = rf_fail(RF_ERR_INVALID,
                     "dedup journal %s has %lld bytes but the index recorded %llu: it does not "
                     "belong to this index",
                     path, (long long)st.st_size, (unsigned long long)size);
    else if (ftruncate(fileno(j->f), (off_t)size) != 0)
        rc = rf_fail(RF_ERR_IO, "dedup journal %s: %s", path, strerror(errno));
    if (rc) {
        rf_dedup_journal_close(j);
        return rc;
    }
    j->size = size;
    *out = j;
    return RF_OK;
}

void rf_dedup_journal_close(rf_dedup_journal *j) {
    if (!j) return;
    if (j->f) fclose(j->f);
    free(j->path);
    free(j);
}

static int put_u32(rf_buf *b, uint32_t v) {
    return rf_buf_append(b, &v, 4);
}

int rf_dedup_journal_write(rf_dedup_journal *j, const char *run_id, uint64_t seq,
                           const rf_doc *docs, size_t n, uint64_t *size) {
    rf_buf b = RF_BUF_INIT;
    size_t rl = strlen(run_id);
    int rc = put_u32(&b, JOURNAL_MAGIC);
    if (!rc) rc = put_u32(&b, (uint32_t)rl);
    if (!rc) rc = rf_buf_append(&b, run_id, rl);
    if (!rc) rc = rf_buf_append(&b, &seq, 8);
    if (!rc) rc = put_u32(&b, (uint32_t)n);
    for (size_t i = 0; i < n && !rc; i++) {
        const char *id = docs[i].id ? docs[i].id : "";
        size_t il = strlen(id);
        rc = put_u32(&b, (uint32_t)il);
        if (!rc) rc = rf_buf_append(&b, id, il);
    }
    if (!rc && (fwrite(b.data, 1, b.len, j->f) != b.len || fflush(j->f) != 0))
        rc = rf_fail(RF_ERR_IO, "dedup journal %s: %s", j->path, strerror(errno));
    if (!rc) *size = j->size += b.len;
    rf_buf_free(&b);
    return rc;
}

int rf_dedup_journal_sync(rf_dedup_journal *j) {
    if (fsync(fileno(j->f)) != 0)
        return rf_fail(RF_ERR_IO, "dedup journal %s: fsync: %s", j->path, strerror(errno));
    return RF_OK;
}

int rf_dedup_journal_append(rf_dedup_journal *j, const char *run_id, uint64_t seq,
                            const rf_doc *docs, size_t n, uint64_t *size) {
    int rc = rf_dedup_journal_write(j, run_id, seq, docs, n, size);
    return rc ? rc : rf_dedup_journal_sync(j);
}

static int get(const unsigned char *p, size_t len, size_t *pos, void *dst, size_t n) {
    if (len - *pos < n) return RF_ERR_CORRUPT;
    memcpy(dst, p + *pos, n);
    *pos += n;
    return RF_OK;
}

/* One record at *pos: ids are copied NUL-terminated into *ids (grown). */
static int replay_record(const unsigned char *p, size_t len, size_t *pos, rf_buf *run, rf_buf *ids,
                         rf_doc **docs, size_t *cap, rf_dedup_journal_fn fn, void *user) {
    uint32_t magic, rl, n;
    uint64_t seq;
    if (get(p, len, pos, &magic, 4) || magic != JOURNAL_MAGIC || get(p, len, pos, &rl, 4) ||
        len - *pos < rl)
        return RF_ERR_CORRUPT;
    run->len = 0;
    if (rf_buf_append(run, p + *pos, rl) || rf_buf_putc(run, '\0')) return RF_ERR_NOMEM;
    *pos += rl;
    if (get(p, len, pos, &seq, 8) || get(p, len, pos, &n, 4)) return RF_ERR_CORRUPT;
    if (n > *cap) {
        rf_doc *d = realloc(*docs, n * sizeof *d);
        if (!d) return RF_ERR_NOMEM;
        *docs = d;
        *cap = n;
    }
    /* ids move while the buffer grows: keep offsets, make pointers after */
    ids->len = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t il;
        if (get(p, len, pos, &il, 4) || len - *pos < il) return RF_ERR_CORRUPT;
        (*docs)[i] = (rf_doc){.id = (char *)(uintptr_t)ids->len, .label = RF_LABEL_NONE};
        if (rf_buf_append(ids, p + *pos, il) || rf_buf_putc(ids, '\0')) return RF_ERR_NOMEM;
        *pos += il;
    }
    for (uint32_t i = 0; i < n; i++) {
        (*docs)[i].id = ids->data + (uintptr_t)(*docs)[i].id;
        (*docs)[i].text = "";
    }
    return fn(user, run->data, seq, *docs, n);
}

int rf_dedup_journal_replay(rf_dedup_journal *j, rf_dedup_journal_fn fn, void *user) {
    unsigned char *p = NULL;
    int rc = RF_OK;
    if (j->size && !(p = malloc(j->size))) return RF_ERR_NOMEM;
    if (j->size && (fseeko(j->f, 0, SEEK_SET) != 0 || fread(p, 1, j->size, j->f) != j->size))
        rc = rf_fail(RF_ERR_IO, "dedup journal %s: cannot read", j->path);
    rf_buf run = RF_BUF_INIT, ids = RF_BUF_INIT;
    rf_doc *docs = NULL;
    size_t cap = 0, pos = 0;
    while (!rc && pos < j->size) {
        rc = replay_record(p, j->size, &pos, &run, &ids, &docs, &cap, fn, user);
        if (rc == RF_ERR_CORRUPT)
            rc = rf_fail(RF_ERR_CORRUPT, "dedup journal %s: malformed record before byte %zu",
                         j->path, pos);
    }
    free(docs);
    rf_buf_free(&run);
    rf_buf_free(&ids);
    free(p);
    return rc;
}
