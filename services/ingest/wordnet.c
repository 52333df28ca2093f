/* WordNet synonym table (see wordnet.h).
 *
 * Every string (synonym, lemma, inflected form) is interned once into a pool and
 * named by a dense id; per-id arrays then give a lemma's synonym list and an
 * inflected form's base forms. Construction reads the database files whole and
 * checks every field it uses; after construction the table is read-only. */
#include "ingest/wordnet.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/sys.h"

#define NONE     UINT32_MAX
#define MAX_FILE (64u << 20)
#define MAX_WORD 128

typedef struct strtab {
    rf_buf pool;   /* NUL-terminated strings */
    uint32_t *off; /* id -> offset in pool */
    size_t count, cap;
    uint32_t *slot; /* hash slots holding id + 1; 0 = empty */
    size_t mask;
} strtab;

struct rf_wordnet {
    strtab st;
    uint32_t *syn_start; /* id -> first entry in syns, NONE if no synonyms */
    uint32_t *syn_len;
    const char **syns;   /* NULL-terminated lists, pointing into st.pool */
    uint32_t *exc_start; /* id -> first entry in exc, NONE if not an exception */
    uint32_t *exc;       /* base-form ids, each list ended by NONE */
    size_t lemmas;
};

/* A growable vector of uint32 pairs (key, value), used while building. */
typedef struct pairs {
    uint32_t (*p)[2];
    size_t n, cap;
} pairs;

static int pairs_push(pairs *v, uint32_t a, uint32_t b) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4096;
        void *p = realloc(v->p, cap * sizeof *v->p);
        if (!p) return RF_ERR_NOMEM;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n][0] = a;
    v->p[v->n][1] = b;
    v->n++;
    return 0;
}

static int pair_cmp(const void *x, const void *y) {
    const uint32_t *a = x, *b = y;
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    return a[1] < b[1] ? -1 : a[1] > b[1];
}

static const char *st_str(const strtab *st, uint32_t id) {
    return st->pool.data + st->off[id];
}

static uint32_t st_find(const strtab *st, const char *s, size_t n) {
    if (!st->slot) return NONE;
    for (size_t i = (size_t)rf_hash64(s, n, 0) & st->mask; st->slot[i]; i = (i + 1) & st->mask) {
        const char *t = st_str(st, st->slot[i] - 1);
        if (memcmp(t, s, n) == 0 && t[n] == '\0') return st->slot[i] - 1;
    }
    return NONE;
}

static int st_grow(strtab *st) {
    size_t cap = st->mask ? (st->mask + 1) * 2 : 1 << 16;
    uint32_t *slot = calloc(cap, sizeof *slot);
    if (!slot) return RF_ERR_NOMEM;
    for (size_t id = 0; id < st->count; id++) {
        const char *t = st_str(st, (uint32_t)id);
        size_t i = (size_t)rf_hash64(t, strlen(t), 0) & (cap - 1);
        while (slot[i])
            i = (i + 1) & (cap - 1);
        slot[i] = (uint32_t)id + 1;
    }
    free(st->slot);
    st->slot = slot;
    st->mask = cap - 1;
    return 0;
}

static int st_intern(strtab *st, const char *s, size_t n, uint32_t *id) {
    if ((*id = st_find(st, s, n)) != NONE) return 0;
    if ((st->count + 1) * 2 > st->mask + 1 && st_grow(st)) return RF_ERR_NOMEM;
    if (st->count == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 1 << 15;
        uint32_t *off = realloc(st->off, cap * sizeof *off);
        if (!off) return RF_ERR_NOMEM;
        st->off = off;
        st->cap = cap;
    }
    if (st->pool.len > UINT32_MAX - n - 1)
        return rf_fail(RF_ERR_RANGE, "wordnet: string pool full");
    st->off[st->count] = (uint32_t)st->pool.len;
    if (rf_buf_append(&st->pool, s, n) || rf_buf_putc(&st->pool, '\0')) return RF_ERR_NOMEM;
    size_t i = (size_t)rf_hash64(s, n, 0) & st->mask;
    while (st->slot[i])
        i = (i + 1) & st->mask;
    st->slot[i] = (uint32_t)st->count + 1;
    *id = (uint32_t)st->count++;
    return 0;
}

