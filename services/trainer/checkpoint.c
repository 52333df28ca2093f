#include "trainer/checkpoint.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/sys.h"
#include "trainer/backend.h"

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

int rf_checkpoint_load_range(const char *path, rf_bert *b, rf_train_state *s, size_t lo,
                             size_t hi) {
    rf_model_blocks m = rf_bert_blocks(b);
    return rf_ckpt_load_range(path, &m, s, lo, hi);
}

int rf_ckpt_load_range(const char *path, const rf_model_blocks *m, rf_train_state *s, size_t lo,
                       size_t hi) {
    size_t np = m->nparams;
    if (lo > hi || hi > np || hi - lo > m->nmoments)
        return rf_fail(RF_ERR_INVALID, "checkpoint %s: moment range [%zu, %zu) does not fit", path,
                       lo, hi);
    if (m->be == rf_backend_cpu()) { /* host memory: the pieces are the model's own buffers */
        rf_ckpt_piece pc[2] = {{0, np, m->params, NULL, NULL}, {lo, hi, NULL, m->m, m->v}};
        return rf_checkpoint_load_pieces(path, np, s, pc, 2);
    }
    /* device memory: read into host blocks, then copy them over through the backend */
    float *hp = malloc(np * sizeof(float)), *hm = malloc((hi - lo + 1) * sizeof(float)),
          *hv = malloc((hi - lo + 1) * sizeof(float));
    int rc =
        hp && hm && hv ? RF_OK : rf_fail(RF_ERR_NOMEM, "checkpoint: no memory to stage %s", path);
    rf_ckpt_piece pc[2] = {{0, np, hp, NULL, NULL}, {lo, hi, NULL, hm, hv}};
    if (!rc) rc = rf_checkpoint_load_pieces(path, np, s, pc, 2);
    if (!rc) rc = m->be->to_device(m->be, m->params, hp, np * sizeof(float));
    if (!rc) rc = m->be->to_device(m->be, m->m, hm, (hi - lo) * sizeof(float));
    if (!rc) rc = m->be->to_device(m->be, m->v, hv, (hi - lo) * sizeof(float));
    free(hp);
    free(hm);
    free(hv);
    return rc;
}

/* ---- Sharded checkpoints (see checkpoint.h) ---- */

#define SHARD_MAGIC    "RFSHRD01"
#define MANIFEST_MAGIC "RFCKPT03"
#define ENTRY_BYTES    136
#define MANIFEST_WORDS 14 /* HEADER_WORDS + world zero nshards */
#define DIR_BYTES      32

static void step_dir(char *out, size_t cap, const char *out_dir, uint64_t step) {
    snprintf(out, cap, "%s/checkpoint.d/step-%08llu", out_dir, (unsigned long long)step);
}

static void put64(uint8_t **p, uint64_t v) {
    memcpy(*p, &v, 8);
    *p += 8;
}

static void put32(uint8_t **p, uint32_t v) {
    memcpy(*p, &v, 4);
    *p += 4;
}

static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

int rf_checkpoint_write_shard(const char *out_dir, const rf_bert *b, const rf_train_state *s,
                              int rank, int world, const rf_ckpt_piece *pc, size_t npc,
                              uint64_t *size, uint64_t *hash) {
    rf_model_blocks m = rf_bert_blocks(b);
    return rf_ckpt_write_shard(out_dir, &m, s, rank, world, pc, npc, size, hash);
}

