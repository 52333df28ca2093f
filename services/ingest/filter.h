/* Document quality filters after Gopher (Rae et al. 2021, App. A), C4 (Raffel
 * et al. 2020, §2.2) and FineWeb (Penedo et al. 2024). Each rule has its own
 * threshold; a threshold at its "off" value disables the rule. The text given
 * is the cleaned text (valid UTF-8). Words are runs of non-whitespace.
 *
 * rf_quality_opts_default() gives the project's defaults, chosen for short
 * product reviews and SST-2 sentences ("Great!" must pass): document-length and
 * line-structure rules are relaxed, repetition and symbol rules keep the paper
 * values. rf_quality_opts_gopher() gives the published web-scale values.
 * README-text.md lists every rule with its source and both values. */
#ifndef RF_INGEST_FILTER_H
#define RF_INGEST_FILTER_H

#include <stdbool.h>
#include <stddef.h>

#include "common/config.h"

#define RF_QUALITY_NGRAM_MIN    2 /* max_top_ngram_frac[0] is for 2-grams */
#define RF_QUALITY_NGRAM_MAX    4
#define RF_QUALITY_DUPNGRAM_MIN 5 /* max_dup_ngram_frac[0] is for 5-grams */
#define RF_QUALITY_DUPNGRAM_MAX 10

typedef struct rf_quality_opts {
    size_t min_words;              /* reason too_few_words; 0 = off */
    size_t max_words;              /* too_many_words; 0 = off */
    double min_mean_word_len;      /* mean_word_len_low (chars); 0 = off */
    double max_mean_word_len;      /* mean_word_len_high; 0 = off */
    double max_symbol_ratio;       /* symbol_ratio: ('#' + "..."/'…') per word; <0 = off */
    double max_bullet_line_frac;   /* bullet_lines: lines starting with a bullet; >=1 = off */
    double max_ellipsis_line_frac; /* ellipsis_lines: lines ending in "..."/'…'; >=1 = off */
    double min_alpha_word_frac;    /* alpha_words: words with a letter; 0 = off */
    size_t min_stop_words;    /* stop_words: Gopher's {the be to of and that have with}; 0 = off */
    double max_dup_line_frac; /* dup_lines: duplicate lines / lines; >=1 = off */
    double max_dup_line_char_frac; /* dup_line_chars: chars in duplicate lines / chars; >=1 = off */
    /* The n-gram rules below skip texts with fewer words (Gopher only ever saw
     * documents of >= 50 words; in one sentence, repetition is rhetoric). */
    size_t ngram_min_words;
    /* top_ngram: chars of the most frequent n-gram / chars of all words, n=2..4 */
    double max_top_ngram_frac[RF_QUALITY_NGRAM_MAX - RF_QUALITY_NGRAM_MIN + 1];
    /* dup_ngram: chars covered by repeated n-grams / chars of all words, n=5..10 */
    double max_dup_ngram_frac[RF_QUALITY_DUPNGRAM_MAX - RF_QUALITY_DUPNGRAM_MIN + 1];
    double min_terminal_punct_line_frac; /* terminal_punct (C4/FineWeb); 0 = off */
    double max_short_line_frac;          /* short_lines: lines < 30 chars (FineWeb); >=1 = off */
} rf_quality_opts;

/* Project defaults (see README-text.md). */
void rf_quality_opts_default(rf_quality_opts *o);
/* The published Gopher + C4/FineWeb line rules, for web-scale documents. */
void rf_quality_opts_gopher(rf_quality_opts *o);

/* Reads a `quality:` map; keys are the field names above, plus
 * `preset: default|gopher` applied first, and `max_top_ngram_frac` /
 * `max_dup_ngram_frac` as sequences (or one number for all n). Keys absent keep
 * the value in *o; unknown keys fail naming the key. section may be NULL. */
int rf_quality_opts_from_cfg(const rf_cfg *section, rf_quality_opts *o);

/* Checks text[0..n). Sets *reason to NULL to keep, or to a static reason
 * string (the names in the comments above, e.g. "too_few_words"). The first
 * failing rule is reported, in this order: words, mean word length, symbols,
 * line rules (bullet, ellipsis, dup lines, dup line chars, terminal punct,
 * short lines), alpha words, stop words, top n-gram, dup n-gram.
 * Returns 0, or RF_ERR_NOMEM (n-gram tables of long documents allocate). */
int rf_quality_check(const rf_quality_opts *o, const char *text, size_t n, const char **reason);

/* Memory that rf_quality_check_with reuses from one text to the next (the
 * n-gram table and its position lists), so that a worker checking many short
 * texts allocates only when a text is longer than any before. One per thread. */
typedef struct rf_quality_scratch rf_quality_scratch;

rf_quality_scratch *rf_quality_scratch_new(void); /* NULL on OOM */
void rf_quality_scratch_free(rf_quality_scratch *s);
/* rf_quality_check with scratch memory s (NULL: allocate per call). Same result. */
int rf_quality_check_with(const rf_quality_opts *o, rf_quality_scratch *s, const char *text,
                          size_t n, const char **reason);

#endif
