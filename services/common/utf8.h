/* UTF-8 helpers. "Invalid" follows the Unicode standard (no overlongs, no
 * surrogates, nothing above U+10FFFF); repair replaces each maximal invalid
 * subpart with U+FFFD, as Unicode 15 §3.9 and the WHATWG encoding spec do. */
#ifndef RF_UTF8_H
#define RF_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

#define RF_UTF8_REPLACEMENT 0xFFFDu

/* Decodes the code point at s[0..n) (n > 0). Returns its byte length (1..4) and
 * stores *cp; on invalid input returns -k where k >= 1 is the length of the
 * maximal invalid subpart to skip. */
int rf_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Writes cp (<= 0x10FFFF, not a surrogate) to out; returns bytes written (1..4). */
size_t rf_utf8_encode(uint32_t cp, char out[4]);

/* True if s[0..n) is entirely valid UTF-8 (fast ASCII path). */
bool rf_utf8_valid(const char *s, size_t n);

/* Byte offset of the first invalid sequence, or n if valid. */
size_t rf_utf8_first_invalid(const char *s, size_t n);

/* Appends s[0..n) to out with every maximal invalid subpart replaced by U+FFFD.
 * Returns the number of replacements (>= 0) or RF_ERR_NOMEM. */
long rf_utf8_repair(const char *s, size_t n, rf_buf *out);

/* Number of code points in valid UTF-8 s[0..n). */
size_t rf_utf8_count(const char *s, size_t n);

#endif
