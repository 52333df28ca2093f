#include "dedup/dedup.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/sys.h"
#include "dedup/index_log.h"
#include "dedup/jaccard.h"
#include "dedup/minhash.h"
#include "dedup/normalize.h"
#include "dedup/shingle.h"
#include "dedup/table.h"

/* Payload of one committed batch (little-endian):
 *   u64 first_seq | u32 ndocs | u32 0 | u64 kept_bytes | u64 dups_bytes | ndocs doc records
 * Doc record: a 56-byte head, then keys[nkeys] u64, merges[nmerge] u32,
 * id[id_len], set[set_len] u32:
 *   u8 kind | u8 flags | u16 pairs_checked | u32 target | f32 jaccard | u32 nkeys |
 *   u32 nmerge | u32 id_len | u32 set_len | u32 set_total | u64 hash.lo | u64 hash.hi |
 *   u32 matched | u32 0
 * matched is the verified candidate with the best Jaccard (near duplicates);
 * target is the representative chosen at decision time (the doc itself if kept);
 * merges are the other cluster roots this document joined into target. */
#define BATCH_HEAD    32
#define REC_HEAD      56
#define FLAG_VERIFIED 1u
#define FLAG_EXACT_J  2u
#define MAX_DOCS      (UINT32_MAX - 1)

typedef struct dd_node {
    uint64_t voff;   /* index file offset of the doc record */
    uint32_t parent; /* union-find parent; a duplicate points at its representative */
    uint32_t size;   /* documents in the cluster, valid at roots */
} dd_node;

typedef struct dd_rec {
    uint8_t kind, flags;
    uint16_t pairs;
    uint32_t target, nkeys, nmerge, id_len, set_len, set_total, matched;
    float jaccard;
    rf_hash128 hash;
} dd_rec;

/* Per-document work done in parallel before the sequential decisions. */
typedef struct dd_prep {
    rf_hash128 hash;
    uint32_t exact_of; /* seq of an earlier identical text, or RF_TABLE_MISSING */
    uint32_t nshingles;
    uint32_t *set; /* malloc'd bottom-set_cap distinct shingle folds */
    uint32_t set_len, set_total;
    char *norm; /* normalized text (between the two parallel phases) */
    size_t norm_len;
    int rc;
} dd_prep;

struct rf_dedup {
    rf_dedup_opts o;
    rf_minhash mh;
    rf_ddlog *log;
    rf_band_table bands;
    rf_exact_table exact;
    dd_node *nodes;
    size_t nnodes, cap;
    uint64_t committed, pending_first;
    uint64_t pos; /* documents passed to process() by this process */
    uint64_t kept_bytes, dups_bytes;
    uint64_t count[3];
    uint64_t pairs_checked, confirmed, merges, estimated;
    double t_prep, t_decide, t_commit; /* seconds spent by this process */
    /* Scratch for the sequential phase. */
    uint32_t *cand_set;
    size_t cand_cap;
    char *rid;
    size_t rid_cap;
};

void rf_dedup_opts_default(rf_dedup_opts *o) {
    *o = (rf_dedup_opts){.ngram = 5,
                         .char_mode = false,
                         .bands = 20,
                         .rows = 5,
                         .norm = RF_NORM_ALL,
                         .verify = true,
                         .threshold = 0.7,
                         .set_cap = 2048,
                         .seed = 0x5eedd0d0ull,
                         .threads = 1};
}

int rf_dedup_opts_check(const rf_dedup_opts *o) {
    if (o->ngram < 1 || o->ngram > 64)
        return rf_fail(RF_ERR_INVALID, "ngram %d: expected 1..64", o->ngram);
    if (o->bands < 1 || o->rows < 1 || o->bands * o->rows > RF_MINHASH_MAX_PERM)
        return rf_fail(RF_ERR_INVALID, "bands %d x rows %d: need >= 1 each, <= %d permutations",
                       o->bands, o->rows, RF_MINHASH_MAX_PERM);
    if (!(o->threshold > 0 && o->threshold <= 1))
        return rf_fail(RF_ERR_INVALID, "threshold %g: expected (0, 1]", o->threshold);
    if (o->set_cap < 16 || o->set_cap > 1 << 20)
        return rf_fail(RF_ERR_INVALID, "set cap %d: expected 16..1048576", o->set_cap);
    if (o->threads < 1 || o->threads > 256)
        return rf_fail(RF_ERR_INVALID, "threads %d: expected 1..256", o->threads);
    if (o->norm & ~(unsigned)RF_NORM_ALL)
        return rf_fail(RF_ERR_INVALID, "unknown normalization flags 0x%x", o->norm);
    return RF_OK;
}

