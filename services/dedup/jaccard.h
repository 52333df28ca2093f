/* Shingle sets for verifying LSH candidates. A document keeps the `cap`
 * smallest distinct 32-bit shingle values (a bottom-k sketch), so storage per
 * document is bounded. When both sets are complete (total <= cap) the Jaccard
 * is exact; otherwise it is the bottom-k estimate over the union. */
#ifndef RF_DEDUP_JACCARD_H
#define RF_DEDUP_JACCARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rf_shset {
    const uint32_t *v; /* sorted ascending, distinct */
    uint32_t len;      /* values stored (<= cap) */
    uint32_t total;    /* distinct shingles in the document */
} rf_shset;

/* Sorts and dedups shingle folds in place (v has n entries); returns the number
 * of distinct values; the first min(that, cap) are the stored set. */
size_t rf_shset_build(uint32_t *v, size_t n);

/* Jaccard of a and b; *exact tells whether it is exact or a bottom-k estimate. */
double rf_shset_jaccard(rf_shset a, rf_shset b, bool *exact);

#endif