int rf_ckpt_write_shard(const char *out_dir, const rf_model_blocks *m, const rf_train_state *s,
                        int rank, int world, const rf_ckpt_piece *pc, size_t npc, uint64_t *size,
                        uint64_t *hash) {
    /* count the entries (pieces cut at tensor boundaries) and floats */
    size_t nent = 0, nfl = 0;
    for (size_t i = 0; i < npc; i++)
        for (size_t t = 0; t < m->ntensors; t++) {
            const rf_tensor_info *ti = &m->tensors[t];
            size_t a = ti->offset > pc[i].lo ? ti->offset : pc[i].lo;
            size_t b = ti->offset + ti->numel < pc[i].hi ? ti->offset + ti->numel : pc[i].hi;
            if (a < b) {
                nent++;
                nfl += b - a;
            }
        }
    size_t len = 8 + 4 + 4 + 8 + 8 + nent * ENTRY_BYTES + 3 * nfl * sizeof(float) + 8;
    uint8_t *buf = calloc(1, len);
    if (!buf) return rf_fail(RF_ERR_NOMEM, "checkpoint: no memory for a %zu-byte shard", len);
    uint8_t *h = buf, *d = buf + 32 + nent * ENTRY_BYTES;
    memcpy(h, SHARD_MAGIC, 8);
    h += 8;
    put32(&h, (uint32_t)rank);
    put32(&h, (uint32_t)world);
    put64(&h, m->nparams);
    put64(&h, nent);
    for (size_t i = 0; i < npc; i++)
        for (size_t t = 0; t < m->ntensors; t++) {
            const rf_tensor_info *ti = &m->tensors[t];
            size_t a = ti->offset > pc[i].lo ? ti->offset : pc[i].lo;
            size_t b = ti->offset + ti->numel < pc[i].hi ? ti->offset + ti->numel : pc[i].hi;
            if (a >= b) continue;
            memcpy(h, ti->name, sizeof ti->name); /* 96 bytes, NUL-padded */
            h += 96;
            put32(&h, (uint32_t)ti->ndim);
            put32(&h, (uint32_t)ti->shape[0]);
            put32(&h, (uint32_t)ti->shape[1]);
            put32(&h, 0);
            put64(&h, ti->offset);
            put64(&h, a - ti->offset);
            put64(&h, b - a);
            const float *src[3] = {pc[i].p, pc[i].m1, pc[i].m2};
            for (int k = 0; k < 3; k++) {
                if (src[k]) memcpy(d, src[k] + (a - pc[i].lo), (b - a) * sizeof(float));
                d += (b - a) * sizeof(float);
            }
        }
    uint64_t x = rf_hash64(buf, len - 8, 0);
    memcpy(buf + len - 8, &x, 8);
    char dir[4096], path[4200];
    step_dir(dir, sizeof dir, out_dir, s->step);
    int rc = rf_mkdir_p(dir);
    if (!rc) {
        snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.bin", dir, rank, world);
        rc = rf_write_file_atomic(path, buf, len);
        if (rc) rc = rf_fail_ctx(rc, "checkpoint: cannot write %s", path);
    } else {
        rc = rf_fail_ctx(rc, "checkpoint: cannot create %s", dir);
    }
    free(buf);
    *size = len;
    *hash = x;
    return rc;
}

/* Removes <out_dir>/checkpoint.d/step-* other than `keep` (with their files). */
static void prune(const char *out_dir, uint64_t keep) {
    char base[4096], want[64];
    snprintf(base, sizeof base, "%s/checkpoint.d", out_dir);
    snprintf(want, sizeof want, "step-%08llu", (unsigned long long)keep);
    DIR *dd = opendir(base);
    if (!dd) return;
    struct dirent *e;
    while ((e = readdir(dd))) {
        if (strncmp(e->d_name, "step-", 5) != 0 || strcmp(e->d_name, want) == 0) continue;
        char sub[4400];
        snprintf(sub, sizeof sub, "%s/%s", base, e->d_name);
        DIR *sd = opendir(sub);
        if (!sd) continue;
        struct dirent *f;
        while ((f = readdir(sd))) {
            if (f->d_name[0] == '.' && (!f->d_name[1] || (f->d_name[1] == '.' && !f->d_name[2])))
                continue;
            char fp[4700];
            snprintf(fp, sizeof fp, "%s/%s", sub, f->d_name);
            unlink(fp);
        }
        closedir(sd);
        rmdir(sub);
    }
    closedir(dd);
}

int rf_checkpoint_commit(const char *out_dir, const rf_bert *m, const rf_train_state *s, int world,
                         int zero, const uint64_t *sizes, const uint64_t *hashes) {
    return rf_ckpt_commit(out_dir, m->nparams, s, world, zero, sizes, hashes);
}