const char *rf_dd_kind_name(rf_dd_kind k) {
    return k == RF_DD_EXACT ? "exact" : k == RF_DD_NEAR ? "near" : "kept";
}

void rf_dd_results_clear(rf_dd_result *res, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(res[i].kept_id);
        free(res[i].matched_id);
    }
    memset(res, 0, n * sizeof *res);
}

int rf_dd_dup_json(const rf_doc *doc, const rf_dd_result *res, rf_buf *out) {
    const char *kid = res->kept_id ? res->kept_id : "";
    int rc = rf_buf_puts(out, "{\"id\":");
    rc |= rf_buf_append_json_str(out, doc->id ? doc->id : "", doc->id ? strlen(doc->id) : 0);
    rc |= rf_buf_puts(out, ",\"kept_id\":");
    rc |= rf_buf_append_json_str(out, kid, strlen(kid));
    rc |= rf_buf_printf(out, ",\"kind\":\"%s\"", rf_dd_kind_name(res->kind));
    if (res->verified) rc |= rf_buf_printf(out, ",\"jaccard\":%.4f", (double)res->jaccard);
    if (res->matched_id) {
        rc |= rf_buf_puts(out, ",\"matched_id\":");
        rc |= rf_buf_append_json_str(out, res->matched_id, strlen(res->matched_id));
    }
    rc |= rf_buf_printf(out, ",\"cluster\":\"%016llx\"}", (unsigned long long)res->cluster);
    return rc ? RF_ERR_NOMEM : RF_OK;
}

/* ---- union-find ---- */

static uint32_t find(rf_dedup *d, uint32_t x) {
    uint32_t r = x;
    while (d->nodes[r].parent != r)
        r = d->nodes[r].parent;
    while (d->nodes[x].parent != r) {
        uint32_t next = d->nodes[x].parent;
        d->nodes[x].parent = r;
        x = next;
    }
    return r;
}

static int add_node(rf_dedup *d, uint64_t voff, uint32_t parent) {
    if (d->nnodes >= MAX_DOCS)
        return rf_fail(RF_ERR_RANGE, "dedup index is full (%u documents)", MAX_DOCS);
    if (d->nnodes == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4096;
        dd_node *n = realloc(d->nodes, cap * sizeof *n);
        if (!n) return RF_ERR_NOMEM;
        d->nodes = n;
        d->cap = cap;
    }
    d->nodes[d->nnodes++] = (dd_node){voff, parent, 1};
    return RF_OK;
}

/* ---- doc records ---- */

static void rec_encode(const dd_rec *r, unsigned char h[REC_HEAD]) {
    const uint32_t f[7] = {r->target, 0, r->nkeys, r->nmerge, r->id_len, r->set_len, r->set_total};
    memset(h, 0, REC_HEAD);
    h[0] = r->kind;
    h[1] = r->flags;
    memcpy(h + 2, &r->pairs, 2);
    memcpy(h + 4, f, sizeof f); /* f[1] is the jaccard slot, written next */
    memcpy(h + 8, &r->jaccard, 4);
    memcpy(h + 32, &r->hash.lo, 8);
    memcpy(h + 40, &r->hash.hi, 8);
    memcpy(h + 48, &r->matched, 4);
}

static void rec_decode(const unsigned char h[REC_HEAD], dd_rec *r) {
    uint32_t f[7];
    memcpy(f, h + 4, sizeof f);
    r->kind = h[0];
    r->flags = h[1];
    memcpy(&r->pairs, h + 2, 2);
    r->target = f[0];
    memcpy(&r->jaccard, h + 8, 4);
    r->nkeys = f[2];
    r->nmerge = f[3];
    r->id_len = f[4];
    r->set_len = f[5];
    r->set_total = f[6];
    memcpy(&r->hash.lo, h + 32, 8);
    memcpy(&r->hash.hi, h + 40, 8);
    memcpy(&r->matched, h + 48, 4);
}

