/* Label maps: see label.h. */
#include "ingest/label.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

int rf_label_map_parse(const char *spec, rf_label_map *m) {
    memset(m, 0, sizeof(*m));
    const char *p = spec;
    while (*p) {
        if (m->n == RF_LABEL_MAP_MAX)
            return rf_fail(RF_ERR_INVALID, "label map '%s': more than %d entries", spec,
                           RF_LABEL_MAP_MAX);
        rf_label_range *r = &m->r[m->n];
        const char *colon = strchr(p, ':');
        size_t klen = colon ? (size_t)(colon - p) : 0;
        if (klen == 0 || klen >= RF_LABEL_NAME_MAX) goto bad;
        char key[RF_LABEL_NAME_MAX], *e;
        memcpy(key, p, klen);
        key[klen] = '\0';
        if (isalpha((unsigned char)key[0])) {
            memcpy(r->name, key, klen + 1);
        } else {
            r->lo = r->hi = strtod(key, &e);
            if (e == key) goto bad;
            if (*e == '-') {
                const char *h = e + 1;
                r->hi = strtod(h, &e);
                if (e == h) goto bad;
            }
            if (*e || !isfinite(r->lo) || !isfinite(r->hi) || r->hi < r->lo) goto bad;
        }
        p = colon + 1;
        long label = strtol(p, &e, 10);
        if (e == p || label < 0 || label > INT32_MAX) goto bad;
        r->label = (int32_t)label;
        m->n++;
        if (*e == ',')
            e++;
        else if (*e)
            goto bad;
        p = e;
    }
    if (m->n == 0) return rf_fail(RF_ERR_INVALID, "label map '%s' is empty", spec);
    return 0;
bad:
    return rf_fail(RF_ERR_INVALID,
                   "label map '%s': expected entries like '1-2:0,3-5:1' (lo-hi:label) or "
                   "'neg:0,pos:1' (name:label)",
                   spec);
}

int rf_label_parse_number(const char *s, size_t n, double *v) {
    char tmp[64];
    while (n && (*s == ' ' || *s == '\t'))
        s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        n--;
    if (n == 0 || n >= sizeof(tmp)) return RF_ERR_PARSE;
    if (n <= 9) { /* fast path: a small non-negative integer, e.g. SST-2's 0/1 */
        uint32_t x = 0;
        size_t i = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            x = x * 10 + (uint32_t)(s[i++] - '0');
        if (i == n) {
            *v = x;
            return 0;
        }
    }
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    char *e;
    double d = strtod(tmp, &e);
    /* strtod also takes "nan", "inf" and hex floats: only plain numbers count. */
    if (*e || !isfinite(d) || strpbrk(tmp, "xXnN")) return RF_ERR_PARSE;
    *v = d;
    return 0;
}

const char *rf_label_apply(const rf_label_map *m, double v, int32_t *label) {
    if (m->n) {
        for (size_t i = 0; i < m->n; i++) {
            if (!m->r[i].name[0] && v >= m->r[i].lo && v <= m->r[i].hi) {
                *label = m->r[i].label;
                return NULL;
            }
        }
        return "unmapped_label";
    }
    if (v != floor(v) || v < 0 || v > INT32_MAX) return "bad_label";
    *label = (int32_t)v;
    return NULL;
}

const char *rf_label_from_text(const rf_label_map *m, const char *s, size_t n, int32_t *label) {
    while (n && isspace((unsigned char)*s))
        s++, n--;
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    for (size_t i = 0; i < m->n; i++) {
        if (m->r[i].name[0] && strlen(m->r[i].name) == n && memcmp(m->r[i].name, s, n) == 0) {
            *label = m->r[i].label;
            return NULL;
        }
    }
    double v;
    if (rf_label_parse_number(s, n, &v)) return "bad_label";
    return rf_label_apply(m, v, label);
}
