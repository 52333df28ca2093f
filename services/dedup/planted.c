#include "dedup/planted.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/rng.h"
#include "common/sys.h"
#include "dedup/jaccard.h"
#include "dedup/minhash.h"
#include "dedup/normalize.h"
#include "dedup/shingle.h"
#include "dedup/table.h"

static const char *const op_names[RF_PLANTED_OPS] = {"swap", "insert",   "delete",
                                                     "typo", "truncate", "mixed"};

void rf_planted_opts_default(rf_planted_opts *po) {
    *po = (rf_planted_opts){.max_base = 1000,
                            .variants = 2,
                            .min_words = 30,
                            .max_rate = 0.25,
                            .random_pairs = 20000,
                            .seed = 20261122,
                            .batch = 512};
}

/* A document as words (pointers into a private copy of its text). */
typedef struct words {
    char *buf;
    char **w;
    size_t n;
} words;

static int split(const char *text, words *out) {
    size_t len = strlen(text), cap = len / 2 + 2;
    out->buf = malloc(len + 1);
    out->w = malloc(cap * sizeof *out->w);
    out->n = 0;
    if (!out->buf || !out->w) return RF_ERR_NOMEM;
    memcpy(out->buf, text, len + 1);
    for (char *p = strtok(out->buf, " \t\r\n"); p; p = strtok(NULL, " \t\r\n"))
        out->w[out->n++] = p;
    return RF_OK;
}

static void words_free(words *w) {
    free(w->buf);
    free(w->w);
}

/* Applies one edit kind at `rate` to base, appending the copy's text to out.
 * vocab supplies inserted words. */