/* Next space-separated field of the line [*p, end). */
static bool next_field(const char **p, const char *end, const char **s, size_t *n) {
    const char *q = *p;
    while (q < end && *q == ' ')
        q++;
    if (q >= end) return false;
    *s = q;
    while (q < end && *q != ' ')
        q++;
    *n = (size_t)(q - *s);
    *p = q;
    return true;
}

static bool parse_num(const char *s, size_t n, int base, uint32_t *v) {
    if (n == 0 || n > 10) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        int d = s[i] >= '0' && s[i] <= '9' ? s[i] - '0'
                : base == 16 && (s[i] | 0x20) >= 'a' && (s[i] | 0x20) <= 'f'
                    ? (s[i] | 0x20) - 'a' + 10
                    : -1;
        if (d < 0) return false;
        x = x * (uint64_t)base + (uint64_t)d;
    }
    if (x > UINT32_MAX) return false;
    *v = (uint32_t)x;
    return true;
}

/* A synonym as EDA writes it: adjective marker "(a)" dropped, '_' and '-' as
 * spaces, lowercase; false if anything but a-z and spaces remains. */
static bool eda_form(const char *s, size_t n, char *out, size_t *len) {
    if (n && s[n - 1] == ')') {
        const char *lp = memchr(s, '(', n);
        if (lp) n = (size_t)(lp - s);
    }
    if (n == 0 || n >= MAX_WORD) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i] == '_' || s[i] == '-' ? ' ' : s[i];
        if (c >= 'A' && c <= 'Z') c |= 0x20;
        if (c != ' ' && (c < 'a' || c > 'z')) return false;
        out[i] = c;
    }
    *len = n;
    return true;
}

/* A lemma as a lookup key: '_' as space, otherwise as written. */
static bool key_form(const char *s, size_t n, char *out) {
    if (n == 0 || n >= MAX_WORD) return false;
    for (size_t i = 0; i < n; i++)
        out[i] = s[i] == '_' ? ' ' : s[i];
    return true;
}

static int read_db_file(const char *dir, const char *name, char **buf, size_t *len) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return rf_fail(RF_ERR_INVALID, "wordnet: path too long: %s", dir);
    int rc = rf_read_file(path, MAX_FILE, buf, len);
    if (rc)
        return rf_fail(rc == RF_ERR_NOMEM ? rc : RF_ERR_NOT_FOUND,
                       "wordnet: cannot read %s (Debian package wordnet-base)", path);
    return 0;
}

#define CORRUPT(file, line)                                                                        \
    rf_fail(RF_ERR_CORRUPT, "wordnet: %s line %zu: malformed entry", file, line)

/* Synsets of one part of speech: sorted byte offsets and their word ids. */
typedef struct synsets {
    uint32_t *off, *start, *count;
    size_t n, cap;
} synsets;

static void synsets_free(synsets *s) {
    free(s->off);
    free(s->start);
    free(s->count);
}

