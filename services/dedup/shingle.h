/* Shingling: a normalized text becomes the hashes of its word n-grams or
 * character n-grams (one 64-bit hash per shingle, duplicates kept: MinHash and
 * the set builder tolerate them). A text shorter than n units is one shingle;
 * an empty text has none. */
#ifndef RF_DEDUP_SHINGLE_H
#define RF_DEDUP_SHINGLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rf_u64vec {
    uint64_t *v;
    size_t n, cap;
} rf_u64vec;

void rf_u64vec_free(rf_u64vec *a);

/* Replaces out with the shingle hashes of text[0..len) (words split on ' ').
 * char_mode selects n code points instead of n words. */
int rf_shingle(const char *text, size_t len, int ngram, bool char_mode, rf_u64vec *out);

#endif
