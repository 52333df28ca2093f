/* Quality filters (see filter.h; README-text.md gives each rule's source).
 *
 * One pass splits the text into words (runs of non-whitespace) and measures
 * what the word rules need; line rules walk the lines only when one is on; the
 * n-gram rules hash words and run only if some 2-gram repeats, since without a
 * repeated 2-gram no longer n-gram can repeat either. */
#include "ingest/filter.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/utf8.h"

#define N_TOP (RF_QUALITY_NGRAM_MAX - RF_QUALITY_NGRAM_MIN + 1)
#define N_DUP (RF_QUALITY_DUPNGRAM_MAX - RF_QUALITY_DUPNGRAM_MIN + 1)

void rf_quality_opts_gopher(rf_quality_opts *o) {
    *o = (rf_quality_opts){
        .min_words = 50,
        .max_words = 100000,
        .min_mean_word_len = 3,
        .max_mean_word_len = 10,
        .max_symbol_ratio = 0.1,
        .max_bullet_line_frac = 0.9,
        .max_ellipsis_line_frac = 0.3,
        .min_alpha_word_frac = 0.8,
        .min_stop_words = 2,
        .max_dup_line_frac = 0.3,
        .max_dup_line_char_frac = 0.2,
        .max_top_ngram_frac = {0.20, 0.18, 0.16},
        .max_dup_ngram_frac = {0.15, 0.14, 0.13, 0.12, 0.11, 0.10},
        .min_terminal_punct_line_frac = 0.12, /* FineWeb */
        .max_short_line_frac = 0.67,          /* FineWeb */
    };
}

/* Reviews and SST-2 sentences are one line after cleaning and often a few
 * words ("Great!", "5 stars", "Works...", SST-2's "( allen )"): no minimum
 * length, Gopher's repetition rules only on texts of Gopher's minimum length
 * (50 words), relaxed word-shape rules, and no rules about lines, which say
 * nothing about a single line. README-text.md gives the measured effect. */
void rf_quality_opts_default(rf_quality_opts *o) {
    rf_quality_opts_gopher(o);
    o->min_words = 1;
    o->min_mean_word_len = 0;
    o->max_mean_word_len = 25;
    o->max_symbol_ratio = 1;
    o->max_bullet_line_frac = 1;
    o->max_ellipsis_line_frac = 1;
    o->min_alpha_word_frac = 0.25;
    o->min_stop_words = 0;
    o->ngram_min_words = 50;
    o->min_terminal_punct_line_frac = 0;
    o->max_short_line_frac = 1;
}

/* A sequence of reals (one per n) or a single real for all of them. */
static int cfg_fracs(const rf_cfg *sec, const char *key, double *v, size_t count) {
    const rf_cfg *n = rf_cfg_get(sec, key);
    if (!n) return 0;
    if (rf_cfg_kind_of(n) == RF_CFG_SCALAR) {
        double x;
        int rc = rf_cfg_real(sec, key, v[0], 0, 1, &x);
        for (size_t i = 0; !rc && i < count; i++)
            v[i] = x;
        return rc;
    }
    if (rf_cfg_kind_of(n) != RF_CFG_SEQ || rf_cfg_len(n) != count)
        return rf_fail(RF_ERR_INVALID, "%s:%d: %s: expected a number or a list of %zu numbers",
                       rf_cfg_source(n), rf_cfg_line(n), rf_cfg_path(n), count);
    for (size_t i = 0; i < count; i++) {
        const char *s = rf_cfg_scalar(rf_cfg_at(n, i));
        char *end = NULL;
        double x = s ? strtod(s, &end) : -1;
        if (!s || end == s || *end || !(x >= 0 && x <= 1))
            return rf_fail(RF_ERR_INVALID, "%s:%d: %s[%zu]: expected a number in [0, 1], got '%s'",
                           rf_cfg_source(n), rf_cfg_line(n), rf_cfg_path(n), i,
                           s ? s : "(not a scalar)");
        v[i] = x;
    }
    return 0;
}

