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
    while (cap < need)
        cap *= 2;
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

int rf_buf_put_u64(rf_buf *b, uint64_t v) {
    char t[20];
    size_t k = 0;
    do {
        t[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (rf_buf_reserve(b, k)) return RF_ERR_NOMEM;
    char *o = b->data + b->len; /* a local pointer: stores through b->data may alias b */
    for (size_t j = 0; j < k; j++)
        o[j] = t[k - 1 - j];
    o[k] = 0;
    b->len += k;
    return RF_OK;
}

int rf_buf_put_i64(rf_buf *b, int64_t v) {
    if (v >= 0) return rf_buf_put_u64(b, (uint64_t)v);
    if (rf_buf_putc(b, '-')) return RF_ERR_NOMEM;
    return rf_buf_put_u64(b, 0 - (uint64_t)v);
}

/* Length of the leading run of bytes that JSON copies verbatim: printable
 * ASCII other than '"' and '\'. Eight bytes at a time (SWAR). */
static size_t plain_ascii_run(const unsigned char *p, size_t n) {
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        uint64_t ctl = (w - ones * 0x20) & ~w; /* bytes < 0x20 */
        uint64_t q = w ^ (ones * '"'), bs = w ^ (ones * '\\');
        uint64_t hit = ctl | ((q - ones) & ~q) | ((bs - ones) & ~bs) | w;
        if (hit & highs) break;
    }
    while (i < n && p[i] >= 0x20 && p[i] < 0x80 && p[i] != '"' && p[i] != '\\')
        i++;
    return i;
}

int rf_buf_append_json_str(rf_buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    /* Worst case: every byte becomes \u00XX (6) or U+FFFD (3). */
    if (n > (SIZE_MAX - 2) / 6 || rf_buf_reserve(b, n * 6 + 2)) return RF_ERR_NOMEM;
    char *o = b->data + b->len;
    *o++ = '"';
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        size_t run = plain_ascii_run(p, (size_t)(end - p));
        memcpy(o, p, run);
        o += run;
        p += run;
        if (p == end) break;
        unsigned char c = *p;
        if (c < 0x80) {
            *o++ = '\\';
            switch (c) {
            case '"':
                *o++ = '"';
                break;
            case '\\':
                *o++ = '\\';
                break;
            case '\n':
                *o++ = 'n';
                break;
            case '\r':
                *o++ = 'r';
                break;
            case '\t':
                *o++ = 't';
                break;
            case '\b':
                *o++ = 'b';
                break;
            case '\f':
                *o++ = 'f';
                break;
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