static uint64_t rec_id_off(const dd_rec *r) {
    return REC_HEAD + 8ull * r->nkeys + 4ull * r->nmerge;
}

static int read_rec(const rf_dedup *d, uint32_t seq, dd_rec *r) {
    unsigned char h[REC_HEAD];
    int rc = rf_ddlog_read(d->log, d->nodes[seq].voff, h, REC_HEAD);
    if (!rc) rec_decode(h, r);
    return rc;
}

/* Reads doc seq's id into d->rid (NUL-terminated). */
static int read_id(rf_dedup *d, uint32_t seq, size_t *len) {
    dd_rec r;
    int rc = read_rec(d, seq, &r);
    if (rc) return rc;
    if (r.id_len + 1 > d->rid_cap) {
        char *p = realloc(d->rid, r.id_len + 1);
        if (!p) return RF_ERR_NOMEM;
        d->rid = p;
        d->rid_cap = r.id_len + 1;
    }
    if ((rc = rf_ddlog_read(d->log, d->nodes[seq].voff + rec_id_off(&r), d->rid, r.id_len)))
        return rc;
    d->rid[r.id_len] = '\0';
    *len = r.id_len;
    return RF_OK;
}

static int read_set(rf_dedup *d, uint32_t seq, rf_shset *out) {
    dd_rec r;
    int rc = read_rec(d, seq, &r);
    if (rc) return rc;
    if (r.set_len > d->cand_cap) {
        uint32_t *p = realloc(d->cand_set, r.set_len * sizeof *p);
        if (!p) return RF_ERR_NOMEM;
        d->cand_set = p;
        d->cand_cap = r.set_len;
    }
    if ((rc = rf_ddlog_read(d->log, d->nodes[seq].voff + rec_id_off(&r) + r.id_len, d->cand_set,
                            4ull * r.set_len)))
        return rc;
    *out = (rf_shset){d->cand_set, r.set_len, r.set_total};
    return RF_OK;
}

/* Fills a result from a decision: representative id, cluster hash, and for
 * verified near duplicates the id of the best-matching candidate. */
static int fill_result(rf_dedup *d, uint32_t seq, const dd_rec *r, rf_dd_result *res) {
    res->kind = (rf_dd_kind)r->kind;
    res->jaccard = r->jaccard;
    res->verified = r->flags & FLAG_VERIFIED;
    size_t len;
    int rc = read_id(d, r->target, &len);
    if (rc) return rc;
    res->cluster = rf_hash64(d->rid, len, 0);
    if (!res->cluster) res->cluster = 1; /* 0 means "no cluster" in rf_doc */
    if (r->target != seq && !(res->kept_id = strdup(d->rid))) return RF_ERR_NOMEM;
    if (res->verified && r->kind == RF_DD_NEAR) {
        if ((rc = read_id(d, r->matched, &len))) return rc;
        if (!(res->matched_id = strdup(d->rid))) return RF_ERR_NOMEM;
    }
    return RF_OK;
}

/* ---- applying a decision (live and during replay) ---- */

static int apply(rf_dedup *d, uint64_t voff, const dd_rec *r, const uint64_t *keys,
                 const uint32_t *merges) {
    uint32_t seq = (uint32_t)d->nnodes;
    int rc = add_node(d, voff, r->kind == RF_DD_KEPT ? seq : r->target);
    if (rc) return rc;
    if (r->kind != RF_DD_EXACT && (rc = rf_exact_table_put_new(&d->exact, r->hash, seq))) return rc;
    for (uint32_t i = 0; i < r->nkeys; i++)
        if ((rc = rf_band_table_put_new(&d->bands, keys[i], seq))) return rc;
    if (r->kind != RF_DD_KEPT) {
        d->nodes[seq].size = 0;
        d->nodes[r->target].size++;
        for (uint32_t i = 0; i < r->nmerge; i++) {
            d->nodes[merges[i]].parent = r->target;
            d->nodes[r->target].size += d->nodes[merges[i]].size;
        }
    }
    d->merges += r->nmerge;
    d->count[r->kind]++;
    d->pairs_checked += r->pairs;
    if (r->kind == RF_DD_NEAR && (r->flags & FLAG_VERIFIED)) d->confirmed++;
    if ((r->flags & FLAG_VERIFIED) && !(r->flags & FLAG_EXACT_J)) d->estimated++;
    return RF_OK;
}