static int edit(const words *base, int op, double rate, const words *vocab, rf_rng *r,
                rf_buf *out) {
    size_t n = base->n, k = (size_t)lround(rate * (double)n);
    /* Work on an array of word indexes (SIZE_MAX + j = vocab word j) plus typo marks. */
    size_t cap = n + k + 1, m = n;
    size_t *idx = malloc(cap * sizeof *idx);
    unsigned char *typo = calloc(cap, 1);
    if (!idx || !typo) {
        free(idx);
        free(typo);
        return RF_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    int ops = op == 5 ? 4 : 1; /* mixed: swap, insert, delete, typo at rate/4 each */
    size_t each = op == 5 ? (k + 3) / 4 : k;
    for (int o = 0; o < ops; o++) {
        int kind = op == 5 ? o : op;
        for (size_t e = 0; e < each && m > 1; e++) {
            size_t at = rf_rng_below(r, m);
            if (kind == 0 && at + 1 < m) { /* swap adjacent words */
                size_t t = idx[at];
                idx[at] = idx[at + 1];
                idx[at + 1] = t;
            } else if (kind == 1 && m < cap) { /* insert a corpus word */
                memmove(idx + at + 1, idx + at, (m - at) * sizeof *idx);
                memmove(typo + at + 1, typo + at, m - at);
                idx[at] = n + rf_rng_below(r, vocab->n);
                typo[at] = 0;
                m++;
            } else if (kind == 2) { /* delete */
                memmove(idx + at, idx + at + 1, (m - at - 1) * sizeof *idx);
                memmove(typo + at, typo + at + 1, m - at - 1);
                m--;
            } else if (kind == 3) { /* one-character typo */
                typo[at] = 1;
            }
        }
    }
    if (op == 4) m = n - (size_t)lround(fmin(2 * rate, 0.95) * (double)n); /* keep a prefix */
    int rc = RF_OK;
    for (size_t i = 0; i < m && !rc; i++) {
        const char *w = idx[i] < n ? base->w[idx[i]] : vocab->w[idx[i] - n];
        if (i) rc = rf_buf_putc(out, ' ');
        size_t wl = strlen(w), pos = rf_rng_below(r, wl ? wl : 1);
        if (!rc && typo[i] && wl) {
            rc = rf_buf_append(out, w, pos);
            if (!rc) rc = rf_buf_putc(out, (char)('a' + rf_rng_below(r, 26)));
            if (!rc) rc = rf_buf_append(out, w + pos + 1, wl - pos - 1);
        } else if (!rc) {
            rc = rf_buf_append(out, w, wl);
        }
    }
    free(idx);
    free(typo);
    return rc;
}

/* Sorted distinct shingle hashes of a text under o's normalization. */
typedef struct shs {
    uint64_t *v;
    size_t n;
} shs;

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

static int shingle_set(const rf_dedup_opts *o, const char *text, rf_buf *norm, rf_u64vec *tmp,
                       shs *out) {
    int rc = rf_normalize(text, strlen(text), o->norm, norm);
    if (!rc) rc = rf_shingle(norm->data, norm->len, o->ngram, o->char_mode, tmp);
    if (rc) return rc;
    qsort(tmp->v, tmp->n, sizeof *tmp->v, cmp_u64);
    size_t m = 0;
    for (size_t i = 0; i < tmp->n; i++)
        if (!m || tmp->v[i] != tmp->v[m - 1]) tmp->v[m++] = tmp->v[i];
    out->v = malloc((m ? m : 1) * sizeof *out->v);
    if (!out->v) return RF_ERR_NOMEM;
    memcpy(out->v, tmp->v, m * sizeof *out->v);
    out->n = m;
    return RF_OK;
}

static double jaccard64(const shs *a, const shs *b) {
    size_t i = 0, j = 0, both = 0;
    while (i < a->n && j < b->n) {
        if (a->v[i] < b->v[j])
            i++;
        else if (b->v[j] < a->v[i])
            j++;
        else
            i++, j++, both++;
    }
    size_t uni = a->n + b->n - both;
    return uni ? (double)both / (double)uni : 1.0;
}

enum { PAIR_SCORED, PAIR_FAMILY, PAIR_RANDOM };

typedef struct pair {
    uint32_t a, b;
    int8_t op;   /* edit kind for (copy, original), -1 otherwise */
    uint8_t use; /* PAIR_SCORED: pair metric; PAIR_FAMILY (two copies of one original):
                  * document metric only; PAIR_RANDOM: S-curve only */
} pair;

typedef struct bench {
    const rf_dedup_opts *o;
    const rf_planted_opts *po;
    size_t ndocs;
    char **text;    /* stream docs, in generation order (originals first) */
    int8_t *op;     /* edit kind of each copy, -1 for originals */
    uint32_t *base; /* original of each doc (itself for originals) */
    shs *sets;
    uint64_t *cluster;
    uint32_t *pos;    /* position in the shuffled stream */
    uint8_t *removed; /* decided exact or near duplicate */
    pair *pairs;
    size_t npairs, pcap;
} bench;

static int add_pair(bench *b, uint32_t x, uint32_t y, int8_t op, uint8_t use) {
    if (b->npairs == b->pcap) {
        size_t cap = b->pcap ? 2 * b->pcap : 4096;
        pair *p = realloc(b->pairs, cap * sizeof *p);
        if (!p) return RF_ERR_NOMEM;
        b->pairs = p;
        b->pcap = cap;
    }
    b->pairs[b->npairs++] = (pair){x, y, op, use};
    return RF_OK;
}

/* Picks originals (distinct normalized text, >= min_words) and makes copies. */
static int generate(bench *b, char *const *texts, size_t n, rf_rng *r) {
    const rf_planted_opts *po = b->po;
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    words *bw = calloc(po->max_base ? po->max_base : 1, sizeof *bw);
    rf_exact_table seen = {0};
    rf_buf norm = RF_BUF_INIT, out = RF_BUF_INIT;
    size_t nb = 0, cap = po->max_base * (size_t)(1 + po->variants);
    b->text = calloc(cap ? cap : 1, sizeof *b->text);
    b->op = calloc(cap ? cap : 1, sizeof *b->op);
    b->base = calloc(cap ? cap : 1, sizeof *b->base);
    int rc = !order || !bw || !b->text || !b->op || !b->base ? RF_ERR_NOMEM : RF_OK;
    for (size_t i = 0; i < n && !rc; i++)
        order[i] = i;
    for (size_t i = n; i > 1 && !rc; i--) { /* shuffle the corpus */
        size_t j = rf_rng_below(r, i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < n && nb < po->max_base && !rc; i++) {
        const char *t = texts[order[i]];
        if ((rc = rf_normalize(t, strlen(t), b->o->norm, &norm))) break;
        rf_hash128 h = rf_hash128_of(norm.data, norm.len, 0);
        if (rf_exact_table_get(&seen, h) != RF_TABLE_MISSING) continue;
        if ((rc = split(t, &bw[nb]))) break;
        if (bw[nb].n < (size_t)po->min_words) {
            words_free(&bw[nb]);
            continue;
        }
        if ((rc = rf_exact_table_put_new(&seen, h, 0))) break;
        if (!(b->text[nb] = strdup(t))) rc = RF_ERR_NOMEM;
        b->op[nb] = -1;
        b->base[nb] = (uint32_t)nb;
        nb++;
    }
    b->ndocs = nb;
    for (size_t i = 0; i < nb && !rc; i++) {
        for (int v = 0; v < po->variants && !rc; v++) {
            int op = (int)((i * (size_t)po->variants + (size_t)v) % RF_PLANTED_OPS);
            double rate = rf_rng_double(r) * po->max_rate;
            rf_buf_reset(&out);
            rc = edit(&bw[i], op, rate, &bw[rf_rng_below(r, nb)], r, &out);
            if (!rc && !(b->text[b->ndocs] = strdup(out.data ? out.data : ""))) rc = RF_ERR_NOMEM;
            if (rc) break;
            b->op[b->ndocs] = (int8_t)op;
            b->base[b->ndocs] = (uint32_t)i;
            b->ndocs++;
        }
    }
    for (size_t i = 0; i < nb; i++)
        words_free(&bw[i]);
    free(bw);
    free(order);
    rf_exact_table_free(&seen);
    rf_buf_free(&norm);
    rf_buf_free(&out);
    return rc;
}

/* Dedups the shuffled stream and records each document's cluster. */
static int dedup_stream(bench *b, const char *index_dir, rf_rng *r, double *secs) {
    size_t n = b->ndocs;
    size_t *perm = malloc(n * sizeof *perm);
    rf_doc *docs = calloc((size_t)b->po->batch, sizeof *docs);
    rf_dd_result *res = calloc((size_t)b->po->batch, sizeof *res);
    b->cluster = calloc(n, sizeof *b->cluster);
    b->pos = calloc(n, sizeof *b->pos);
    b->removed = calloc(n, 1);
    if (!perm || !docs || !res || !b->cluster || !b->pos || !b->removed) {
        free(perm);
        free(docs);
        free(res);
        return RF_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        perm[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = rf_rng_below(r, i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    rf_dedup *d;
    int rc = rf_dedup_open(b->o, index_dir, &d);
    double t0 = rf_now();
    char ids[64];
    for (size_t i = 0; i < n && !rc; i += (size_t)b->po->batch) {
        size_t m = n - i < (size_t)b->po->batch ? n - i : (size_t)b->po->batch;
        for (size_t k = 0; k < m; k++) {
            snprintf(ids, sizeof ids, "%zu", perm[i + k]);
            docs[k].id = strdup(ids);
            docs[k].text = b->text[perm[i + k]];
            docs[k].text_len = strlen(docs[k].text);
            if (!docs[k].id) rc = RF_ERR_NOMEM;
        }
        if (!rc) rc = rf_dedup_process(d, docs, m, res);
        if (!rc) rc = rf_dedup_commit(d, 0, 0);
        for (size_t k = 0; k < m; k++) {
            if (!rc) {
                b->cluster[perm[i + k]] = res[k].cluster;
                b->removed[perm[i + k]] = res[k].kind != RF_DD_KEPT;
                b->pos[perm[i + k]] = (uint32_t)(i + k);
            }
            free(docs[k].id);
        }
        rf_dd_results_clear(res, m);
    }
    *secs = rf_now() - t0;
    rf_dedup_close(d);
    free(perm);
    free(docs);
    free(res);
    return rc;
}

/* Scored pairs: (copy, original), and originals sharing a shingle; then
 * random pairs of originals for the low end of the S-curve. */
static int collect_pairs(bench *b, size_t nbase, rf_rng *r) {
    int rc = RF_OK;
    for (size_t i = nbase; i < b->ndocs && !rc; i++) {
        rc = add_pair(b, (uint32_t)i, b->base[i], b->op[i], PAIR_SCORED);
        /* copies of one original are made consecutively */
        for (size_t j = i - 1; j >= nbase && b->base[j] == b->base[i] && !rc; j--)
            rc = add_pair(b, (uint32_t)j, (uint32_t)i, -1, PAIR_FAMILY);
    }
    /* originals sharing a shingle: sort (shingle, doc) pairs and join runs */
    size_t total = 0;
    for (size_t i = 0; i < nbase; i++)
        total += b->sets[i].n;
    uint64_t(*sd)[2] = malloc((total ? total : 1) * sizeof *sd);
    if (!sd) return RF_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < nbase; i++)
        for (size_t j = 0; j < b->sets[i].n; j++)
            sd[k][0] = b->sets[i].v[j], sd[k++][1] = i;
    qsort(sd, total, sizeof *sd, cmp_u64); /* by shingle (first word) */
    rf_band_table seen = {0};
    for (size_t i = 0; i < total && !rc;) {
        size_t j = i;
        while (j < total && sd[j][0] == sd[i][0])
            j++;
        for (size_t x = i; x < j && j - i <= 64 && !rc; x++)
            for (size_t y = x + 1; y < j && !rc; y++) {
                uint64_t a = sd[x][1] < sd[y][1] ? sd[x][1] : sd[y][1];
                uint64_t c = sd[x][1] < sd[y][1] ? sd[y][1] : sd[x][1];
                if (a == c) continue;
                uint64_t key = (a << 32 | c) + 1;
                if (rf_band_table_get(&seen, key) != RF_TABLE_MISSING) continue;
                rc = rf_band_table_put_new(&seen, key, 0);
                if (!rc) rc = add_pair(b, (uint32_t)a, (uint32_t)c, -1, PAIR_SCORED);
            }
        i = j;
    }
    rf_band_table_free(&seen);
    free(sd);
    for (size_t i = 0; i < b->po->random_pairs && nbase > 1 && !rc; i++) {
        uint32_t a = (uint32_t)rf_rng_below(r, nbase), c = (uint32_t)rf_rng_below(r, nbase);
        if (a != c) rc = add_pair(b, a, c, -1, PAIR_RANDOM);
    }
    return rc;
}

/* Measured band-collision rate per Jaccard bin, against theory. */
static int s_curve(bench *b, rf_planted_report *rep) {
    rf_minhash mh;
    int rc = rf_minhash_init(&mh, b->o->bands, b->o->rows, b->o->seed);
    if (rc) return rc;
    uint32_t *sa = malloc(sizeof(uint32_t) * (size_t)mh.nperm),
             *sb = malloc(sizeof(uint32_t) * (size_t)mh.nperm);
    uint32_t *fa = NULL, *fb = NULL;
    size_t fcap = 0;
    if (!sa || !sb) rc = RF_ERR_NOMEM;
    for (size_t p = 0; p < b->npairs && !rc; p++) {
        const shs *x = &b->sets[b->pairs[p].a], *y = &b->sets[b->pairs[p].b];
        if (!x->n || !y->n) continue;
        /* MinHash sees the 32-bit folds, so the S-curve is against their Jaccard. */
        size_t need = x->n > y->n ? x->n : y->n;
        if (need > fcap) {
            free(fa);
            free(fb);
            fa = malloc(need * 4);
            fb = malloc(need * 4);
            fcap = need;
            if (!fa || !fb) {
                rc = RF_ERR_NOMEM;
                break;
            }
        }
        for (size_t i = 0; i < x->n; i++)
            fa[i] = rf_minhash_fold(x->v[i]);
        for (size_t i = 0; i < y->n; i++)
            fb[i] = rf_minhash_fold(y->v[i]);
        size_t na = rf_shset_build(fa, x->n), nb = rf_shset_build(fb, y->n);
        bool exact;
        double j = rf_shset_jaccard((rf_shset){fa, (uint32_t)na, (uint32_t)na},
                                    (rf_shset){fb, (uint32_t)nb, (uint32_t)nb}, &exact);
        rf_minhash_sign(&mh, x->v, x->n, sa);
        rf_minhash_sign(&mh, y->v, y->n, sb);
        bool hit = false;
        for (int band = 0; band < mh.bands && !hit; band++)
            hit = !memcmp(sa + band * mh.rows, sb + band * mh.rows,
                          sizeof(uint32_t) * (size_t)mh.rows);
        int bin = (int)(j * RF_PLANTED_BINS);
        if (bin >= RF_PLANTED_BINS) bin = RF_PLANTED_BINS - 1;
        rep->bins[bin].pairs++;
        rep->bins[bin].collided += hit;
        rep->bins[bin].expected += rf_lsh_prob(j, mh.bands, mh.rows);
    }
    rep->max_bin_excess = -1;
    for (int i = 0; i < RF_PLANTED_BINS; i++) {
        rf_planted_bin *bn = &rep->bins[i];
        if (!bn->pairs) continue;
        bn->expected /= (double)bn->pairs;
        if (bn->pairs < 30) continue;
        double m = (double)bn->collided / (double)bn->pairs, e = bn->expected;
        double allowed = 3 * sqrt(e * (1 - e) / (double)bn->pairs) + 0.03;
        double excess = fabs(m - e) - allowed;
        if (excess > rep->max_bin_excess) rep->max_bin_excess = excess;
    }
    free(sa);
    free(sb);
    free(fa);
    free(fb);
    rf_minhash_free(&mh);
    return rc;
}

static double f1_of(size_t tp, size_t fp, size_t fn, double *p, double *r) {
    *p = tp + fp ? (double)tp / (double)(tp + fp) : 1;
    *r = tp + fn ? (double)tp / (double)(tp + fn) : 1;
    return *p + *r > 0 ? 2 * *p * *r / (*p + *r) : 0;
}

static int score(bench *b, rf_planted_report *rep) {
    uint8_t *truly_dup = calloc(b->ndocs, 1);
    if (!truly_dup) return RF_ERR_NOMEM;
    for (size_t p = 0; p < b->npairs; p++) {
        const pair *pr = &b->pairs[p];
        if (pr->use == PAIR_RANDOM) continue;
        bool truth = jaccard64(&b->sets[pr->a], &b->sets[pr->b]) >= b->o->threshold;
        /* the later of two documents above the threshold should be removed */
        if (truth) truly_dup[b->pos[pr->a] > b->pos[pr->b] ? pr->a : pr->b] = 1;
        if (pr->use != PAIR_SCORED) continue;
        bool pred = b->cluster[pr->a] == b->cluster[pr->b];
        rep->tp += truth && pred;
        rep->fp += !truth && pred;
        rep->fn += truth && !pred;
        rep->tn += !truth && !pred;
        if (truth && pr->op >= 0) {
            rep->op_pos[pr->op]++;
            rep->op_found[pr->op] += pred;
        }
    }
    for (size_t i = 0; i < b->ndocs; i++) {
        rep->doc_tp += truly_dup[i] && b->removed[i];
        rep->doc_fp += !truly_dup[i] && b->removed[i];
        rep->doc_fn += truly_dup[i] && !b->removed[i];
    }
    free(truly_dup);
    rep->f1 = f1_of(rep->tp, rep->fp, rep->fn, &rep->precision, &rep->recall);
    rep->doc_f1 =
        f1_of(rep->doc_tp, rep->doc_fp, rep->doc_fn, &rep->doc_precision, &rep->doc_recall);
    return RF_OK;
}

int rf_planted_run(const rf_dedup_opts *o, const rf_planted_opts *po, char *const *texts, size_t n,
                   const char *index_dir, rf_planted_report *rep) {
    memset(rep, 0, sizeof *rep);
    if (po->variants < 1 || po->batch < 1 || po->min_words < 1 || !(po->max_rate >= 0))
        return rf_fail(RF_ERR_INVALID, "planted benchmark: bad options");
    bench b = {.o = o, .po = po};
    rf_rng r;
    rf_rng_seed(&r, po->seed);
    int rc = generate(&b, texts, n, &r);
    size_t nbase = 0;
    while (nbase < b.ndocs && b.op[nbase] < 0)
        nbase++;
    if (!rc && nbase < 2)
        rc = rf_fail(RF_ERR_INVALID, "planted benchmark: fewer than 2 usable originals");
    rf_buf norm = RF_BUF_INIT;
    rf_u64vec tmp = {0};
    if (!rc && !(b.sets = calloc(b.ndocs, sizeof *b.sets))) rc = RF_ERR_NOMEM;
    for (size_t i = 0; i < b.ndocs && !rc; i++)
        rc = shingle_set(o, b.text[i], &norm, &tmp, &b.sets[i]);
    if (!rc) rc = dedup_stream(&b, index_dir, &r, &rep->seconds);
    if (!rc) rc = collect_pairs(&b, nbase, &r);
    if (!rc) rc = s_curve(&b, rep);
    if (!rc) rc = score(&b, rep);
    rep->base = nbase;
    rep->variants = b.ndocs - nbase;
    rep->docs = b.ndocs;
    for (size_t i = 0; i < b.ndocs; i++) {
        free(b.text ? b.text[i] : NULL);
        if (b.sets) free(b.sets[i].v);
    }
    free(b.text);
    free(b.op);
    free(b.base);
    free(b.sets);
    free(b.cluster);
    free(b.pos);
    free(b.removed);
    free(b.pairs);
    rf_buf_free(&norm);
    rf_u64vec_free(&tmp);
    return rc;
}

int rf_planted_json(const rf_planted_report *rep, const rf_dedup_opts *o, rf_buf *out) {
    int rc =
        rf_buf_printf(out,
                      "{\"config\":{\"ngram\":%d,\"bands\":%d,\"rows\":%d,\"threshold\":%g,"
                      "\"verify\":%s},\"originals\":%zu,\"copies\":%zu,\"docs\":%zu,"
                      "\"tp\":%zu,\"fp\":%zu,\"fn\":%zu,\"tn\":%zu,\"precision\":%.4f,"
                      "\"recall\":%.4f,\"f1\":%.4f,\"documents\":{\"tp\":%zu,\"fp\":%zu,\"fn\":%zu,"
                      "\"precision\":%.4f,\"recall\":%.4f,\"f1\":%.4f},"
                      "\"dedup_seconds\":%.3f,\"recall_by_edit\":{",
                      o->ngram, o->bands, o->rows, o->threshold, o->verify ? "true" : "false",
                      rep->base, rep->variants, rep->docs, rep->tp, rep->fp, rep->fn, rep->tn,
                      rep->precision, rep->recall, rep->f1, rep->doc_tp, rep->doc_fp, rep->doc_fn,
                      rep->doc_precision, rep->doc_recall, rep->doc_f1, rep->seconds);
    for (int i = 0; i < RF_PLANTED_OPS; i++)
        rc |= rf_buf_printf(out, "%s\"%s\":{\"positives\":%zu,\"found\":%zu}", i ? "," : "",
                            op_names[i], rep->op_pos[i], rep->op_found[i]);
    rc |= rf_buf_puts(out, "},\"s_curve\":[");
    int first = 1;
    for (int i = 0; i < RF_PLANTED_BINS; i++) {
        const rf_planted_bin *bn = &rep->bins[i];
        if (!bn->pairs) continue;
        rc |= rf_buf_printf(out,
                            "%s{\"jaccard\":[%.1f,%.1f],\"pairs\":%zu,\"measured\":%.4f,"
                            "\"theory\":%.4f}",
                            first ? "" : ",", i / 10.0, (i + 1) / 10.0, bn->pairs,
                            (double)bn->collided / (double)bn->pairs, bn->expected);
        first = 0;
    }
    rc |= rf_buf_printf(out, "],\"s_curve_max_excess\":%.4f}", rep->max_bin_excess);
    return rc ? RF_ERR_NOMEM : RF_OK;
}
