/* Plain-text records: a document per line, or per paragraph (lines up to a
 * blank line). Blank lines (ASCII whitespace only, e.g. WikiText's " \r") are
 * separators, not records. */
#ifndef RF_INGEST_TEXT_H
#define RF_INGEST_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

/* True if s[0..n) holds only spaces, tabs, CR, FF or VT. */
bool rf_text_blank(const char *s, size_t n);

/* True for a WikiText heading line: " = Title = ", " = = Section = = ", ...
 * (after trimming: starts with "= ", ends with " =", at least "= x ="). */
bool rf_text_wikitext_heading(const char *s, size_t n);

/* A paragraph being assembled from lines; lines are joined with '\n'. */
typedef struct rf_paragraph {
    rf_buf text;
    uint64_t line; /* first line's number and offset */
    uint64_t offset;
    size_t nlines;
    size_t max; /* bytes; once exceeded, further lines are counted, not kept */
    bool too_long;
} rf_paragraph;

void rf_paragraph_init(rf_paragraph *p, size_t max);
void rf_paragraph_free(rf_paragraph *p);
/* Adds a non-blank line (without its line break). Returns 0 or RF_ERR_NOMEM. */
int rf_paragraph_add(rf_paragraph *p, const char *s, size_t n, uint64_t line, uint64_t offset);
/* Starts over after the caller consumed the paragraph. */
void rf_paragraph_reset(rf_paragraph *p);

#endif