static int corrupt(const char *what, uint64_t seq) {
    return rf_fail(RF_ERR_CORRUPT, "dedup index: document %llu: %s", (unsigned long long)seq, what);
}

static uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Replays one committed batch, checking every field against the state so far. */
static int replay_batch(void *ctx, const unsigned char *p, size_t len, uint64_t voff) {
    rf_dedup *d = ctx;
    if (len < BATCH_HEAD) return rf_fail(RF_ERR_CORRUPT, "dedup index: short batch record");
    uint64_t first;
    memcpy(&first, p, 8);
    uint32_t ndocs = rd32(p + 8);
    if (first != d->nnodes)
        return rf_fail(RF_ERR_CORRUPT, "dedup index: batch starts at document %llu, expected %zu",
                       (unsigned long long)first, d->nnodes);
    size_t pos = BATCH_HEAD;
    uint64_t *keys = NULL;
    uint32_t *merges = NULL;
    int rc = RF_OK;
    for (uint32_t i = 0; i < ndocs && !rc; i++) {
        uint64_t seq = d->nnodes;
        dd_rec r;
        if (len - pos < REC_HEAD) {
            rc = corrupt("record runs past its batch", seq);
            break;
        }
        rec_decode(p + pos, &r);
        uint64_t need = rec_id_off(&r) + r.id_len + 4ull * r.set_len;
        if (r.nkeys > (uint32_t)d->o.bands || r.nmerge > (uint32_t)d->o.bands || need > len - pos) {
            rc = corrupt("record runs past its batch", seq);
            break;
        }
        if (r.kind > RF_DD_NEAR)
            rc = corrupt("unknown kind", seq);
        else if (r.kind == RF_DD_KEPT ? r.target != seq : r.target >= seq)
            rc = corrupt("bad representative", seq);
        else if (r.kind != RF_DD_KEPT && d->nodes[r.target].parent != r.target)
            rc = corrupt("representative is not a cluster root", seq);
        else if ((r.kind == RF_DD_EXACT) !=
                 (rf_exact_table_get(&d->exact, r.hash) != RF_TABLE_MISSING))
            rc = corrupt("exact-duplicate flag disagrees with the text hashes", seq);
        else if ((r.kind == RF_DD_EXACT && (r.nkeys || r.nmerge || r.set_len)) ||
                 (r.nkeys != 0 && r.nkeys != (uint32_t)d->o.bands) ||
                 (r.kind != RF_DD_NEAR && r.nmerge))
            rc = corrupt("inconsistent key or merge counts", seq);
        else if (r.set_len > (uint32_t)d->o.set_cap || r.set_len > r.set_total ||
                 (!d->o.verify && r.set_len))
            rc = corrupt("bad shingle set size", seq);
        else if (r.matched >= (r.kind == RF_DD_NEAR && (r.flags & FLAG_VERIFIED) ? seq : 1))
            rc = corrupt("bad matched document", seq);
        if (rc) break;
        free(keys);
        free(merges);
        keys = malloc(8ull * r.nkeys + 8);
        merges = malloc(4ull * r.nmerge + 4);
        if (!keys || !merges) {
            rc = RF_ERR_NOMEM;
            break;
        }
        memcpy(keys, p + pos + REC_HEAD, 8ull * r.nkeys);
        memcpy(merges, p + pos + REC_HEAD + 8ull * r.nkeys, 4ull * r.nmerge);
        for (uint32_t k = 0; k < r.nkeys && !rc; k++)
            if (!keys[k]) rc = corrupt("band key 0", seq);
        for (uint32_t k = 0; k < r.nmerge && !rc; k++)
            if (merges[k] >= seq || merges[k] == r.target ||
                d->nodes[merges[k]].parent != merges[k])
                rc = corrupt("merged cluster is not a root", seq);
        if (!rc) rc = apply(d, voff + pos, &r, keys, merges);
        pos += need;
    }
    free(keys);
    free(merges);
    if (rc) return rc;
    if (pos != len)
        return rf_fail(RF_ERR_CORRUPT, "dedup index: batch has %zu trailing bytes", len - pos);
    memcpy(&d->kept_bytes, p + 16, 8);
    memcpy(&d->dups_bytes, p + 24, 8);
    d->committed = d->nnodes;
    return RF_OK;
}