/* Parses data.<pos>: each synset line's offset and its words (EDA forms). */
static int load_data(const char *dir, const char *pos, strtab *st, synsets *ss, pairs *words) {
    char name[32], *buf;
    size_t len;
    snprintf(name, sizeof name, "data.%s", pos);
    int rc = read_db_file(dir, name, &buf, &len);
    if (rc) return rc;
    size_t lineno = 0;
    for (const char *p = buf, *end; p < buf + len && !rc; p = end + 1) {
        end = memchr(p, '\n', (size_t)(buf + len - p));
        if (!end) end = buf + len;
        lineno++;
        if (p == end || *p == ' ') continue; /* licence header */
        const char *f, *q = p;
        size_t fn;
        uint32_t off, wcnt, lex;
        if (!next_field(&q, end, &f, &fn) || !parse_num(f, fn, 10, &off) ||
            (ss->n && off <= ss->off[ss->n - 1]) || !next_field(&q, end, &f, &fn) ||
            !next_field(&q, end, &f, &fn) || !next_field(&q, end, &f, &fn) ||
            !parse_num(f, fn, 16, &wcnt)) {
            rc = CORRUPT(name, lineno);
            break;
        }
        if (ss->n == ss->cap) {
            size_t cap = ss->cap ? ss->cap * 2 : 1024;
            uint32_t *a = realloc(ss->off, cap * sizeof *a), *b, *c;
            if (a) ss->off = a;
            b = a ? realloc(ss->start, cap * sizeof *b) : NULL;
            if (b) ss->start = b;
            c = b ? realloc(ss->count, cap * sizeof *c) : NULL;
            if (!c) {
                rc = RF_ERR_NOMEM;
                break;
            }
            ss->count = c;
            ss->cap = cap;
        }
        ss->off[ss->n] = off;
        ss->start[ss->n] = (uint32_t)words->n;
        for (uint32_t w = 0; w < wcnt && !rc; w++) {
            const char *lexf;
            size_t lexn, wl;
            char form[MAX_WORD];
            uint32_t id;
            if (!next_field(&q, end, &f, &fn) || !next_field(&q, end, &lexf, &lexn) ||
                !parse_num(lexf, lexn, 16, &lex))
                rc = CORRUPT(name, lineno);
            else if (eda_form(f, fn, form, &wl))
                rc = st_intern(st, form, wl, &id) || pairs_push(words, id, 0) ? RF_ERR_NOMEM : 0;
        }
        ss->count[ss->n] = (uint32_t)(words->n - ss->start[ss->n]);
        ss->n++;
    }
    free(buf);
    return rc;
}

static int off_cmp(const void *k, const void *e) {
    uint32_t a = *(const uint32_t *)k, b = *(const uint32_t *)e;
    return a < b ? -1 : a > b;
}

/* Parses index.<pos>: each lemma's synset offsets, resolved against ss; pushes
 * (lemma id, word index) for every word of those synsets. */
static int load_index(const char *dir, const char *pos, strtab *st, const synsets *ss,
                      const pairs *words, pairs *lemma_words) {
    char name[32], *buf;
    size_t len;
    snprintf(name, sizeof name, "index.%s", pos);
    int rc = read_db_file(dir, name, &buf, &len);
    if (rc) return rc;
    size_t lineno = 0;
    for (const char *p = buf, *end; p < buf + len && !rc; p = end + 1) {
        end = memchr(p, '\n', (size_t)(buf + len - p));
        if (!end) end = buf + len;
        lineno++;
        if (p == end || *p == ' ') continue;
        const char *lemma, *f, *q = p;
        size_t ln, fn;
        uint32_t nsyn, nptr, off, lid;
        char key[MAX_WORD];
        bool ok = next_field(&q, end, &lemma, &ln) && key_form(lemma, ln, key) &&
                  next_field(&q, end, &f, &fn) && next_field(&q, end, &f, &fn) &&
                  parse_num(f, fn, 10, &nsyn) && next_field(&q, end, &f, &fn) &&
                  parse_num(f, fn, 10, &nptr);
        for (uint32_t i = 0; ok && i < nptr + 2; i++) /* pointers, sense_cnt, tagsense_cnt */
            ok = next_field(&q, end, &f, &fn);
        if (!ok) {
            rc = CORRUPT(name, lineno);
            break;
        }
        if ((rc = st_intern(st, key, ln, &lid))) break;
        for (uint32_t i = 0; i < nsyn && !rc; i++) {
            const uint32_t *hit;
            if (!next_field(&q, end, &f, &fn) || !parse_num(f, fn, 10, &off) ||
                !(hit = bsearch(&off, ss->off, ss->n, sizeof off, off_cmp))) {
                rc = CORRUPT(name, lineno);
                break;
            }
            size_t s = (size_t)(hit - ss->off);
            for (uint32_t w = 0; w < ss->count[s] && !rc; w++)
                rc = pairs_push(lemma_words, lid, words->p[ss->start[s] + w][0]);
        }
    }
    free(buf);
    return rc;
}

