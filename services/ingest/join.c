/* Text field joining: see join.h. */
#include "ingest/join.h"

#include <string.h>

#include "common/error.h"

static bool is_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Appends p[0..n) to b with whitespace runs as one space, ends trimmed. */
static int normalize(rf_buf *b, const char *p, size_t n) {
    size_t start = b->len;
    bool gap = false;
    for (size_t i = 0; i < n; i++) {
        if (is_space((unsigned char)p[i])) {
            gap = b->len > start;
            continue;
        }
        if ((gap && rf_buf_putc(b, ' ')) || rf_buf_putc(b, p[i])) return RF_ERR_NOMEM;
        gap = false;
    }
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
