/* Text cleaning for ingest: one pass per document, in this fixed order
 *
 *   1. UTF-8 validation: repair (each maximal invalid subpart -> U+FFFD) or reject
 *   2. HTML (optional): strip tags/comments/script/style, then unescape entities
 *   3. control characters: C0/C1 and NUL removed; \t \n \r kept (or turned into
 *      spaces by step 5)
 *   4. NFKC normalization (utf8proc), skipped for pure ASCII which it cannot change
 *   5. whitespace: runs of Unicode whitespace -> one space, trimmed both ends
 *   6. lowercase (optional, full Unicode case mapping via utf8proc)
 *
 * HTML comes before NFKC so that "&#xFB01;" and a literal U+FB01 normalize alike;
 * controls go before NFKC so that characters they separated compose. Cleaning
 * without HTML is idempotent (the fuzz target checks it).
 * Pure functions: no global mutable state, safe from any number of threads. */
#ifndef RF_INGEST_CLEAN_H
#define RF_INGEST_CLEAN_H

#include <stdbool.h>
#include <stddef.h>

#include "common/buf.h"
#include "common/config.h"

typedef enum rf_utf8_policy { RF_UTF8_REPAIR, RF_UTF8_REJECT } rf_utf8_policy;

typedef struct rf_clean_opts {
    rf_utf8_policy utf8;
    bool nfkc;                /* Unicode NFKC */
    bool strip_control;       /* drop C0/C1 controls and NUL (not \t \n \r) */
    bool collapse_whitespace; /* Unicode whitespace runs -> ' ', trim */
    bool html_unescape;       /* &amp; &eacute; &#233; &#xE9; -> characters */
    bool strip_tags;          /* <...>, comments, script/style bodies removed */
    bool lowercase;
} rf_clean_opts;

typedef struct rf_clean_result {
    /* NULL if the document is kept, else a stable snake_case reason:
     *   "invalid_utf8"  input is not valid UTF-8 and policy is RF_UTF8_REJECT
     *   "empty"         nothing but whitespace/controls/markup is left */
    const char *reject;
    size_t utf8_repairs;     /* U+FFFD substitutions made (policy repair) */
    size_t controls_removed; /* control characters dropped, NUL bytes included */
    size_t nul_bytes;        /* of which NUL (U+0000) */
    size_t entities_decoded; /* HTML character references replaced */
    size_t tags_removed;     /* HTML tags and comments removed */
} rf_clean_result;

/* Defaults: repair, nfkc, strip_control, collapse_whitespace on; html_unescape,
 * strip_tags, lowercase off. */
void rf_clean_opts_default(rf_clean_opts *o);

/* Reads the keys of a `clean:` map (section may be NULL: nothing changes).
 * Keys absent keep the value already in *o, so a preset can be set first:
 *   utf8: repair|reject   nfkc: bool   strip_control: bool
 *   collapse_whitespace: bool   html_unescape: bool   strip_tags: bool
 *   lowercase: bool
 * Unknown keys fail with RF_ERR_INVALID naming the key. */
int rf_clean_opts_from_cfg(const rf_cfg *section, rf_clean_opts *o);

/* Cleans in[0..n) into out (reset first, then filled; NUL-terminated). Always
 * fills *res. Returns 0 (check res->reject) or a negative rf_err (NOMEM). */
int rf_clean_text(const rf_clean_opts *o, const char *in, size_t n, rf_buf *out,
                  rf_clean_result *res);

#endif