/* Parses <pos>.exc: "inflected base [base...]" lines into (inflected, base) ids. */
static int load_exc(const char *dir, const char *pos, strtab *st, pairs *exc) {
    char name[32], *buf;
    size_t len;
    snprintf(name, sizeof name, "%s.exc", pos);
    int rc = read_db_file(dir, name, &buf, &len);
    if (rc) return rc;
    size_t lineno = 0;
    for (const char *p = buf, *end; p < buf + len && !rc; p = end + 1) {
        end = memchr(p, '\n', (size_t)(buf + len - p));
        if (!end) end = buf + len;
        lineno++;
        const char *f, *q = p;
        size_t fn;
        char key[MAX_WORD];
        uint32_t inf, base;
        if (!next_field(&q, end, &f, &fn)) continue;
        if (!key_form(f, fn, key)) {
            rc = CORRUPT(name, lineno);
            break;
        }
        if ((rc = st_intern(st, key, fn, &inf))) break;
        while (!rc && next_field(&q, end, &f, &fn)) {
            if (!key_form(f, fn, key))
                rc = CORRUPT(name, lineno);
            else if (!(rc = st_intern(st, key, fn, &base)))
                rc = pairs_push(exc, inf, base);
        }
    }
    free(buf);
    return rc;
}

static int str_ptr_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Groups (lemma, word) pairs into sorted, de-duplicated synonym lists. */
static int build_synonyms(rf_wordnet *wn, pairs *lw) {
    size_t ids = wn->st.count;
    wn->syn_start = malloc(ids * sizeof *wn->syn_start);
    wn->syn_len = calloc(ids, sizeof *wn->syn_len);
    wn->syns = malloc((lw->n + ids) * sizeof *wn->syns);
    if (!wn->syn_start || !wn->syn_len || !wn->syns) return RF_ERR_NOMEM;
    for (size_t i = 0; i < ids; i++)
        wn->syn_start[i] = NONE;
    if (lw->n) qsort(lw->p, lw->n, sizeof *lw->p, pair_cmp);
    size_t out = 0;
    for (size_t i = 0; i < lw->n;) {
        uint32_t lid = lw->p[i][0];
        size_t first = out;
        for (uint32_t prev = NONE; i < lw->n && lw->p[i][0] == lid; i++) {
            uint32_t w = lw->p[i][1];
            if (w != prev && w != lid) wn->syns[out++] = st_str(&wn->st, w);
            prev = w;
        }
        if (out == first) continue;
        qsort(wn->syns + first, out - first, sizeof *wn->syns, str_ptr_cmp);
        wn->syn_start[lid] = (uint32_t)first;
        wn->syn_len[lid] = (uint32_t)(out - first);
        wn->syns[out++] = NULL;
        wn->lemmas++;
    }
    return 0;
}

static int build_exceptions(rf_wordnet *wn, pairs *exc) {
    size_t ids = wn->st.count;
    wn->exc_start = malloc(ids * sizeof *wn->exc_start);
    wn->exc = malloc((exc->n * 2 + 1) * sizeof *wn->exc);
    if (!wn->exc_start || !wn->exc) return RF_ERR_NOMEM;
    for (size_t i = 0; i < ids; i++)
        wn->exc_start[i] = NONE;
    if (exc->n) qsort(exc->p, exc->n, sizeof *exc->p, pair_cmp);
    size_t out = 0;
    for (size_t i = 0; i < exc->n;) {
        uint32_t inf = exc->p[i][0];
        wn->exc_start[inf] = (uint32_t)out;
        for (; i < exc->n && exc->p[i][0] == inf; i++)
            wn->exc[out++] = exc->p[i][1];
        wn->exc[out++] = NONE;
    }
    return 0;
}