int rf_quality_opts_from_cfg(const rf_cfg *sec, rf_quality_opts *o) {
    static const char *const KEYS[] = {"preset",
                                       "min_words",
                                       "max_words",
                                       "min_mean_word_len",
                                       "max_mean_word_len",
                                       "max_symbol_ratio",
                                       "max_bullet_line_frac",
                                       "max_ellipsis_line_frac",
                                       "min_alpha_word_frac",
                                       "min_stop_words",
                                       "max_dup_line_frac",
                                       "max_dup_line_char_frac",
                                       "ngram_min_words",
                                       "max_top_ngram_frac",
                                       "max_dup_ngram_frac",
                                       "min_terminal_punct_line_frac",
                                       "max_short_line_frac",
                                       NULL};
    static const char *const PRESETS[] = {"default", "gopher", NULL};
    if (!sec) return 0;
    int rc = rf_cfg_check_keys(sec, KEYS);
    if (rc) return rc;
    if (rf_cfg_get(sec, "preset")) {
        int p;
        if ((rc = rf_cfg_enum(sec, "preset", PRESETS, 0, &p))) return rc;
        (p == 0 ? rf_quality_opts_default : rf_quality_opts_gopher)(o);
    }
    int64_t v;
#define INT_KEY(k, max)                                                                            \
    if ((rc = rf_cfg_int(sec, #k, (int64_t)o->k, 0, max, &v))) return rc;                          \
    o->k = (size_t)v;
#define REAL_KEY(k, max)                                                                           \
    if ((rc = rf_cfg_real(sec, #k, o->k, 0, max, &o->k))) return rc;
    INT_KEY(min_words, INT64_C(1) << 40)
    INT_KEY(max_words, INT64_C(1) << 40)
    REAL_KEY(min_mean_word_len, 1e6)
    REAL_KEY(max_mean_word_len, 1e6)
    REAL_KEY(max_symbol_ratio, 1e6)
    REAL_KEY(max_bullet_line_frac, 1)
    REAL_KEY(max_ellipsis_line_frac, 1)
    REAL_KEY(min_alpha_word_frac, 1)
    INT_KEY(min_stop_words, INT64_C(1) << 40)
    INT_KEY(ngram_min_words, INT64_C(1) << 40)
    REAL_KEY(max_dup_line_frac, 1)
    REAL_KEY(max_dup_line_char_frac, 1)
    REAL_KEY(min_terminal_punct_line_frac, 1)
    REAL_KEY(max_short_line_frac, 1)
#undef INT_KEY
#undef REAL_KEY
    if ((rc = cfg_fracs(sec, "max_top_ngram_frac", o->max_top_ngram_frac, N_TOP))) return rc;
    return cfg_fracs(sec, "max_dup_ngram_frac", o->max_dup_ngram_frac, N_DUP);
}

static bool is_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

typedef struct word {
    uint32_t start, len; /* bytes in the text */
    uint32_t chars;      /* code points */
    uint32_t cum;        /* code points of the words before this one */
    uint64_t hash;       /* of the word */
    uint64_t gram;       /* of the n-gram starting here, n growing (check_ngrams) */
    uint32_t slot;       /* check_ngrams: its n-gram's table slot */
} word;

/* Words of the text plus the per-word measures; words[] is the caller's small
 * stack array or a heap array when the text has more words. */
typedef struct words {
    word *w;
    size_t n, cap;
    size_t chars, alpha_words, hashes, ellipses, stop_words;
    word small[256]; /* last: rf_quality_check zeroes what precedes it */
} words;

static bool is_alpha_cp(uint32_t cp) {
    if (cp < 0x80) return ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

static bool is_stop_word(const char *s, size_t n) {
    static const char *const STOP[] = {"the", "be", "to", "of", "and", "that", "have", "with"};
    if (n < 2 || n > 4) return false;
    char low[4];
    for (size_t i = 0; i < n; i++)
        low[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] | 0x20 : s[i]);
    for (size_t i = 0; i < sizeof STOP / sizeof STOP[0]; i++)
        if (strlen(STOP[i]) == n && memcmp(STOP[i], low, n) == 0) return true;
    return false;
}

/* Byte classes for split_words. */
enum { A_SPACE = 1, A_ALPHA = 2, A_MARK = 4 /* '#' or '.' */, A_HIGH = 8 /* not ASCII */ };
static const unsigned char BYTE_CLASS[256] = {
    [0x80 ... 0xFF] = A_HIGH, /* GNU range designator, accepted by gcc and clang */
    ['\t'] = A_SPACE,
    ['\n'] = A_SPACE,
    ['\v'] = A_SPACE,
    ['\f'] = A_SPACE,
    ['\r'] = A_SPACE,
    [' '] = A_SPACE,
    ['#'] = A_MARK,
    ['.'] = A_MARK,
#define L(c) [c] = A_ALPHA, [c + 32] = A_ALPHA
    L('A'),
    L('B'),
    L('C'),
    L('D'),
    L('E'),
    L('F'),
    L('G'),
    L('H'),
    L('I'),
    L('J'),
    L('K'),
    L('L'),
    L('M'),
    L('N'),
    L('O'),
    L('P'),
    L('Q'),
    L('R'),
    L('S'),
    L('T'),
    L('U'),
    L('V'),
    L('W'),
    L('X'),
    L('Y'),
    L('Z'),
#undef L
};

static int add_word(words *ws, const char *t, size_t start, size_t end, size_t chars, bool alpha,
                    bool stops) {
    if (ws->n == ws->cap) {
        size_t cap = ws->cap * 2;
        word *w = ws->w == ws->small ? malloc(cap * sizeof *w) : realloc(ws->w, cap * sizeof *w);
        if (!w) return RF_ERR_NOMEM;
        if (ws->w == ws->small) memcpy(w, ws->small, ws->n * sizeof *w);
        ws->w = w;
        ws->cap = cap;
    }
    if (end > UINT32_MAX) return rf_fail(RF_ERR_RANGE, "quality: text longer than 4 GiB");
    word *w = &ws->w[ws->n++]; /* the n-gram fields are set by check_ngrams */
    w->start = (uint32_t)start;
    w->len = (uint32_t)(end - start);
    w->chars = (uint32_t)chars;
    ws->chars += chars;
    ws->alpha_words += alpha;
    ws->stop_words += stops && is_stop_word(t + start, end - start);
    return 0;
}

#define ONES 0x0101010101010101ull
#define HIGH 0x8080808080808080ull

/* Per-byte flag (0x80) of the bytes of x equal to b; exact for any bytes. */
static inline uint64_t bytes_eq(uint64_t x, unsigned char b) {
    uint64_t v = x ^ (ONES * b);
    return ~(((v & ~HIGH) + ~HIGH) | v) & HIGH;
}

/* Per-byte flag of the ASCII bytes of x in (lo, hi), exclusive (bit-twiddling
 * hacks' hasbetween; no carries between bytes). */
static inline uint64_t bytes_between(uint64_t x, unsigned lo, unsigned hi) {
    uint64_t low = x & ~HIGH;
    return (ONES * (127 + hi) - low) & ~x & (low + ONES * (127 - lo)) & HIGH;
}

/* Bytes that end a plain run in split_words: whitespace, '#', '.', non-ASCII. */
static inline uint64_t stop_bytes(uint64_t x) {
    return (x & HIGH) | bytes_eq(x, ' ') | bytes_between(x, '\t' - 1, '\r' + 1) | bytes_eq(x, '#') |
           bytes_eq(x, '.');
}

/* ASCII letters: x | 0x20 in 'a'..'z'. */
static inline uint64_t letter_bytes(uint64_t x) {
    return bytes_between(x | ONES * 0x20, 'a' - 1, 'z' + 1);
}

/* Splits t[0..n) into ws, stopping after max_words words (0 = no limit) so
 * that a huge text costs no more memory than the word-count rule needs. */
static int split_words(const char *t, size_t n, bool stops, size_t max_words, words *ws) {
    const unsigned char *u = (const unsigned char *)t;
    size_t i = 0;
    while (i < n && (!max_words || ws->n <= max_words)) {
        while (i < n && (BYTE_CLASS[u[i]] & A_SPACE))
            i++;
        if (i >= n) break;
        size_t start = i, chars = 0;
        bool alpha = false;
        while (i < n) {
            /* Plain ASCII run: letters, digits, punctuation other than '#' '.'.
             * Eight bytes at a time, then byte by byte near the end. */
            size_t run = i;
            while (i + 8 <= n) {
                uint64_t x;
                memcpy(&x, u + i, 8);
                uint64_t stop = stop_bytes(x);
                size_t k = stop ? (size_t)__builtin_ctzll(stop) >> 3 : 8;
                uint64_t keep = k == 8 ? ~0ull : (1ull << (8 * k)) - 1;
                alpha |= (letter_bytes(x) & keep) != 0;
                i += k;
                if (k < 8) break;
            }
            unsigned acc = 0, cls;
            while (i < n && !((cls = BYTE_CLASS[u[i]]) & (A_SPACE | A_MARK | A_HIGH))) {
                acc |= cls;
                i++;
            }
            alpha |= (acc & A_ALPHA) != 0;
            chars += i - run;
            if (i >= n) break;
            uint32_t cp = u[i];
            if (cp < 0x80) {
                if (BYTE_CLASS[cp] & A_SPACE) break;
                ws->hashes += cp == '#'; /* a mark: '#' or '.' */
                if (cp == '.' && i + 2 < n && u[i + 1] == '.' && u[i + 2] == '.') {
                    size_t j = i; /* a run of three or more dots is one ellipsis */
                    while (j < n && u[j] == '.')
                        j++;
                    ws->ellipses++;
                    chars += j - i;
                    i = j;
                    continue;
                }
                i++;
                chars++;
                continue;
            }
            int k = rf_utf8_decode(u + i, n - i, &cp);
            if (k < 0) { /* tolerate invalid bytes: one char each */
                k = -k;
                cp = RF_UTF8_REPLACEMENT;
            }
            alpha = alpha || is_alpha_cp(cp);
            ws->ellipses += cp == 0x2026;
            i += (size_t)k;
            chars++;
        }
        int rc = add_word(ws, t, start, i, chars, alpha, stops);
        if (rc) return rc;
    }
    return 0;
}

/* Open-addressing table of 64-bit keys, sized for every word of a text.
 * Slots of an older generation are empty, so a new pass costs nothing. */
typedef struct slot {
    uint64_t key;
    uint32_t count; /* occurrences, | SEEN once the dup-n-gram scan passed one */
    uint32_t gen;
} slot;

/* A count never reaches it (a text of 4 GiB has fewer words), and a count
 * of 2 or more stays so with it set. */
#define SEEN 0x80000000u

typedef struct table {
    slot *s;
    size_t mask;
    uint32_t gen; /* current generation; calloc's 0 is never current */
} table;

static int table_init(table *t, size_t items) {
    size_t cap = 16;
    while (cap < items * 2)
        cap *= 2;
    t->s = calloc(cap, sizeof *t->s);
    t->mask = cap - 1;
    t->gen = 1;
    return t->s ? 0 : RF_ERR_NOMEM;
}

struct rf_quality_scratch {
    slot *slots; /* n_slots, a power of two; tables use a prefix of it */
    size_t n_slots;
    uint32_t gen; /* last generation used in slots */
    uint32_t *cand;
    size_t cand_cap;
};

rf_quality_scratch *rf_quality_scratch_new(void) {
    return calloc(1, sizeof(rf_quality_scratch));
}

static void scratch_release(rf_quality_scratch *sc) {
    free(sc->slots);
    free(sc->cand);
}

void rf_quality_scratch_free(rf_quality_scratch *s) {
    if (!s) return;
    scratch_release(s);
    free(s);
}

/* A table for items keys on the scratch slots, in a new generation; the
 * caller stores t->gen back into sc->gen when done. */
static int scratch_table(rf_quality_scratch *sc, size_t items, table *t) {
    size_t cap = 16;
    while (cap < items * 2)
        cap *= 2;
    if (cap > sc->n_slots) {
        free(sc->slots);
        sc->n_slots = 0;
        if (!(sc->slots = calloc(cap, sizeof *sc->slots))) return RF_ERR_NOMEM;
        sc->n_slots = cap;
        sc->gen = 0;
    }
    if (sc->gen > UINT32_MAX - 64) { /* a pass per n per text: wrap long before */
        memset(sc->slots, 0, sc->n_slots * sizeof *sc->slots);
        sc->gen = 0;
    }
    t->s = sc->slots;
    t->mask = cap - 1;
    t->gen = sc->gen + 1;
    return 0;
}

/* Counts key; returns its slot's index. */
static uint32_t table_add(table *t, uint64_t key) {
    size_t i = (size_t)key & t->mask;
    while (t->s[i].gen == t->gen && t->s[i].key != key)
        i = (i + 1) & t->mask;
    if (t->s[i].gen != t->gen) t->s[i] = (slot){key, 0, t->gen};
    t->s[i].count++;
    return (uint32_t)i;
}

/* The last n (1..8) bytes before end as a little-endian word, zero-padded;
 * one load when eight bytes are readable from s (avail), else byte by byte. */
static inline uint64_t tail_bytes(const char *s, size_t n, size_t avail) {
    uint64_t x = 0;
    if (avail >= 8) {
        memcpy(&x, s, 8);
        return n == 8 ? x : x & ((1ull << (8 * n)) - 1);
    }
    for (size_t i = 0; i < n; i++)
        x |= (uint64_t)(unsigned char)s[i] << (8 * i);
    return x;
}

/* A cheap 64-bit hash of the word s[0..n), avail bytes readable from s: one
 * splitmix step for a word of up to eight bytes (most words), one more per
 * eight bytes beyond. Only equality of hashes matters. */
static inline uint64_t word_hash(const char *s, size_t n, size_t avail) {
    if (n <= 8) return rf_mix64(tail_bytes(s, n, avail) ^ (n * 0x9e3779b97f4a7c15ull));
    uint64_t h = rf_mix64(n);
    for (; n > 8; s += 8, n -= 8, avail -= 8) {
        uint64_t x;
        memcpy(&x, s, 8);
        h = rf_mix64(h ^ x);
    }
    return rf_mix64(h ^ tail_bytes(s, n, avail));
}

/* Word chars of words [i, i + n). */
static size_t span_chars(const words *ws, size_t i, size_t n) {
    size_t end = i + n < ws->n ? ws->w[i + n].cum : ws->chars;
    return end - ws->w[i].cum;
}

/* Gopher repetition rules over words, for n = 2..10 in one sweep. The hash of
 * the n-gram at i extends that of the (n-1)-gram at i, and an n-gram can only
 * repeat if its (n-1)-gram prefix did, so each pass visits only the positions
 * whose previous n-gram repeated and the sweep ends when none is left. Sets
 * *reason or leaves it NULL. */
static int check_ngrams(const rf_quality_opts *o, rf_quality_scratch *sc, const char *text,
                        size_t len, words *ws, const char **reason) {
    bool top_on = false, dup_on = false;
    for (size_t i = 0; i < N_TOP; i++)
        top_on |= o->max_top_ngram_frac[i] < 1;
    for (size_t i = 0; i < N_DUP; i++)
        dup_on |= o->max_dup_ngram_frac[i] < 1;
    if ((!top_on && !dup_on) || ws->n < 2 || ws->n < o->ngram_min_words || ws->chars == 0) return 0;
    word *w = ws->w;
    /* cand[0..m): the positions, ascending, whose (n-1)-gram repeated. */
    if (ws->n > sc->cand_cap) {
        free(sc->cand);
        sc->cand_cap = 0;
        if (!(sc->cand = malloc(ws->n * sizeof *sc->cand))) return RF_ERR_NOMEM;
        sc->cand_cap = ws->n;
    }
    uint32_t *cand = sc->cand;
    table t;
    int rc = scratch_table(sc, ws->n, &t);
    if (rc) return rc;
    /* Below this fraction of word chars, no dup_ngram rule can fire. */
    double dup_floor = 1;
    for (size_t i = 0; i < N_DUP; i++)
        if (o->max_dup_ngram_frac[i] < dup_floor) dup_floor = o->max_dup_ngram_frac[i];
    size_t m = 0;
    for (size_t i = 0, cum = 0; i < ws->n; i++) {
        w[i].hash = word_hash(text + w[i].start, w[i].len, len - w[i].start);
        w[i].gram = rf_mix64(w[i].hash); /* not w[i].hash: "a b" and "b a" must differ */
        w[i].cum = (uint32_t)cum;
        cum += w[i].chars;
        cand[m++] = (uint32_t)i;
    }
    double total = (double)ws->chars;
    for (size_t n = RF_QUALITY_NGRAM_MIN; n <= RF_QUALITY_DUPNGRAM_MAX && n <= ws->n; n++) {
        if (n > RF_QUALITY_NGRAM_MAX && !dup_on) break;
        size_t last = ws->n - n; /* last start position of an n-gram */
        if (n > RF_QUALITY_NGRAM_MIN) {
            /* Keep the positions whose (n-1)-gram repeated (slots of the
             * previous pass), then start a new generation. Along the way,
             * cover = word chars covered by those repeated (n-1)-grams. A
             * repeated n-gram at i has repeated (n-1)-grams at i and i + 1,
             * so the chars of repeated n-grams (and those of every longer n)
             * are within cover: once cover is under every dup_ngram
             * threshold, no later pass can reject. */
            size_t kept = 0, cover = 0, covered_to = 0;
            for (size_t k = 0; k < m && cand[k] <= last + 1; k++) {
                size_t i = cand[k];
                if (t.s[w[i].slot].count < 2) continue;
                size_t a = i > covered_to ? i : covered_to;
                covered_to = i + n - 1;
                if (covered_to > a) cover += span_chars(ws, a, covered_to - a);
                if (i <= last) cand[kept++] = (uint32_t)i;
            }
            m = kept;
            if (m == 0) break;
            if (n > RF_QUALITY_NGRAM_MAX && (double)cover / total <= dup_floor) break;
            t.gen++;
        }
        /* Most frequent n-gram: chars of all its occurrences / all word chars;
         * only a repeated n-gram counts (a text that is one 2-gram is not
         * repetitive). Counts only rise, so the best seen along the way is the
         * best at the end. */
        size_t best = 0;
        for (size_t k = 0; k < m && cand[k] <= last; k++) {
            size_t i = cand[k];
            w[i].gram = rf_mix64(w[i].gram ^ w[i + n - 1].hash);
            w[i].slot = table_add(&t, w[i].gram);
            /* Its chars: those of this occurrence (the same words). */
            size_t c = t.s[w[i].slot].count, v = c >= 2 ? c * span_chars(ws, i, n) : 0;
            best = v > best ? v : best;
        }
        if (n <= RF_QUALITY_NGRAM_MAX) {
            double max = o->max_top_ngram_frac[n - RF_QUALITY_NGRAM_MIN];
            if (max < 1 && (double)best / total > max) *reason = "top_ngram";
        } else {
            /* Duplicated n-grams: scanning left to right, an n-gram seen
             * before covers its words and the scan jumps past it (as in
             * Gopher and datatrove). An n-gram that occurs once is never
             * seen before, so only the candidates matter; `next` is where
             * the scan stands after its last jump. */
            size_t dup = 0, next = 0;
            for (size_t k = 0; k < m && cand[k] <= last; k++) {
                size_t i = cand[k];
                if (i < next) continue;
                slot *s = &t.s[w[i].slot];
                if (s->count < 2) continue;
                if (s->count & SEEN) {
                    dup += span_chars(ws, i, n);
                    next = i + n;
                } else {
                    s->count |= SEEN;
                }
            }
            double max = o->max_dup_ngram_frac[n - RF_QUALITY_DUPNGRAM_MIN];
            if (max < 1 && (double)dup / total > max) *reason = "dup_ngram";
        }
        if (*reason) break;
    }
    sc->gen = t.gen;
    return 0;
}

/* Line rules; lines that are empty or whitespace are skipped. */
static int check_lines(const rf_quality_opts *o, const char *t, size_t n, const char **reason) {
    bool dup_on = o->max_dup_line_frac < 1 || o->max_dup_line_char_frac < 1;
    bool shape_on = o->max_bullet_line_frac < 1 || o->max_ellipsis_line_frac < 1 ||
                    o->min_terminal_punct_line_frac > 0 || o->max_short_line_frac < 1;
    /* One line cannot be a duplicate of another. */
    if (!shape_on && (!dup_on || !memchr(t, '\n', n))) return 0;
    size_t lines = 0, bullets = 0, ellipses = 0, punct = 0, shorts = 0, dups = 0;
    size_t chars = 0, dup_chars = 0;
    table tab = {NULL, 0, 0};
    if (dup_on) {
        size_t nl = 1;
        for (const char *p = t; (p = memchr(p, '\n', n - (size_t)(p - t))) != NULL; p++)
            nl++;
        if (table_init(&tab, nl)) return RF_ERR_NOMEM;
    }
    for (size_t i = 0; i < n;) {
        const char *nlp = memchr(t + i, '\n', n - i);
        size_t end = nlp ? (size_t)(nlp - t) : n, a = i, b = end;
        i = end + 1;
        while (a < b && is_space((unsigned char)t[a]))
            a++;
        while (b > a && is_space((unsigned char)t[b - 1]))
            b--;
        if (a == b) continue;
        const char *l = t + a;
        size_t len = b - a, lchars = rf_utf8_count(l, len);
        lines++;
        chars += lchars;
        bullets += l[0] == '*' || l[0] == '-' ||
                   (len >= 3 && (memcmp(l, "\xE2\x80\xA2", 3) == 0 || /* • */
                                 memcmp(l, "\xE2\x97\x8F", 3) == 0 || /* ● */
                                 memcmp(l, "\xE2\x80\xA3", 3) == 0 || /* ‣ */
                                 memcmp(l, "\xE2\x97\xA6", 3) == 0)); /* ◦ */
        bool ell = (len >= 3 && memcmp(l + len - 3, "...", 3) == 0) ||
                   (len >= 3 && memcmp(l + len - 3, "\xE2\x80\xA6", 3) == 0);
        ellipses += ell;
        char last = l[len - 1];
        punct += !ell && (last == '.' || last == '!' || last == '?' || last == '"' || last == '\'');
        shorts += lchars < 30;
        if (dup_on && tab.s[table_add(&tab, rf_hash64(l, len, 0))].count >= 2) {
            dups++;
            dup_chars += lchars;
        }
    }
    free(tab.s);
    if (lines == 0) return 0;
    double L = (double)lines;
    if (bullets / L > o->max_bullet_line_frac)
        *reason = "bullet_lines";
    else if (ellipses / L > o->max_ellipsis_line_frac)
        *reason = "ellipsis_lines";
    else if (dups / L > o->max_dup_line_frac)
        *reason = "dup_lines";
    else if (chars && (double)dup_chars / (double)chars > o->max_dup_line_char_frac)
        *reason = "dup_line_chars";
    else if (punct / L < o->min_terminal_punct_line_frac)
        *reason = "terminal_punct";
    else if (shorts / L > o->max_short_line_frac)
        *reason = "short_lines";
    return 0;
}

int rf_quality_check(const rf_quality_opts *o, const char *text, size_t n, const char **reason) {
    return rf_quality_check_with(o, NULL, text, n, reason);
}

int rf_quality_check_with(const rf_quality_opts *o, rf_quality_scratch *sc, const char *text,
                          size_t n, const char **reason) {
    *reason = NULL;
    words ws; /* not zeroed as a whole: small[] is 10 KiB */
    memset(&ws, 0, offsetof(words, small));
    ws.w = ws.small;
    ws.cap = sizeof ws.small / sizeof ws.small[0];
    int rc = split_words(text, n, o->min_stop_words > 0, o->max_words, &ws);
    if (rc) goto out;
    double nw = (double)ws.n, mean = ws.n ? (double)ws.chars / nw : 0;
    if (ws.n < o->min_words)
        *reason = "too_few_words";
    else if (o->max_words && ws.n > o->max_words)
        *reason = "too_many_words";
    else if (ws.n && o->min_mean_word_len > 0 && mean < o->min_mean_word_len)
        *reason = "mean_word_len_low";
    else if (ws.n && o->max_mean_word_len > 0 && mean > o->max_mean_word_len)
        *reason = "mean_word_len_high";
    else if (ws.n && o->max_symbol_ratio >= 0 &&
             ((double)ws.hashes / nw > o->max_symbol_ratio ||
              (double)ws.ellipses / nw > o->max_symbol_ratio))
        *reason = "symbol_ratio";
    if (*reason) goto out;
    if ((rc = check_lines(o, text, n, reason)) || *reason) goto out;
    if (ws.n && (double)ws.alpha_words / nw < o->min_alpha_word_frac)
        *reason = "alpha_words";
    else if (ws.stop_words < o->min_stop_words)
        *reason = "stop_words";
    if (*reason) goto out;
    if (sc) {
        rc = check_ngrams(o, sc, text, n, &ws, reason);
    } else {
        rf_quality_scratch local = {0};
        rc = check_ngrams(o, &local, text, n, &ws, reason);
        scratch_release(&local);
    }
out:
    if (ws.w != ws.small) free(ws.w);
    return rc;
}