int rf_ckpt_commit(const char *out_dir, size_t nparams, const rf_train_state *s, int world,
                   int zero, const uint64_t *sizes, const uint64_t *hashes) {
    size_t len = 8 + 8 * MANIFEST_WORDS + DIR_BYTES + 16 * (size_t)world + 8;
    uint8_t *buf = calloc(1, len), *p = buf;
    if (!buf) return RF_ERR_NOMEM;
    uint64_t hdr[MANIFEST_WORDS] = {nparams,        s->step,        s->epoch,      s->pos,
                                    s->rng.s[0],    s->rng.s[1],    s->rng.s[2],   s->rng.s[3],
                                    s->micro,       s->ident.data,  s->ident.opts, (uint64_t)world,
                                    (uint64_t)zero, (uint64_t)world};
    memcpy(p, MANIFEST_MAGIC, 8);
    p += 8;
    memcpy(p, hdr, sizeof hdr);
    p += sizeof hdr;
    snprintf((char *)p, DIR_BYTES, "step-%08llu", (unsigned long long)s->step);
    p += DIR_BYTES;
    for (int w = 0; w < world; w++) {
        put64(&p, sizes[w]);
        put64(&p, hashes[w]);
    }
    uint64_t x = rf_hash64(buf, len - 8, 0);
    memcpy(p, &x, 8);
    char dir[4096], path[4200];
    step_dir(dir, sizeof dir, out_dir, s->step);
    snprintf(path, sizeof path, "%s/manifest.bin", dir);
    int rc = rf_write_file_atomic(path, buf, len);
    if (!rc) { /* the marker: the manifest's checksum, as text */
        char mark[32];
        int n = snprintf(mark, sizeof mark, "%016llx\n", (unsigned long long)x);
        snprintf(path, sizeof path, "%s/COMPLETE", dir);
        rc = rf_write_file_atomic(path, mark, (size_t)n);
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/checkpoint.bin", out_dir);
        rc = rf_write_file_atomic(path, buf, len);
    }
    free(buf);
    if (rc) return rf_fail_ctx(rc, "checkpoint: cannot write %s", path);
    prune(out_dir, s->step);
    return RF_OK;
}

static int check_ident(const char *path, const uint64_t *hdr, const rf_train_state *s) {
    if (hdr[9] == s->ident.data && hdr[10] == s->ident.opts) return RF_OK;
    return rf_fail(RF_ERR_INVALID,
                   "checkpoint %s belongs to another run: its training %s differ (checkpoint "
                   "%016llx, this run %016llx); delete it or set resume: false to start over",
                   path, hdr[9] != s->ident.data ? "data" : "options",
                   (unsigned long long)(hdr[9] != s->ident.data ? hdr[9] : hdr[10]),
                   (unsigned long long)(hdr[9] != s->ident.data ? s->ident.data : s->ident.opts));
}

static void state_from(const uint64_t *hdr, rf_train_state *s) {
    s->step = hdr[1];
    s->epoch = hdr[2];
    s->pos = hdr[3];
    for (int i = 0; i < 4; i++)
        s->rng.s[i] = hdr[4 + i];
    s->micro = hdr[8];
}

/* Copies the overlap of [a, a + n) (source block src, element a at src[0])
 * with each wanted piece's block k; counts what was copied. */
static void copy_overlaps(size_t a, size_t n, const uint8_t *src, const rf_ckpt_piece *pc,
                          size_t npc, int k, size_t *got) {
    for (size_t i = 0; i < npc; i++) {
        float *dst = k == 0 ? pc[i].p : k == 1 ? pc[i].m1 : pc[i].m2;
        if (!dst) continue;
        size_t x = a > pc[i].lo ? a : pc[i].lo, y = a + n < pc[i].hi ? a + n : pc[i].hi;
        if (x >= y) continue;
        memcpy(dst + (x - pc[i].lo), src + (x - a) * sizeof(float), (y - x) * sizeof(float));
        got[k] += y - x;
    }
}

/* Reads one shard file, checks it against the manifest and itself, copies the
 * wanted overlaps. */
