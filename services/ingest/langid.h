/* Language identification with CLD2 (Compact Language Detector 2, Debian
 * libcld2) and a language-consistency filter on top of it.
 *
 * Policy: a document is rejected ("wrong_language") only when it has at least
 * min_bytes bytes, CLD2 calls its result reliable, the top language is not one
 * of the expected ones, and that language covers at least min_percent of the
 * text. Texts CLD2 cannot place ("un") are kept. CLD2 calls some short English
 * phrases reliably Italian or Finnish ("hopelessly juvenile"): on SST-2 train
 * (all English) it would reject 277 sentences with no length floor, 7 with
 * 30 bytes and none with 40, hence the default of 40.
 * CLD2's tables are read-only: safe from any number of threads. */
#ifndef RF_INGEST_LANGID_H
#define RF_INGEST_LANGID_H

#include <stdbool.h>
#include <stddef.h>

#include "common/config.h"

#define RF_LANGID_MAX_EXPECTED 8

typedef struct rf_langid_result {
    char code[16]; /* ISO 639-1 where one exists ("en", "de", "ja"), "un" if unknown */
    int percent;   /* share of the text in that language, 0..100 */
    double score;  /* CLD2 normalized score of the top language */
    bool reliable; /* CLD2's is_reliable */
} rf_langid_result;

/* Detects the main language of valid UTF-8 text[0..n). Returns 0, or
 * RF_ERR_INVALID if the text is not valid UTF-8. */
int rf_langid_detect(const char *text, size_t n, rf_langid_result *r);

typedef struct rf_langid_opts {
    size_t n_expected; /* 0 = filter off */
    char expected[RF_LANGID_MAX_EXPECTED][16];
    int min_percent;  /* default 50 */
    size_t min_bytes; /* shorter texts are never rejected; default 40 */
} rf_langid_opts;

/* Filter off (no expected language), min_percent 50, min_bytes 40. */
void rf_langid_opts_default(rf_langid_opts *o);

/* Reads a `language:` map: `expected: en` or `expected: [en, de]`,
 * `min_percent: 0..100`, `min_bytes`. Keys absent keep *o; section may be NULL. */
int rf_langid_opts_from_cfg(const rf_cfg *section, rf_langid_opts *o);

/* Applies the policy above. *reason is NULL (keep) or "wrong_language"; r, if
 * not NULL, receives the detection (r->code "" when the filter is off). */
int rf_langid_check(const rf_langid_opts *o, const char *text, size_t n, const char **reason,
                    rf_langid_result *r);

#endif
