/* EDA augmentation (see augment.h). Operations follow the reference code of
 * Wei & Zou (github.com/jasonwei20/eda_nlp, code/eda.py) on whitespace tokens:
 * synonym replacement picks distinct non-stop-words in random order and
 * replaces every occurrence of each; insertion puts a synonym of a random word
 * at a random position (up to 10 tries to find a word with synonyms); swap
 * exchanges two random positions (up to 3 tries for distinct ones); deletion
 * drops each word with probability alpha. */
#include "ingest/augment.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/rng.h"
#include "ingest/wordnet.h"

struct rf_augmenter {
    double alpha[4]; /* SR, RI, RS, RD */
    rf_wordnet *wn;
};

void rf_augment_opts_default(rf_augment_opts *o) {
    *o = (rf_augment_opts){
        .enabled = false,
        .n_aug = 4,
        .alpha_sr = 0.1,
        .alpha_ri = 0.1,
        .alpha_rs = 0.1,
        .alpha_rd = 0.1,
        .seed = 0,
        .wordnet_dir = "/usr/share/wordnet",
    };
}

int rf_augment_opts_from_cfg(const rf_cfg *sec, rf_augment_opts *o) {
    static const char *const KEYS[] = {"enabled",  "n_aug", "alpha_sr",    "alpha_ri", "alpha_rs",
                                       "alpha_rd", "seed",  "wordnet_dir", NULL};
    if (!sec) return 0;
    int64_t v;
    int rc;
    if ((rc = rf_cfg_check_keys(sec, KEYS)) ||
        (rc = rf_cfg_bool(sec, "enabled", o->enabled, &o->enabled)) ||
        (rc = rf_cfg_int(sec, "n_aug", (int64_t)o->n_aug, 0, 64, &v)))
        return rc;
    o->n_aug = (size_t)v;
    if ((rc = rf_cfg_real(sec, "alpha_sr", o->alpha_sr, 0, 1, &o->alpha_sr)) ||
        (rc = rf_cfg_real(sec, "alpha_ri", o->alpha_ri, 0, 1, &o->alpha_ri)) ||
        (rc = rf_cfg_real(sec, "alpha_rs", o->alpha_rs, 0, 1, &o->alpha_rs)) ||
        (rc = rf_cfg_real(sec, "alpha_rd", o->alpha_rd, 0, 1, &o->alpha_rd)) ||
        (rc = rf_cfg_int(sec, "seed", (int64_t)(o->seed & INT64_MAX), 0, INT64_MAX, &v)) ||
        (rc = rf_cfg_str(sec, "wordnet_dir", o->wordnet_dir, &o->wordnet_dir)))
        return rc;
    o->seed = (uint64_t)v;
    return 0;
}

int rf_augmenter_new(const rf_augment_opts *o, rf_augmenter **out) {
    *out = NULL;
    rf_augmenter *a = calloc(1, sizeof *a);
    if (!a) return RF_ERR_NOMEM;
    a->alpha[0] = o->alpha_sr;
    a->alpha[1] = o->alpha_ri;
    a->alpha[2] = o->alpha_rs;
    a->alpha[3] = o->alpha_rd;
    int rc = rf_wordnet_load(o->wordnet_dir ? o->wordnet_dir : "/usr/share/wordnet", &a->wn);
    if (rc) {
        free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void rf_augmenter_free(rf_augmenter *a) {
    if (!a) return;
    rf_wordnet_free(a->wn);
    free(a);
}

const char *const *rf_augmenter_synonyms(const rf_augmenter *a, const char *word, size_t len,
                                         size_t *count) {
    return rf_wordnet_lookup(a->wn, word, len, count);
}

uint64_t rf_augment_seed(uint64_t global_seed, const char *doc_id, size_t id_len) {
    return rf_mix64(global_seed ^ rf_hash64(doc_id, id_len, 0x45444121u));
}

/* A token: optional leading and trailing punctuation around a core word. The
 * core is replaced by synonyms; the punctuation stays. */
typedef struct token {
    const char *pre, *core, *suf;
    uint32_t pre_len, core_len, suf_len;
    bool cap; /* write the core with an uppercase first letter */
} token;

typedef struct tokens {
    token *t;
    size_t n, cap;
} tokens;

static int tokens_push(tokens *v, token t) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 32;
        token *p = realloc(v->t, cap * sizeof *p);
        if (!p) return RF_ERR_NOMEM;
        v->t = p;
        v->cap = cap;
    }
    v->t[v->n++] = t;
    return 0;
}

