#include "common/utf8.h"

#include <string.h>

#include "common/error.h"

/* Well-formed sequences (Unicode Table 3-7). For a bad sequence the return is
 * minus the length of its maximal subpart: the longest prefix that could start
 * a well-formed sequence, at least 1 byte. */
int rf_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -i;
        unsigned char b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -i;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return len;
}

size_t rf_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t rf_utf8_first_invalid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* Skip ASCII eight bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = rf_utf8_decode(p + i, n - i, &cp);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

bool rf_utf8_valid(const char *s, size_t n) {
    return rf_utf8_first_invalid(s, n) == n;
}

long rf_utf8_repair(const char *s, size_t n, rf_buf *out) {
    long repairs = 0;
    size_t i = 0;
    while (i < n) {
        size_t bad = i + rf_utf8_first_invalid(s + i, n - i);
        if (rf_buf_append(out, s + i, bad - i)) return RF_ERR_NOMEM;
        if (bad == n) break;
        uint32_t cp;
        int k = rf_utf8_decode((const unsigned char *)s + bad, n - bad, &cp);
        if (rf_buf_append(out, "\xEF\xBF\xBD", 3)) return RF_ERR_NOMEM;
        repairs++;
        i = bad + (size_t)(-k);
    }
    return repairs;
}

size_t rf_utf8_count(const char *s, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += ((unsigned char)s[i] & 0xC0) != 0x80;
    return count;
}
