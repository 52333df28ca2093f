/* Joining a record's text fields into its text (text_fields + text_join). */
#ifndef RF_INGEST_JOIN_H
#define RF_INGEST_JOIN_H

#include <stdbool.h>
#include <stddef.h>

#include "common/buf.h"

#define RF_TEXT_JOIN_MAX 8 /* = RF_INGEST_MAX_TEXT_FIELDS */

typedef struct rf_text_part {
    const char *p;
    size_t n;
} rf_text_part;

/* Joins parts[0..n) (1 <= n <= RF_TEXT_JOIN_MAX), in order, with sep between
 * them: into out (reset first), or, when one part is left, by pointing *text
 * at it without a copy. With skip_contained, a part whose normalized text
 * occurs in that of another part is left out; of equal parts the first stays.
 * Normalized: ASCII whitespace runs as one space, and leading and trailing
 * ellipses ("...", U+2026) and spaces trimmed, since a summary cut out of a
 * review marks the cut ("First sentence. ..."). Case is kept. norm is scratch
 * (required with skip_contained).
 * Returns 0 or RF_ERR_NOMEM. */
int rf_text_join(const rf_text_part *parts, size_t n, const char *sep, bool skip_contained,
                 rf_buf *out, rf_buf *norm, const char **text, size_t *len);

#endif