static bool is_word_char(unsigned char c) {
    return (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? true : (c >= '0' && c <= '9') || c >= 0x80;
}

static int tokenize(const char *s, size_t n, tokens *out) {
    for (size_t i = 0; i < n;) {
        while (i < n && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r')))
            i++;
        if (i >= n) break;
        size_t start = i;
        while (i < n && !(s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r')))
            i++;
        size_t a = start, b = i;
        while (a < b && !is_word_char((unsigned char)s[a]))
            a++;
        while (b > a && !is_word_char((unsigned char)s[b - 1]))
            b--;
        if (a == b) a = b = i; /* all punctuation: keep it as the prefix */
        token t = {s + start,         s + a, s + b, (uint32_t)(a - start), (uint32_t)(b - a),
                   (uint32_t)(i - b), false};
        if (tokens_push(out, t)) return RF_ERR_NOMEM;
    }
    return 0;
}

/* Lowercase ASCII form of a core into buf (size 64); false if it cannot be a
 * WordNet lemma (empty, too long, non-ASCII). */
static bool lower_core(const token *t, char *buf) {
    if (t->core_len == 0 || t->core_len >= 64) return false;
    for (uint32_t i = 0; i < t->core_len; i++) {
        unsigned char c = (unsigned char)t->core[i];
        if (c >= 0x80) return false;
        buf[i] = (char)(c >= 'A' && c <= 'Z' ? c | 0x20 : c);
    }
    buf[t->core_len] = '\0';
    return true;
}

/* The stop words of the EDA reference code (NLTK's English list); synonym
 * replacement leaves them alone. Sorted for bsearch. */
static const char *const STOP[] = {
    "",           "a",      "about",  "above", "after", "again",   "against",   "all",
    "am",         "an",     "and",    "any",   "are",   "as",      "at",        "be",
    "because",    "been",   "before", "being", "below", "between", "both",      "but",
    "by",         "can",    "did",    "do",    "does",  "doing",   "don",       "down",
    "during",     "each",   "few",    "for",   "from",  "further", "had",       "has",
    "have",       "having", "he",     "her",   "here",  "hers",    "herself",   "him",
    "himself",    "his",    "how",    "i",     "if",    "in",      "into",      "is",
    "it",         "its",    "itself", "just",  "me",    "more",    "most",      "my",
    "myself",     "no",     "nor",    "not",   "now",   "of",      "off",       "on",
    "once",       "only",   "or",     "other", "our",   "ours",    "ourselves", "out",
    "over",       "own",    "s",      "same",  "she",   "should",  "so",        "some",
    "such",       "t",      "than",   "that",  "the",   "their",   "theirs",    "them",
    "themselves", "then",   "there",  "these", "they",  "this",    "those",     "through",
    "to",         "too",    "under",  "until", "up",    "very",    "was",       "we",
    "were",       "what",   "when",   "where", "which", "while",   "who",       "whom",
    "why",        "will",   "with",   "you",   "your",  "yours",   "yourself",  "yourselves",
};

static int cstr_cmp(const void *k, const void *e) {
    return strcmp(k, *(const char *const *)e);
}

static bool is_stop(const char *w) {
    return bsearch(w, STOP, sizeof STOP / sizeof STOP[0], sizeof STOP[0], cstr_cmp) != NULL;
}

static const char *const *synonyms(const rf_augmenter *a, const token *t, size_t *count) {
    char low[64];
    if (!lower_core(t, low)) return NULL;
    return rf_wordnet_lookup(a->wn, low, t->core_len, count);
}

static token synonym_token(const char *syn, bool cap) {
    return (token){"", syn, "", 0, (uint32_t)strlen(syn), 0, cap};
}

static void shuffle(size_t *v, size_t n, rf_rng *r) {
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rf_rng_below(r, i);
        size_t x = v[i - 1];
        v[i - 1] = v[j];
        v[j] = x;
    }
}

/* Synonym replacement of up to k distinct non-stop words. */
static int op_replace(const rf_augmenter *a, tokens *w, size_t k, rf_rng *r) {
    size_t *order = malloc(w->n * sizeof *order), cand = 0;
    if (!order) return RF_ERR_NOMEM;
    char low[64], other[64];
    for (size_t i = 0; i < w->n; i++) { /* first occurrence of each distinct word */
        if (!lower_core(&w->t[i], low) || is_stop(low)) continue;
        bool seen = false;
        for (size_t j = 0; j < cand && !seen; j++)
            seen = lower_core(&w->t[order[j]], other) && strcmp(low, other) == 0;
        if (!seen) order[cand++] = i;
    }
    shuffle(order, cand, r);
    size_t done = 0;
    for (size_t c = 0; c < cand && done < k; c++) {
        size_t count;
        const char *const *syn = synonyms(a, &w->t[order[c]], &count);
        if (!syn) continue;
        const char *pick = syn[rf_rng_below(r, count)];
        lower_core(&w->t[order[c]], low);
        for (size_t i = 0; i < w->n; i++) {
            if (!lower_core(&w->t[i], other) || strcmp(low, other) != 0) continue;
            bool cap = w->t[i].core[0] >= 'A' && w->t[i].core[0] <= 'Z';
            w->t[i].core = pick;
            w->t[i].core_len = (uint32_t)strlen(pick);
            w->t[i].cap = cap;
        }
        done++;
    }
    free(order);
    return 0;
}

/* Random insertion of k synonyms. */
static int op_insert(const rf_augmenter *a, tokens *w, size_t k, rf_rng *r) {
    for (size_t i = 0; i < k && w->n; i++) {
        for (int tries = 0; tries < 10; tries++) {
            size_t count;
            const char *const *syn = synonyms(a, &w->t[rf_rng_below(r, w->n)], &count);
            if (!syn) continue;
            token t = synonym_token(syn[rf_rng_below(r, count)], false);
            size_t at = (size_t)rf_rng_below(r, w->n);
            if (tokens_push(w, t)) return RF_ERR_NOMEM;
            memmove(w->t + at + 1, w->t + at, (w->n - 1 - at) * sizeof *w->t);
            w->t[at] = t;
            break;
        }
    }
    return 0;
}

static void op_swap(tokens *w, size_t k, rf_rng *r) {
    if (w->n < 2) return;
    for (size_t i = 0; i < k; i++) {
        size_t x = (size_t)rf_rng_below(r, w->n), y = x;
        for (int tries = 0; tries < 4 && y == x; tries++)
            y = (size_t)rf_rng_below(r, w->n);
        token t = w->t[x];
        w->t[x] = w->t[y];
        w->t[y] = t;
    }
}

static void op_delete(tokens *w, double p, rf_rng *r) {
    if (w->n < 2) return;
    size_t kept = 0, n = w->n;
    for (size_t i = 0; i < n; i++)
        if (rf_rng_double(r) > p) w->t[kept++] = w->t[i];
    if (kept == 0) w->t[kept++] = w->t[rf_rng_below(r, n)];
    w->n = kept;
}

static int write_tokens(const tokens *w, rf_buf *out) {
    rf_buf_reset(out);
    int rc = rf_buf_reserve(out, 0);
    for (size_t i = 0; i < w->n && !rc; i++) {
        const token *t = &w->t[i];
        if (i) rc = rf_buf_putc(out, ' ');
        if (!rc) rc = rf_buf_append(out, t->pre, t->pre_len);
        if (!rc && t->cap && t->core_len) {
            char c = t->core[0];
            rc = rf_buf_putc(out, (char)(c >= 'a' && c <= 'z' ? c - 32 : c));
            if (!rc) rc = rf_buf_append(out, t->core + 1, t->core_len - 1);
        } else if (!rc) {
            rc = rf_buf_append(out, t->core, t->core_len);
        }
        if (!rc) rc = rf_buf_append(out, t->suf, t->suf_len);
    }
    return rc;
}

int rf_augment(const rf_augmenter *a, const char *text, size_t n, uint64_t seed, rf_buf *outs,
               size_t n_aug) {
    tokens orig = {0}, w = {0};
    rf_rng r;
    rf_rng_seed(&r, seed);
    int ops[4], n_ops = 0, rc = tokenize(text, n, &orig);
    for (int i = 0; i < 4; i++)
        if (a->alpha[i] > 0) ops[n_ops++] = i;
    for (size_t c = 0; c < n_aug && !rc; c++) {
        w.n = 0;
        for (size_t i = 0; i < orig.n && !rc; i++)
            rc = tokens_push(&w, orig.t[i]);
        if (rc) break;
        if (n_ops) {
            int op = ops[c % (size_t)n_ops];
            size_t k = (size_t)(a->alpha[op] * (double)orig.n);
            if (k < 1) k = 1;
            if (op == 0)
                rc = op_replace(a, &w, k, &r);
            else if (op == 1)
                rc = op_insert(a, &w, k, &r);
            else if (op == 2)
                op_swap(&w, k, &r);
            else
                op_delete(&w, a->alpha[3], &r);
        }
        if (!rc) rc = write_tokens(&w, &outs[c]);
    }
    free(orig.t);
    free(w.t);
    return rc;
}
