#include "trainer/checkpoint.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/sys.h"

#define MAGIC        "RFCKPT02"
#define MAGIC_V1     "RFCKPT01" /* before the identity words */
#define HEADER_WORDS 11         /* nparams step epoch pos rng[4] micro ident.data ident.opts */

int rf_checkpoint_save(const char *path, const rf_bert *m, const rf_train_state *s) {
    return rf_checkpoint_save_blocks(path, m, m->m, m->v, s);
}

int rf_checkpoint_save_blocks(const char *path, const rf_bert *m, const float *mom1,
                              const float *mom2, const rf_train_state *s) {
    size_t np = m->nparams, len = 8 + 8 * HEADER_WORDS + 3 * np * sizeof(float) + 8;
    uint8_t *buf = malloc(len);
    if (!buf) return rf_fail(RF_ERR_NOMEM, "checkpoint: no memory for %zu bytes", len);
    uint64_t hdr[HEADER_WORDS] = {np,          s->step,       s->epoch,     s->pos,
                                  s->rng.s[0], s->rng.s[1],   s->rng.s[2],  s->rng.s[3],
                                  s->micro,    s->ident.data, s->ident.opts};
    uint8_t *p = buf;
    memcpy(p, MAGIC, 8);
    memcpy(p + 8, hdr, sizeof hdr);
    p += 8 + sizeof hdr;
    const float *blocks[3] = {m->params, mom1, mom2};
    for (int b = 0; b < 3; b++) {
        int rc = m->be->to_host(m->be, p, blocks[b], np * sizeof(float));
        if (rc) {
            free(buf);
            return rf_fail_ctx(rc, "checkpoint: reading the model");
        }
        p += np * sizeof(float);
    }
    uint64_t h = rf_hash64(buf, (size_t)(p - buf), 0);
    memcpy(p, &h, 8);
    int rc = rf_write_file_atomic(path, buf, len);
    free(buf);
    if (rc) return rf_fail_ctx(rc, "checkpoint: cannot write %s", path);
    return RF_OK;
}

int rf_checkpoint_load(const char *path, rf_bert *m, rf_train_state *s) {
    return rf_checkpoint_load_range(path, m, s, 0, m->nparams);
}

int rf_checkpoint_load_range(const char *path, rf_bert *m, rf_train_state *s, size_t lo,
                             size_t hi) {
    char *buf;
    size_t len, np = m->nparams;
    int rc = rf_read_file(path, (size_t)64 << 30, &buf, &len);
    if (rc) return rf_fail_ctx(rc, "checkpoint: cannot read %s", path);
    size_t want = 8 + 8 * HEADER_WORDS + 3 * np * sizeof(float) + 8;
    uint64_t hdr[HEADER_WORDS], h;
    if (len >= 8 && memcmp(buf, MAGIC_V1, 8) == 0) {
        rc = rf_fail(RF_ERR_INVALID,
                     "checkpoint %s: old format " MAGIC_V1 " (no record of its data); delete it "
                     "to train from the start",
                     path);
        goto out;
    }
    if (len < 8 + sizeof hdr || memcmp(buf, MAGIC, 8) != 0) {
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint %s: not a Refinery checkpoint", path);
        goto out;
    }
    memcpy(hdr, buf + 8, sizeof hdr);
    if (hdr[0] != np) {
        rc = rf_fail(RF_ERR_INVALID, "checkpoint %s: %llu parameters, the model has %zu", path,
                     (unsigned long long)hdr[0], np);
        goto out;
    }
    if (len != want) {
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint %s: %zu bytes, expected %zu (truncated?)", path,
                     len, want);
        goto out;
    }
    memcpy(&h, buf + len - 8, 8);
    if (rf_hash64(buf, len - 8, 0) != h) {
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint %s: checksum mismatch", path);
        goto out;
    }
    if (hdr[9] != s->ident.data || hdr[10] != s->ident.opts) {
        rc = rf_fail(RF_ERR_INVALID,
                     "checkpoint %s belongs to another run: its training %s differ (checkpoint "
                     "%016llx, this run %016llx); delete it or set resume: false to start over",
                     path, hdr[9] != s->ident.data ? "data" : "options",
                     (unsigned long long)(hdr[9] != s->ident.data ? hdr[9] : hdr[10]),
                     (unsigned long long)(hdr[9] != s->ident.data ? s->ident.data : s->ident.opts));
        goto out;
    }
    if (lo > hi || hi > np || hi - lo > m->nmoments) {
        rc = rf_fail(RF_ERR_INVALID, "checkpoint %s: moment range [%zu, %zu) does not fit", path,
                     lo, hi);
        goto out;
    }
    const char *p = buf + 8 + sizeof hdr;
    rc = m->be->to_device(m->be, m->params, p, np * sizeof(float));
    p += np * sizeof(float);
    if (!rc) rc = m->be->to_device(m->be, m->m, p + lo * sizeof(float), (hi - lo) * sizeof(float));
    p += np * sizeof(float);
    if (!rc) rc = m->be->to_device(m->be, m->v, p + lo * sizeof(float), (hi - lo) * sizeof(float));
    if (rc) goto out;
    s->step = hdr[1];
    s->epoch = hdr[2];
    s->pos = hdr[3];
    for (int i = 0; i < 4; i++)
        s->rng.s[i] = hdr[4 + i];
    s->micro = hdr[8];
out:
    free(buf);
    return rc;
}