int rf_wordnet_load(const char *dir, rf_wordnet **out) {
    static const char *const POS[] = {"noun", "verb", "adj", "adv"};
    *out = NULL;
    rf_wordnet *wn = calloc(1, sizeof *wn);
    if (!wn) return RF_ERR_NOMEM;
    pairs words = {0}, lemma_words = {0}, exc = {0};
    int rc = st_grow(&wn->st);
    for (size_t p = 0; p < 4 && !rc; p++) {
        synsets ss = {0};
        rc = load_data(dir, POS[p], &wn->st, &ss, &words);
        if (!rc) rc = load_index(dir, POS[p], &wn->st, &ss, &words, &lemma_words);
        synsets_free(&ss);
        if (!rc) rc = load_exc(dir, POS[p], &wn->st, &exc);
    }
    /* The pool is final now: pointers into it stay valid. */
    if (!rc) rc = build_synonyms(wn, &lemma_words);
    if (!rc) rc = build_exceptions(wn, &exc);
    free(words.p);
    free(lemma_words.p);
    free(exc.p);
    if (!rc && wn->lemmas == 0)
        rc = rf_fail(RF_ERR_CORRUPT, "wordnet: no synonyms found in %s", dir);
    if (rc) {
        rf_wordnet_free(wn);
        return rc;
    }
    *out = wn;
    return 0;
}

void rf_wordnet_free(rf_wordnet *wn) {
    if (!wn) return;
    rf_buf_free(&wn->st.pool);
    free(wn->st.off);
    free(wn->st.slot);
    free(wn->syn_start);
    free(wn->syn_len);
    free(wn->syns);
    free(wn->exc_start);
    free(wn->exc);
    free(wn);
}

size_t rf_wordnet_lemmas(const rf_wordnet *wn) {
    return wn->lemmas;
}

static const char *const *synonyms_of(const rf_wordnet *wn, uint32_t id, size_t *count) {
    if (id == NONE || !wn->syn_start || wn->syn_start[id] == NONE) return NULL;
    if (count) *count = wn->syn_len[id];
    return wn->syns + wn->syn_start[id];
}

const char *const *rf_wordnet_synonyms(const rf_wordnet *wn, const char *word, size_t len,
                                       size_t *count) {
    if (count) *count = 0;
    return synonyms_of(wn, st_find(&wn->st, word, len), count);
}

/* WordNet's morphy suffix rules (nouns, verbs, adjectives). */
static const char *const RULES[][2] = {
    {"s", ""},      {"ses", "s"},   {"ves", "f"},   {"xes", "x"}, {"zes", "z"},
    {"ches", "ch"}, {"shes", "sh"}, {"men", "man"}, {"ies", "y"}, {"es", "e"},
    {"es", ""},     {"ed", "e"},    {"ed", ""},     {"ing", "e"}, {"ing", ""},
    {"er", ""},     {"est", ""},    {"er", "e"},    {"est", "e"},
};

const char *const *rf_wordnet_lookup(const rf_wordnet *wn, const char *word, size_t len,
                                     size_t *count) {
    if (count) *count = 0;
    uint32_t id = st_find(&wn->st, word, len);
    const char *const *s = synonyms_of(wn, id, count);
    if (s) return s;
    if (id != NONE && wn->exc_start[id] != NONE) {
        for (const uint32_t *b = wn->exc + wn->exc_start[id]; *b != NONE; b++)
            if ((s = synonyms_of(wn, *b, count))) return s;
        return NULL;
    }
    char buf[MAX_WORD];
    for (size_t r = 0; r < sizeof RULES / sizeof RULES[0]; r++) {
        size_t sl = strlen(RULES[r][0]), rl = strlen(RULES[r][1]);
        if (len <= sl || len - sl + rl >= sizeof buf || memcmp(word + len - sl, RULES[r][0], sl))
            continue;
        memcpy(buf, word, len - sl);
        memcpy(buf + len - sl, RULES[r][1], rl);
        if ((s = synonyms_of(wn, st_find(&wn->st, buf, len - sl + rl), count))) return s;
    }
    return NULL;
}
