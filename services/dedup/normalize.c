#include "dedup/normalize.h"

#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"
#include "common/utf8.h"

static const struct {
    const char *name;
    unsigned flag;
} norm_names[] = {
    {"case", RF_NORM_CASE},
    {"punct", RF_NORM_PUNCT},
    {"space", RF_NORM_SPACE},
    {"digits", RF_NORM_DIGITS},
};
#define NNAMES (sizeof norm_names / sizeof norm_names[0])

int rf_norm_parse(const char *spec, unsigned *flags) {
    if (!strcmp(spec, "all")) return *flags = RF_NORM_ALL, RF_OK;
    if (!strcmp(spec, "none")) return *flags = 0, RF_OK;
    unsigned f = 0;
    const char *p = spec;
    while (*p) {
        size_t n = strcspn(p, ",");
        size_t i;
        for (i = 0; i < NNAMES; i++)
            if (strlen(norm_names[i].name) == n && !strncmp(p, norm_names[i].name, n)) break;
        if (i == NNAMES)
            return rf_fail(RF_ERR_INVALID,
                           "normalization '%.*s': expected a comma list of case, punct, space, "
                           "digits, or all/none",
                           (int)n, p);
        f |= norm_names[i].flag;
        p += n;
        if (*p == ',') p++;
    }
    *flags = f;
    return RF_OK;
}

void rf_norm_format(unsigned flags, char *out, size_t cap) {
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < NNAMES; i++) {
        if (!(flags & norm_names[i].flag)) continue;
        int w = snprintf(out + len, cap - len, "%s%s", len ? "," : "", norm_names[i].name);
        if (w < 0 || (size_t)w >= cap - len) break;
        len += (size_t)w;
    }
    if (!len) snprintf(out, cap, "none");
}

enum cls { CLS_SPACE, CLS_PUNCT, CLS_DIGIT, CLS_OTHER };

static enum cls classify(uint32_t cp) {
    if (cp < 0x80) {
        if (cp <= 0x20 || cp == 0x7f) return CLS_SPACE;
        if (cp >= '0' && cp <= '9') return CLS_DIGIT;
        /* ASCII symbols such as $+<=>^`|~ count as punctuation, as in string.punctuation */
        if ((cp >= 0x21 && cp <= 0x2f) || (cp >= 0x3a && cp <= 0x40) ||
            (cp >= 0x5b && cp <= 0x60) || (cp >= 0x7b && cp <= 0x7e))
            return CLS_PUNCT;
        return CLS_OTHER;
    }
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_CC:
        return CLS_SPACE;
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        return CLS_PUNCT;
    case UTF8PROC_CATEGORY_ND:
        return CLS_DIGIT;
    default:
        return CLS_OTHER;
    }
}

/* Appends cp, case-folded when asked (folding may yield several code points). */
static int put_cp(rf_buf *out, uint32_t cp, unsigned flags) {
    char enc[4];
    if (cp < 0x80) {
        char c = (char)cp;
        if ((flags & RF_NORM_CASE) && c >= 'A' && c <= 'Z') c = (char)(c + 32);
        return rf_buf_putc(out, c);
    }
    if (flags & RF_NORM_CASE) {
        utf8proc_int32_t folded[8];
        int last = 0;
        utf8proc_ssize_t n =
            utf8proc_decompose_char((utf8proc_int32_t)cp, folded, 8, UTF8PROC_CASEFOLD, &last);
        if (n > 0 && n <= 8) {
            for (utf8proc_ssize_t i = 0; i < n; i++) {
                int rc = rf_buf_append(out, enc, rf_utf8_encode((uint32_t)folded[i], enc));
                if (rc) return rc;
            }
            return RF_OK;
        }
    }
    return rf_buf_append(out, enc, rf_utf8_encode(cp, enc));
}

/* What the fast path does with each ASCII byte under flags: 0 drops it,
 * 1 is whitespace, anything else is the byte to write. */
static void ascii_map(unsigned flags, unsigned char map[128]) {
    for (unsigned c = 0; c < 128; c++) {
        enum cls k = classify(c);
        if (k == CLS_SPACE)
            map[c] = 1;
        else if (k == CLS_PUNCT && (flags & RF_NORM_PUNCT))
            map[c] = 0;
        else if (k == CLS_DIGIT && (flags & RF_NORM_DIGITS))
            map[c] = '0';
        else if ((flags & RF_NORM_CASE) && c >= 'A' && c <= 'Z')
            map[c] = (unsigned char)(c + 32);
        else
            map[c] = (unsigned char)c;
    }
}

int rf_normalize(const char *text, size_t len, unsigned flags, rf_buf *out) {
    rf_buf_reset(out);
    int rc = rf_buf_reserve(out, len);
    if (rc) return rc;
    const unsigned char *s = (const unsigned char *)text;
    int pending_space = 0; /* a collapsed run of spaces waits for the next kept char */
    unsigned char map[128];
    ascii_map(flags, map);
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path: the output never outgrows the input here, and the
         * buffer holds len bytes, so bytes are stored directly. */
        while (i < len && s[i] < 0x80) {
            unsigned char m = map[s[i++]];
            if (m > 1) {
                if (pending_space) {
                    out->data[out->len++] = ' ';
                    pending_space = 0;
                }
                out->data[out->len++] = (char)m;
            } else if (m == 1) {
                if (!(flags & RF_NORM_SPACE))
                    out->data[out->len++] = ' ';
                else
                    pending_space = out->len > 0;
            }
        }
        if (i == len) break;
        uint32_t cp;
        int k = rf_utf8_decode(s + i, len - i, &cp);
        if (k < 0) {
            cp = RF_UTF8_REPLACEMENT;
            k = -k;
        }
        i += (size_t)k;
        enum cls c = classify(cp);
        if (c == CLS_PUNCT && (flags & RF_NORM_PUNCT)) continue;
        /* Non-ASCII output may be longer than its input (U+FFFD, case folding):
         * keep room for the rest of the text as the fast path assumes. */
        if ((rc = rf_buf_reserve(out, len - i + 64))) return rc;
        if (c == CLS_SPACE) {
            if (!(flags & RF_NORM_SPACE))
                out->data[out->len++] = ' ';
            else
                pending_space = out->len > 0;
            continue;
        }
        if (pending_space) {
            out->data[out->len++] = ' ';
            pending_space = 0;
        }
        if (c == CLS_DIGIT && (flags & RF_NORM_DIGITS)) cp = '0';
        if ((rc = put_cp(out, cp, flags))) return rc;
        if ((rc = rf_buf_reserve(out, len - i))) return rc;
    }
    out->data[out->len] = '\0';
    return RF_OK;
}