int rf_dedup_open(const rf_dedup_opts *o, const char *index_dir, rf_dedup **out) {
    *out = NULL;
    int rc = rf_dedup_opts_check(o);
    if (rc) return rc;
    rf_dedup *d = calloc(1, sizeof *d);
    if (!d) return RF_ERR_NOMEM;
    d->o = *o;
    if ((rc = rf_minhash_init(&d->mh, o->bands, o->rows, o->seed))) goto fail;
    rf_ddlog_params want = {(uint32_t)o->ngram,   o->char_mode, (uint32_t)o->bands,
                            (uint32_t)o->rows,    o->norm,      o->verify,
                            (uint32_t)o->set_cap, o->threshold, o->seed};
    if ((rc = rf_ddlog_open(index_dir, &want, replay_batch, d, &d->log))) goto fail;
    *out = d;
    return RF_OK;
fail:
    rf_dedup_close(d);
    return rc;
}

void rf_dedup_close(rf_dedup *d) {
    if (!d) return;
    rf_ddlog_close(d->log);
    rf_minhash_free(&d->mh);
    rf_band_table_free(&d->bands);
    rf_exact_table_free(&d->exact);
    free(d->nodes);
    free(d->cand_set);
    free(d->rid);
    free(d);
}

uint64_t rf_dedup_committed(const rf_dedup *d) {
    return d->committed;
}

void rf_dedup_out_sizes(const rf_dedup *d, uint64_t *kept_bytes, uint64_t *dups_bytes) {
    *kept_bytes = d->kept_bytes;
    *dups_bytes = d->dups_bytes;
}

/* ---- the parallel phases ---- */

typedef struct dd_scratch {
    rf_buf norm;
    rf_u64vec sh;
    uint32_t *sig;
} dd_scratch;

static void prep_hash(const rf_dedup *d, const rf_doc *doc, dd_prep *p, rf_buf *norm) {
    p->rc =
        rf_normalize(doc->text ? doc->text : "", doc->text ? doc->text_len : 0, d->o.norm, norm);
    if (p->rc) return;
    p->hash = rf_hash128_of(norm->data, norm->len, 0);
    p->norm_len = norm->len;
    if (!(p->norm = malloc(norm->len + 1))) {
        p->rc = RF_ERR_NOMEM;
        return;
    }
    memcpy(p->norm, norm->data, norm->len + 1);
}

static void prep_sign(const rf_dedup *d, dd_prep *p, uint64_t *keys, dd_scratch *s) {
    p->rc = rf_shingle(p->norm, p->norm_len, d->o.ngram, d->o.char_mode, &s->sh);
    if (p->rc) return;
    p->nshingles = (uint32_t)s->sh.n;
    if (!s->sh.n) return;
    rf_minhash_sign(&d->mh, s->sh.v, s->sh.n, s->sig);
    rf_minhash_band_keys(&d->mh, s->sig, keys);
    if (!d->o.verify) return;
    uint32_t *set = malloc(s->sh.n * sizeof *set);
    if (!set) {
        p->rc = RF_ERR_NOMEM;
        return;
    }
    for (size_t i = 0; i < s->sh.n; i++)
        set[i] = rf_minhash_fold(s->sh.v[i]);
    size_t distinct = rf_shset_build(set, s->sh.n);
    p->set = set;
    p->set_total = (uint32_t)distinct;
    p->set_len = (uint32_t)(distinct < (size_t)d->o.set_cap ? distinct : (size_t)d->o.set_cap);
}

/* ---- the sequential decision ---- */

