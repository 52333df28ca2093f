/* Text normalization before hashing: the exact-duplicate key and the shingles
 * are computed on the normalized form, so two reviews differing only in case,
 * punctuation, spacing or numbers can count as the same text. */
#ifndef RF_DEDUP_NORMALIZE_H
#define RF_DEDUP_NORMALIZE_H

#include <stddef.h>

#include "common/buf.h"

enum {
    RF_NORM_CASE = 1 << 0,   /* Unicode case folding (utf8proc) */
    RF_NORM_PUNCT = 1 << 1,  /* delete punctuation (Unicode categories P*) */
    RF_NORM_SPACE = 1 << 2,  /* collapse whitespace runs to one ' ', trim */
    RF_NORM_DIGITS = 1 << 3, /* every decimal digit becomes '0' */
    RF_NORM_ALL = 0xf,
};

/* Parses "case,punct,space,digits", "all" or "none" into flags. */
int rf_norm_parse(const char *spec, unsigned *flags);
/* Writes the canonical spec of flags ("case,punct,space,digits" or "none"). */
void rf_norm_format(unsigned flags, char *out, size_t cap);

/* Replaces out with the normalized form of text[0..len). Whitespace of any kind
 * (Unicode Z*, ASCII controls) always becomes ' ' so words split on ' ' alone;
 * invalid UTF-8 becomes U+FFFD. */
int rf_normalize(const char *text, size_t len, unsigned flags, rf_buf *out);

#endif
