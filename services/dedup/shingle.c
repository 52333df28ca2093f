#include "dedup/shingle.h"

#include <stdlib.h>

#include "common/error.h"
#include "common/hash.h"

#define WORD_SEED 0x5eed0001u
#define CHAR_SEED 0x5eed0002u
#define MAX_NGRAM 64

void rf_u64vec_free(rf_u64vec *a) {
    free(a->v);
    *a = (rf_u64vec){0};
}

static int push(rf_u64vec *a, uint64_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        uint64_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return RF_ERR_NOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return RF_OK;
}

/* Word n-grams: each word is hashed once, then n consecutive word hashes are
 * chained through splitmix64, which keeps order (a b c != b a c). */
static int word_shingles(const char *t, size_t len, int n, rf_u64vec *out) {
    uint64_t ring[MAX_NGRAM];
    size_t nwords = 0, i = 0;
    while (i < len) {
        while (i < len && t[i] == ' ')
            i++;
        if (i == len) break;
        size_t start = i;
        while (i < len && t[i] != ' ')
            i++;
        ring[nwords % (size_t)n] = rf_hash64(t + start, i - start, WORD_SEED);
        nwords++;
        if (nwords >= (size_t)n) {
            uint64_t h = 0;
            for (size_t j = nwords - (size_t)n; j < nwords; j++)
                h = rf_mix64(h ^ ring[j % (size_t)n]);
            int rc = push(out, h);
            if (rc) return rc;
        }
    }
    if (nwords > 0 && nwords < (size_t)n) {
        uint64_t h = 0;
        for (size_t j = 0; j < nwords; j++)
            h = rf_mix64(h ^ ring[j]);
        return push(out, h);
    }
    return RF_OK;
}

/* Character n-grams over code points: the byte span of n code points is hashed. */
static int char_shingles(const char *t, size_t len, int n, rf_u64vec *out) {
    size_t starts[MAX_NGRAM];
    size_t ncp = 0;
    for (size_t i = 0; i <= len; i++) {
        bool boundary = i == len || ((unsigned char)t[i] & 0xc0) != 0x80;
        if (!boundary) continue;
        if (ncp >= (size_t)n) {
            size_t from = starts[(ncp - (size_t)n) % (size_t)n];
            int rc = push(out, rf_hash64(t + from, i - from, CHAR_SEED));
            if (rc) return rc;
        }
        if (i == len) break;
        starts[ncp % (size_t)n] = i;
        ncp++;
    }
    if (ncp > 0 && ncp < (size_t)n) return push(out, rf_hash64(t, len, CHAR_SEED));
    return RF_OK;
}

int rf_shingle(const char *text, size_t len, int ngram, bool char_mode, rf_u64vec *out) {
    if (ngram < 1 || ngram > MAX_NGRAM)
        return rf_fail(RF_ERR_INVALID, "ngram %d: expected 1..%d", ngram, MAX_NGRAM);
    out->n = 0;
    return char_mode ? char_shingles(text, len, ngram, out) : word_shingles(text, len, ngram, out);
}