static int cmp_u32(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

static int append_record(rf_dedup *d, const dd_rec *r, const uint64_t *keys, const uint32_t *merges,
                         const rf_doc *doc, const uint32_t *set, uint64_t *voff) {
    rf_buf *pb = rf_ddlog_pending(d->log);
    int rc;
    if (!pb->len) {
        unsigned char head[BATCH_HEAD] = {0};
        if ((rc = rf_buf_append(pb, head, sizeof head))) return rc;
        d->pending_first = d->nnodes;
    }
    *voff = rf_ddlog_pending_voff(d->log) + pb->len;
    unsigned char h[REC_HEAD];
    rec_encode(r, h);
    if ((rc = rf_buf_append(pb, h, REC_HEAD)) || (rc = rf_buf_append(pb, keys, 8ull * r->nkeys)) ||
        (rc = rf_buf_append(pb, merges, 4ull * r->nmerge)) ||
        (rc = rf_buf_append(pb, doc->id, r->id_len)) ||
        (rc = rf_buf_append(pb, set, 4ull * r->set_len)))
        return rc;
    return RF_OK;
}

static int decide(rf_dedup *d, const rf_doc *doc, dd_prep *p, const uint64_t *keys,
                  rf_dd_result *res) {
    uint32_t seq = (uint32_t)d->nnodes;
    dd_rec r = {.kind = RF_DD_KEPT, .target = seq, .hash = p->hash};
    size_t idlen = doc->id ? strlen(doc->id) : 0;
    if (idlen > UINT32_MAX / 2) return rf_fail(RF_ERR_RANGE, "document id too long");
    r.id_len = (uint32_t)idlen;
    uint32_t merges[RF_MINHASH_MAX_PERM];
    int rc;
    if (p->exact_of != RF_TABLE_MISSING) {
        r.kind = RF_DD_EXACT;
        r.target = find(d, p->exact_of);
    } else if (p->nshingles) {
        uint32_t cand[RF_MINHASH_MAX_PERM], roots[RF_MINHASH_MAX_PERM];
        size_t nc = 0, nr = 0;
        for (int j = 0; j < d->o.bands; j++) {
            uint32_t c = rf_band_table_get(&d->bands, keys[j]);
            if (c != RF_TABLE_MISSING) cand[nc++] = c;
        }
        qsort(cand, nc, sizeof *cand, cmp_u32);
        float best = 0;
        bool best_exact = false;
        for (size_t i = 0; i < nc; i++) {
            if (i && cand[i] == cand[i - 1]) continue;
            if (d->o.verify) {
                rf_shset cs;
                bool exact;
                if ((rc = read_set(d, cand[i], &cs))) return rc;
                double j =
                    rf_shset_jaccard((rf_shset){p->set, p->set_len, p->set_total}, cs, &exact);
                if (r.pairs < UINT16_MAX) r.pairs++;
                if (j < d->o.threshold) continue;
                if ((float)j > best || !(r.flags & FLAG_VERIFIED)) {
                    best = (float)j;
                    best_exact = exact;
                    r.matched = cand[i];
                }
                r.flags |= FLAG_VERIFIED;
            }
            roots[nr++] = find(d, cand[i]);
        }
        if (nr) {
            qsort(roots, nr, sizeof *roots, cmp_u32);
            r.kind = RF_DD_NEAR;
            r.target = roots[0];
            for (size_t i = 1; i < nr; i++)
                if (roots[i] != roots[i - 1]) merges[r.nmerge++] = roots[i];
            r.jaccard = best;
            if (best_exact) r.flags |= FLAG_EXACT_J;
        }
        r.nkeys = (uint32_t)d->o.bands;
        r.set_len = p->set_len;
        r.set_total = p->set_total;
    }
    uint64_t voff;
    if ((rc = append_record(d, &r, keys, merges, doc, p->set, &voff)) ||
        (rc = apply(d, voff, &r, keys, merges)))
        return rc;
    return fill_result(d, seq, &r, res);
}

/* A document the index already holds: check it is the same one and read back
 * its decision. */
static int replay_doc(rf_dedup *d, uint64_t seq, const rf_doc *doc, rf_dd_result *res) {
    dd_rec r;
    size_t len;
    int rc;
    if ((rc = read_rec(d, (uint32_t)seq, &r)) || (rc = read_id(d, (uint32_t)seq, &len))) return rc;
    const char *id = doc->id ? doc->id : "";
    if (strlen(id) != len || memcmp(id, d->rid, len))
        return rf_fail(RF_ERR_INVALID,
                       "document %llu has id '%s' but the index recorded '%s' there: the input "
                       "differs from the one this index was built on",
                       (unsigned long long)seq, id, d->rid);
    res->replayed = true;
    return fill_result(d, (uint32_t)seq, &r, res);
}

/* ---- parallel preparation: plain threads pulling chunks of a batch ----
 * (created per batch and joined, so no thread spins while decisions run
 * sequentially or while the machine is busy with other work) */

#define CHUNK 8

typedef struct batch_work {
    const rf_dedup *d;
    const rf_doc *docs;
    dd_prep *prep;
    uint64_t *keys;
    size_t n;
    _Atomic size_t next;
} batch_work;

static bool next_chunk(batch_work *w, size_t *from, size_t *to) {
    size_t k = atomic_fetch_add(&w->next, CHUNK);
    if (k >= w->n) return false;
    *from = k;
    *to = k + CHUNK < w->n ? k + CHUNK : w->n;
    return true;
}

static void *hash_worker(void *arg) {
    batch_work *w = arg;
    rf_buf norm = RF_BUF_INIT;
    size_t from, to;
    while (next_chunk(w, &from, &to))
        for (size_t k = from; k < to; k++)
            prep_hash(w->d, &w->docs[k], &w->prep[k], &norm);
    rf_buf_free(&norm);
    return NULL;
}

static void *sign_worker(void *arg) {
    batch_work *w = arg;
    dd_scratch s = {RF_BUF_INIT, {0}, malloc(sizeof(uint32_t) * (size_t)w->d->mh.nperm)};
    size_t from, to;
    while (next_chunk(w, &from, &to))
        for (size_t k = from; k < to; k++) {
            dd_prep *p = &w->prep[k];
            if (p->rc || p->exact_of != RF_TABLE_MISSING) continue;
            if (!s.sig)
                p->rc = RF_ERR_NOMEM;
            else
                prep_sign(w->d, p, w->keys + k * (size_t)w->d->o.bands, &s);
        }
    rf_u64vec_free(&s.sh);
    free(s.sig);
    return NULL;
}

/* Runs fn on the calling thread plus up to threads-1 helpers; small batches
 * are not worth starting threads for. A helper that cannot start leaves its
 * share to the others. */
static void run_workers(batch_work *w, void *(*fn)(void *)) {
    pthread_t helpers[256];
    int nh = 0, want = w->n >= 64 ? w->d->o.threads - 1 : 0;
    while (nh < want && pthread_create(&helpers[nh], NULL, fn, w) == 0)
        nh++;
    fn(w);
    for (int i = 0; i < nh; i++)
        pthread_join(helpers[i], NULL);
}

int rf_dedup_process(rf_dedup *d, const rf_doc *docs, size_t n, rf_dd_result *res) {
    memset(res, 0, n * sizeof *res);
    size_t i = 0;
    int rc = RF_OK;
    for (; i < n && d->pos < d->committed; i++, d->pos++)
        if ((rc = replay_doc(d, d->pos, &docs[i], &res[i]))) return rc;
    docs += i;
    res += i;
    n -= i;
    if (!n) return RF_OK;
    if (d->nnodes + n > MAX_DOCS)
        return rf_fail(RF_ERR_RANGE, "dedup index is full (%u documents)", MAX_DOCS);
    dd_prep *prep = calloc(n, sizeof *prep);
    uint64_t *keys = malloc(n * (size_t)d->o.bands * sizeof *keys);
    if (!prep || !keys) {
        free(prep);
        free(keys);
        return RF_ERR_NOMEM;
    }
    double t0 = rf_now();
    batch_work w = {d, docs, prep, keys, n, 0};
    run_workers(&w, hash_worker);
    /* Exact duplicates (also within this batch) are found in stream order
     * before signing, so their signatures are never computed. */
    for (size_t k = 0; k < n; k++) {
        if (prep[k].rc) continue;
        prep[k].exact_of = rf_exact_table_get(&d->exact, prep[k].hash);
        if (prep[k].exact_of == RF_TABLE_MISSING)
            prep[k].rc = rf_exact_table_put_new(&d->exact, prep[k].hash, (uint32_t)(d->nnodes + k));
    }
    w.next = 0;
    run_workers(&w, sign_worker);
    double t1 = rf_now();
    for (size_t k = 0; k < n && !rc; k++) {
        rc = prep[k].rc;
        if (!rc) rc = decide(d, &docs[k], &prep[k], keys + k * (size_t)d->o.bands, &res[k]);
        if (!rc) d->pos++;
    }
    d->t_prep += t1 - t0;
    d->t_decide += rf_now() - t1;
    for (size_t k = 0; k < n; k++) {
        free(prep[k].set);
        free(prep[k].norm);
    }
    free(prep);
    free(keys);
    return rc;
}

uint64_t rf_dedup_pending(const rf_dedup *d) {
    return d->nnodes - d->committed;
}

int rf_dedup_commit(rf_dedup *d, uint64_t kept_bytes, uint64_t dups_bytes) {
    rf_buf *pb = rf_ddlog_pending(d->log);
    if (!pb->len) return RF_OK;
    uint64_t first = d->pending_first;
    uint32_t ndocs = (uint32_t)(d->nnodes - d->pending_first);
    memcpy(pb->data, &first, 8);
    memcpy(pb->data + 8, &ndocs, 4);
    memcpy(pb->data + 16, &kept_bytes, 8);
    memcpy(pb->data + 24, &dups_bytes, 8);
    double t0 = rf_now();
    int rc = rf_ddlog_commit(d->log);
    d->t_commit += rf_now() - t0;
    if (rc) return rc;
    d->committed = d->nnodes;
    d->kept_bytes = kept_bytes;
    d->dups_bytes = dups_bytes;
    return RF_OK;
}

/* Cluster sizes in power-of-two bins: 1, 2, 3-4, 5-8, ... */
static void size_bin(uint32_t size, char *name, size_t cap) {
    if (size <= 2) {
        snprintf(name, cap, "%u", size);
        return;
    }
    uint64_t hi = 4;
    while (hi < size)
        hi *= 2;
    snprintf(name, cap, "%llu-%llu", (unsigned long long)(hi / 2 + 1), (unsigned long long)hi);
}

int rf_dedup_report(const rf_dedup *d, rf_stats *s, const char *prefix) {
    char name[160];
    int rc = RF_OK;
#define SET(key, v)                                                                                \
    do {                                                                                           \
        snprintf(name, sizeof name, "%s%s", prefix, key);                                          \
        if ((rc = rf_stats_set(s, name, (int64_t)(v)))) return rc;                                 \
    } while (0)
    SET("docs", d->nnodes);
    SET("kept", d->count[RF_DD_KEPT]);
    SET("exact", d->count[RF_DD_EXACT]);
    SET("near", d->count[RF_DD_NEAR]);
    SET("pairs_checked", d->pairs_checked);
    SET("pairs_confirmed", d->confirmed);
    SET("jaccard_estimated", d->estimated);
    SET("cluster_merges", d->merges);
    size_t mem = d->cap * sizeof *d->nodes + rf_band_table_bytes(&d->bands) +
                 rf_exact_table_bytes(&d->exact);
    SET("memory_bytes", mem);
    SET("index_bytes", rf_ddlog_size(d->log));
    if (d->nnodes) {
        SET("memory_bytes_per_doc", mem / d->nnodes);
        SET("index_bytes_per_doc", rf_ddlog_size(d->log) / d->nnodes);
    }
    uint64_t clusters = 0;
    for (size_t i = 0; i < d->nnodes; i++) {
        if (d->nodes[i].parent != i) continue;
        char bin[48];
        clusters++;
        size_bin(d->nodes[i].size, bin, sizeof bin);
        snprintf(name, sizeof name, "%scluster_size.%s", prefix, bin);
        if ((rc = rf_stats_add(s, name, 1))) return rc;
    }
    SET("clusters", clusters);
#undef SET
    const struct {
        const char *key;
        double v;
    } times[] = {{"this_run.prepare_seconds", d->t_prep},
                 {"this_run.decide_seconds", d->t_decide},
                 {"this_run.commit_seconds", d->t_commit}};
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, times[i].key);
        if ((rc = rf_stats_set_real(s, name, times[i].v))) return rc;
    }
    return RF_OK;
}
