/* HTML to text: tag stripping and character-reference unescaping. Used by
 * clean.c; exposed for tests. Input must be valid UTF-8; output is valid UTF-8. */
#ifndef RF_INGEST_HTML_H
#define RF_INGEST_HTML_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

/* Appends in[0..n) to out with tags removed. Quoted attribute values may hold
 * '>'; comments, <!DOCTYPE>, <?...?> and the bodies of <script>/<style> are
 * removed; block-level tags (<br>, <p>, <div>, <li>, <tr>, <h1>...) become one
 * space so words on either side do not merge. A '<' that does not start a tag
 * ("a < b", "<3") is kept, and so is a construct left open at the end of the
 * input together with everything after it (one pass, linear time even on
 * adversarial input). *tags counts removed tags. Returns 0 or RF_ERR_NOMEM. */
int rf_html_strip_tags(const char *in, size_t n, rf_buf *out, size_t *tags);

/* Appends in[0..n) to out with character references decoded: the HTML4 named
 * set (252) plus &apos; and common HTML5 names; &#NNN; and &#xHHH; with code
 * points that are 0, surrogates or > U+10FFFF giving U+FFFD. Unknown or
 * unterminated references are kept verbatim. *count counts decodings.
 * Returns 0 or RF_ERR_NOMEM. */
int rf_html_unescape(const char *in, size_t n, rf_buf *out, size_t *count);

/* Code point of a named reference without '&' and ';' ("eacute"), 0 if unknown. */
uint32_t rf_html_entity_lookup(const char *name, size_t len);

#endif