static int load_shard(const char *path, size_t np, uint64_t size, uint64_t hash,
                      const rf_ckpt_piece *pc, size_t npc, size_t *got) {
    char *buf;
    size_t len;
    int rc = rf_read_file(path, (size_t)64 << 30, &buf, &len);
    if (rc) return rf_fail_ctx(rc, "checkpoint: cannot read shard %s", path);
    const uint8_t *b = (const uint8_t *)buf;
    uint64_t x;
    if (len != size || len < 40 || memcmp(b, SHARD_MAGIC, 8) != 0) {
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint shard %s: %zu bytes, the manifest says %llu", path,
                     len, (unsigned long long)size);
        goto out;
    }
    memcpy(&x, b + len - 8, 8);
    if (x != hash || rf_hash64(b, len - 8, 0) != x) {
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint shard %s: checksum mismatch", path);
        goto out;
    }
    uint64_t nent = get64(b + 24);
    if (get64(b + 16) != np || nent > (len - 40) / ENTRY_BYTES) {
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint shard %s: bad header", path);
        goto out;
    }
    const uint8_t *e = b + 32, *d = b + 32 + nent * ENTRY_BYTES;
    for (uint64_t i = 0; i < nent; i++, e += ENTRY_BYTES) {
        uint64_t off = get64(e + 112), start = get64(e + 120), cnt = get64(e + 128);
        uint64_t numel = (uint64_t)get32(e + 100) * (get32(e + 96) > 1 ? get32(e + 104) : 1);
        if (start + cnt > numel || off + numel > np ||
            (size_t)(d - b) + 3 * cnt * sizeof(float) > len - 8) {
            rc = rf_fail(RF_ERR_CORRUPT, "checkpoint shard %s: entry %llu out of range", path,
                         (unsigned long long)i);
            goto out;
        }
        for (int k = 0; k < 3; k++) {
            copy_overlaps(off + start, cnt, d, pc, npc, k, got);
            d += cnt * sizeof(float);
        }
    }
out:
    free(buf);
    return rc;
}

