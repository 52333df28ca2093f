/* Text field joining: see join.h. */
#include "ingest/join.h"

#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "common/error.h"

static bool is_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Appends p[0..n) to b with whitespace runs as one space, ends trimmed. A
 * 16-byte block whose inner whitespace is single spaces is copied whole (its
 * first and last byte may be whitespace: they only make a pending space);
 * other blocks and the tail go byte by byte. */
static int normalize(rf_buf *b, const char *p, size_t n) {
    if (rf_buf_reserve(b, n)) return RF_ERR_NOMEM; /* the output is never longer */
    char *start = b->data + b->len, *o = start;
    bool pend = false; /* whitespace since the last byte written (o > start) */
    size_t i = 0;
#ifdef __SSE2__
    const __m128i blank = _mm_set1_epi8(' '), tab = _mm_set1_epi8('\t' - 1),
                  cr = _mm_set1_epi8('\r' + 1);
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        unsigned sp = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, blank));
        unsigned ws = sp | (unsigned)_mm_movemask_epi8(
                               _mm_and_si128(_mm_cmpgt_epi8(v, tab), _mm_cmplt_epi8(v, cr)));
        if ((ws & (ws >> 1)) || (ws & ~sp & 0x7FFEu)) { /* a run, or \t..\r inside */
            for (size_t k = i; k < i + 16; k++) {
                if (is_space((unsigned char)p[k])) {
                    pend = o > start;
                    continue;
                }
                if (pend) *o++ = ' ';
                *o++ = p[k];
                pend = false;
            }
            continue;
        }
        size_t first = ws & 1u, last = 16 - (ws >> 15);
        if ((pend || first) && o > start) *o++ = ' ';
        memcpy(o, p + i + first, last - first);
        o += last - first;
        pend = last < 16;
    }
#endif
    for (; i < n; i++) {
        if (is_space((unsigned char)p[i])) {
            pend = o > start;
            continue;
        }
        if (pend) *o++ = ' ';
        *o++ = p[i];
        pend = false;
    }
    *o = '\0';
    b->len = (size_t)(o - b->data);
    return 0;
}

/* Narrows s[*a..*b) past leading and trailing ellipses ("..." or longer, or
 * U+2026) and the spaces next to them: a summary cut from a review keeps its
 * words but marks the cut ("First sentence. ...", "... middle words"). */
static void trim_ellipses(const char *s, size_t *a, size_t *b) {
    for (bool again = true; again;) {
        again = false;
        if (*b - *a >= 3 && memcmp(s + *b - 3, "\xE2\x80\xA6", 3) == 0) {
            *b -= 3, again = true;
        } else if (*b - *a >= 3 && memcmp(s + *b - 3, "...", 3) == 0) {
            while (*b > *a && s[*b - 1] == '.')
                (*b)--;
            again = true;
        }
        if (*b - *a >= 3 && memcmp(s + *a, "\xE2\x80\xA6", 3) == 0) {
            *a += 3, again = true;
        } else if (*b - *a >= 3 && memcmp(s + *a, "...", 3) == 0) {
            while (*a < *b && s[*a] == '.')
                (*a)++;
            again = true;
        }
        while (*b > *a && s[*b - 1] == ' ')
            (*b)--;
        while (*a < *b && s[*a] == ' ')
            (*a)++;
    }
}

int rf_text_join(const rf_text_part *parts, size_t n, const char *sep, bool skip_contained,
                 rf_buf *out, rf_buf *norm, const char **text, size_t *len) {
    bool keep[RF_TEXT_JOIN_MAX];
    for (size_t i = 0; i < n; i++)
        keep[i] = true;
    if (skip_contained && n > 1) {
        size_t a[RF_TEXT_JOIN_MAX], b[RF_TEXT_JOIN_MAX];
        rf_buf_reset(norm);
        for (size_t i = 0; i < n; i++) {
            a[i] = norm->len;
            if (normalize(norm, parts[i].p, parts[i].n)) return RF_ERR_NOMEM;
            b[i] = norm->len;
        }
        const char *s = norm->data ? norm->data : "";
        for (size_t i = 0; i < n; i++)
            trim_ellipses(s, &a[i], &b[i]);
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n && keep[i]; j++) {
                size_t li = b[i] - a[i], lj = b[j] - a[j];
                /* Contained in a longer part, or equal to an earlier one. */
                if (j != i && (li < lj || (li == lj && j < i)) &&
                    (li == 0 || memmem(s + a[j], lj, s + a[i], li)))
                    keep[i] = false;
            }
    }
    size_t kept = 0, last = 0;
    for (size_t i = 0; i < n; i++)
        if (keep[i]) kept++, last = i;
    if (kept == 1) {
        *text = parts[last].p;
        *len = parts[last].n;
        return 0;
    }
    rf_buf_reset(out);
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        if (!keep[i]) continue;
        if ((!first && rf_buf_puts(out, sep)) || rf_buf_append(out, parts[i].p, parts[i].n))
            return RF_ERR_NOMEM;
        first = false;
    }
    *text = out->data ? out->data : "";
    *len = out->len;
    return 0;
}
