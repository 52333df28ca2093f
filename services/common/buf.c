#include "common/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/utf8.h"

int rf_buf_reserve(rf_buf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->len) return RF_ERR_NOMEM;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return RF_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return RF_ERR_NOMEM;
    b->data = p;
    b->cap = cap;
    return RF_OK;
}

int rf_buf_append(rf_buf *b, const void *p, size_t n) {
    if (rf_buf_reserve(b, n)) return RF_ERR_NOMEM;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return RF_OK;
}

int rf_buf_puts(rf_buf *b, const char *s) {
    return rf_buf_append(b, s, strlen(s));
}

int rf_buf_putc(rf_buf *b, char c) {
    if (b->len + 1 < b->cap) {
        b->data[b->len++] = c;
        b->data[b->len] = 0;
        return RF_OK;
    }
    return rf_buf_append(b, &c, 1);
}

int rf_buf_printf(rf_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return RF_ERR_INVALID;
    if ((size_t)n < sizeof small) return rf_buf_append(b, small, (size_t)n);
    if (rf_buf_reserve(b, (size_t)n)) return RF_ERR_NOMEM;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return RF_OK;
}

int rf_buf_append_json_str(rf_buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    /* Worst case: every byte becomes \u00XX (6) or U+FFFD (3). */
    if (n > (SIZE_MAX - 2) / 6 || rf_buf_reserve(b, n * 6 + 2)) return RF_ERR_NOMEM;
    char *o = b->data + b->len;
    *o++ = '"';
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        unsigned char c = *p;
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            *o++ = (char)c;
            p++;
        } else if (c < 0x80) {
            *o++ = '\\';
            switch (c) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            default:
                *o++ = 'u';
                *o++ = '0';
                *o++ = '0';
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            }
            p++;
        } else {
            uint32_t cp;
            int k = rf_utf8_decode(p, (size_t)(end - p), &cp);
            if (k > 0) {
                memcpy(o, p, (size_t)k);
                o += k;
                p += k;
            } else {
                memcpy(o, "\xEF\xBF\xBD", 3);
                o += 3;
                p += -k;
            }
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->data);
    b->data[b->len] = 0;
    return RF_OK;
}

void rf_buf_reset(rf_buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

void rf_buf_free(rf_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *rf_buf_steal(rf_buf *b) {
    char *p = b->data;
    if (!p) p = calloc(1, 1);
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}