int rf_checkpoint_load_pieces(const char *path, size_t np, rf_train_state *s,
                              const rf_ckpt_piece *pc, size_t npc) {
    size_t want[3] = {0, 0, 0}, got[3] = {0, 0, 0};
    for (size_t i = 0; i < npc; i++) {
        if (pc[i].lo > pc[i].hi || pc[i].hi > np)
            return rf_fail(RF_ERR_INVALID, "checkpoint %s: range [%zu, %zu) outside %zu", path,
                           pc[i].lo, pc[i].hi, np);
        want[0] += pc[i].p ? pc[i].hi - pc[i].lo : 0;
        want[1] += pc[i].m1 ? pc[i].hi - pc[i].lo : 0;
        want[2] += pc[i].m2 ? pc[i].hi - pc[i].lo : 0;
    }
    char *buf;
    size_t len;
    int rc = rf_read_file(path, (size_t)64 << 30, &buf, &len);
    if (rc) return rf_fail_ctx(rc, "checkpoint: cannot read %s", path);
    const uint8_t *b = (const uint8_t *)buf;
    uint64_t hdr[MANIFEST_WORDS];
    if (len >= 8 && memcmp(b, MAGIC_V1, 8) == 0) {
        rc = rf_fail(RF_ERR_INVALID,
                     "checkpoint %s: old format " MAGIC_V1 " (no record of its data); delete it "
                     "to train from the start",
                     path);
        goto out;
    }
    if (len >= 8 && memcmp(b, MAGIC, 8) == 0) { /* one file: its blocks are the whole range */
        size_t need = 8 + 8 * HEADER_WORDS + 3 * np * sizeof(float) + 8;
        uint64_t h;
        memcpy(hdr, b + 8, 8 * HEADER_WORDS);
        if (hdr[0] != np) {
            rc = rf_fail(RF_ERR_INVALID, "checkpoint %s: %llu parameters, the model has %zu", path,
                         (unsigned long long)hdr[0], np);
            goto out;
        }
        if (len != need) {
            rc = rf_fail(RF_ERR_CORRUPT, "checkpoint %s: %zu bytes, expected %zu (truncated?)",
                         path, len, need);
            goto out;
        }
        memcpy(&h, b + len - 8, 8);
        if (rf_hash64(b, len - 8, 0) != h) {
            rc = rf_fail(RF_ERR_CORRUPT, "checkpoint %s: checksum mismatch", path);
            goto out;
        }
        if ((rc = check_ident(path, hdr, s))) goto out;
        for (int k = 0; k < 3; k++)
            copy_overlaps(0, np, b + 8 + 8 * HEADER_WORDS + (size_t)k * np * sizeof(float), pc, npc,
                          k, got);
        state_from(hdr, s);
        goto out;
    }
    size_t fixed = 8 + 8 * MANIFEST_WORDS + DIR_BYTES;
    if (len < fixed + 8 || memcmp(b, MANIFEST_MAGIC, 8) != 0) {
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint %s: not a Refinery checkpoint", path);
        goto out;
    }
    memcpy(hdr, b + 8, sizeof hdr);
    uint64_t nsh = hdr[13], h;
    if (nsh == 0 || nsh > 1u << 20 || len != fixed + 16 * nsh + 8) {
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint %s: %zu bytes, not a whole manifest (truncated?)",
                     path, len);
        goto out;
    }
    memcpy(&h, b + len - 8, 8);
    if (rf_hash64(b, len - 8, 0) != h) {
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint %s: checksum mismatch", path);
        goto out;
    }
    if (hdr[0] != np) {
        rc = rf_fail(RF_ERR_INVALID, "checkpoint %s: %llu parameters, the model has %zu", path,
                     (unsigned long long)hdr[0], np);
        goto out;
    }
    if ((rc = check_ident(path, hdr, s))) goto out;
    char sdir[DIR_BYTES + 1], base[4096], dir[4200], fp[4400];
    memcpy(sdir, b + 8 + 8 * MANIFEST_WORDS, DIR_BYTES);
    sdir[DIR_BYTES] = 0;
    if (strchr(sdir, '/') || strncmp(sdir, "step-", 5) != 0) {
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint %s: bad step directory name", path);
        goto out;
    }
    /* the step directory lies beside the manifest's checkpoint.d: path is
     * <out>/checkpoint.bin or <out>/checkpoint.d/step-N/manifest.bin */
    snprintf(base, sizeof base, "%s", path);
    char *slash = strrchr(base, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(base, sizeof base, ".");
    if (strstr(base, "/checkpoint.d/step-") || strncmp(base, "checkpoint.d/step-", 18) == 0)
        snprintf(dir, sizeof dir, "%s", base);
    else
        snprintf(dir, sizeof dir, "%s/checkpoint.d/%s", base, sdir);
    char *mark = NULL;
    size_t mlen;
    snprintf(fp, sizeof fp, "%s/COMPLETE", dir);
    if (rf_read_file(fp, 64, &mark, &mlen) != RF_OK || mlen < 16 || strtoull(mark, NULL, 16) != h) {
        free(mark);
        rc = rf_fail(RF_ERR_CORRUPT, "checkpoint %s: %s is missing or does not match (incomplete)",
                     path, fp);
        goto out;
    }
    free(mark);
    const uint8_t *sh = b + fixed;
    for (uint64_t w = 0; w < nsh && !rc; w++) {
        snprintf(fp, sizeof fp, "%s/shard-%05llu-of-%05llu.bin", dir, (unsigned long long)w,
                 (unsigned long long)nsh);
        rc = load_shard(fp, np, get64(sh + 16 * w), get64(sh + 16 * w + 8), pc, npc, got);
    }
    if (!rc) state_from(hdr, s);
out:
    if (!rc && (got[0] != want[0] || got[1] != want[1] || got[2] != want[2]))
        rc = rf_fail(RF_ERR_CORRUPT,
                     "checkpoint %s: its shards cover %zu/%zu/%zu of the %zu/%zu/%zu wanted "
                     "parameter/moment elements",
                     path, got[0], got[1], got[2], want[0], want[1], want[2]);
    free(buf);
    return rc;
}
