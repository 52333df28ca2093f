#include "common/json.h"

#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "common/error.h"
#include "common/utf8.h"

/* Arena: a chain of blocks; reset keeps the largest block for reuse. */
typedef struct arena_block {
    struct arena_block *next;
    size_t cap, used;
    _Alignas(16) char data[];
} arena_block;

struct rf_json_doc {
    arena_block *blocks;
    /* Scratch stacks for children of open containers. */
    rf_json *vals;
    size_t nvals, capvals;
    rf_json_member *mems;
    size_t nmems, capmems;
    const char *text, *end, *p;
    int depth;
};

static void *arena_alloc(rf_json_doc *d, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_block *b = d->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = b ? b->cap * 2 : 4096;
        while (cap < n)
            cap *= 2;
        arena_block *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->cap = cap;
        nb->used = 0;
        nb->next = b;
        d->blocks = b = nb;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

static void arena_reset(rf_json_doc *d) {
    arena_block *b = d->blocks;
    if (!b) return;
    /* Keep the newest (largest) block, free the rest. */
    arena_block *rest = b->next;
    while (rest) {
        arena_block *n = rest->next;
        free(rest);
        rest = n;
    }
    b->next = NULL;
    b->used = 0;
}

rf_json_doc *rf_json_doc_new(void) {
    return calloc(1, sizeof(rf_json_doc));
}

void rf_json_doc_free(rf_json_doc *d) {
    if (!d) return;
    arena_block *b = d->blocks;
    while (b) {
        arena_block *n = b->next;
        free(b);
        b = n;
    }
    free(d->vals);
    free(d->mems);
    free(d);
}

static int fail_at(rf_json_doc *d, const char *what) {
    return rf_fail(RF_ERR_PARSE, "JSON: %s at byte %zu", what, (size_t)(d->p - d->text));
}

static void skip_ws(rf_json_doc *d) {
    const char *p = d->p;
    while (p < d->end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    d->p = p;
}

static int hex4(const char *p, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* First byte in [p, end) that ends a plain string run: '"', '\\' or a control
 * byte. Sixteen bytes at a time where SSE2 exists (every x86-64). */
static const char *string_run_end(const char *p, const char *end) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    const __m128i bias = _mm_set1_epi8((char)0x80), ctl = _mm_set1_epi8((char)(0x20 ^ 0x80));
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        /* unsigned v < 0x20 as a signed compare of v^0x80 < 0x20^0x80 */
        __m128i hit =
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                         _mm_cmplt_epi8(_mm_xor_si128(v, bias), ctl));
        int mask = _mm_movemask_epi8(hit);
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
        p++;
    return p;
}

/* Parses a string at d->p (which points at the opening quote). */
static int parse_string(rf_json_doc *d, const char **out, size_t *outlen) {
    const char *p = d->p + 1, *end = d->end;
    const char *q = string_run_end(p, end);
    if (q >= end) {
        d->p = q;
        return fail_at(d, "unterminated string");
    }
    if (*q == '"') { /* no escapes: copy as is */
        size_t n = (size_t)(q - p);
        char *s = arena_alloc(d, n + 1);
        if (!s) return RF_ERR_NOMEM;
        memcpy(s, p, n);
        s[n] = 0;
        *out = s;
        *outlen = n;
        d->p = q + 1;
        return RF_OK;
    }
    /* Escapes never lengthen the text, so the raw span bounds the output.
     * The span ends at the first quote not escaped: skip plain runs, and
     * the byte after each backslash. */
    const char *close = q;
    while (close < end && *close != '"') {
        close += (*close == '\\') ? 2 : 1;
        if (close < end) close = string_run_end(close, end);
    }
    if (close >= end) {
        d->p = end;
        return fail_at(d, "unterminated string");
    }
    char *s = arena_alloc(d, (size_t)(close - p) + 1), *o = s;
    if (!s) return RF_ERR_NOMEM;
    while (p < end) {
        const char *run = string_run_end(p, end); /* copy plain runs whole */
        memcpy(o, p, (size_t)(run - p));
        o += run - p;
        p = run;
        if (p >= end) break;
        unsigned char c = (unsigned char)*p;
        if (c == '"') break;
        if (c < 0x20) {
            d->p = p;
            return fail_at(d, "control character in string");
        }
        if (p + 1 >= end) {
            d->p = p;
            return fail_at(d, "unterminated string");
        }
        char e = p[1];
        p += 2;
        switch (e) {
        case '"':
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            break;
        case '/':
            *o++ = '/';
            break;
        case 'b':
            *o++ = '\b';
            break;
        case 'f':
            *o++ = '\f';
            break;
        case 'n':
            *o++ = '\n';
            break;
        case 'r':
            *o++ = '\r';
            break;
        case 't':
            *o++ = '\t';
            break;
        case 'u': {
            uint32_t cp;
            if (end - p < 4 || hex4(p, &cp)) {
                d->p = p;
                return fail_at(d, "bad \\u escape");
            }
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (end - p >= 6 && p[0] == '\\' && p[1] == 'u' && !hex4(p + 2, &lo) &&
                    lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                } else {
                    cp = RF_UTF8_REPLACEMENT;
                }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                cp = RF_UTF8_REPLACEMENT;
            }
            o += rf_utf8_encode(cp, o);
            break;
        }
        default:
            d->p = p - 1;
            return fail_at(d, "bad escape");
        }
    }
    if (p >= end) {
        d->p = p;
        return fail_at(d, "unterminated string");
    }
    *o = 0;
    *out = s;
    *outlen = (size_t)(o - s);
    d->p = p + 1;
    return RF_OK;
}

static int parse_number(rf_json_doc *d, rf_json *v) {
    const char *p = d->p, *end = d->end, *start = p;
    if (p < end && *p == '-') p++;
    if (p >= end) return fail_at(d, "bad number");
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    else
        return fail_at(d, "bad number");
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return fail_at(d, "bad fraction");
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return fail_at(d, "bad exponent");
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    size_t n = (size_t)(p - start);
    char *raw = arena_alloc(d, n + 1);
    if (!raw) return RF_ERR_NOMEM;
    memcpy(raw, start, n);
    raw[n] = 0;
    v->type = RF_JSON_NUMBER;
    v->u.str = raw;
    v->len = n;
    v->num = strtod(raw, NULL);
    d->p = p;
    return RF_OK;
}

static int push_val(rf_json_doc *d, const rf_json *v) {
    if (d->nvals == d->capvals) {
        size_t cap = d->capvals ? d->capvals * 2 : 64;
        rf_json *nv = realloc(d->vals, cap * sizeof *nv);
        if (!nv) return RF_ERR_NOMEM;
        d->vals = nv;
        d->capvals = cap;
    }
    d->vals[d->nvals++] = *v;
    return RF_OK;
}

static int push_mem(rf_json_doc *d, const rf_json_member *m) {
    if (d->nmems == d->capmems) {
        size_t cap = d->capmems ? d->capmems * 2 : 64;
        rf_json_member *nm = realloc(d->mems, cap * sizeof *nm);
        if (!nm) return RF_ERR_NOMEM;
        d->mems = nm;
        d->capmems = cap;
    }
    d->mems[d->nmems++] = *m;
    return RF_OK;
}

static int parse_value(rf_json_doc *d, rf_json *v);

static int parse_array(rf_json_doc *d, rf_json *v) {
    size_t base = d->nvals;
    int rc;
    d->p++;
    skip_ws(d);
    if (d->p < d->end && *d->p == ']') {
        d->p++;
    } else {
        for (;;) {
            rf_json item;
            if ((rc = parse_value(d, &item)) || (rc = push_val(d, &item))) goto out;
            skip_ws(d);
            if (d->p >= d->end) {
                rc = fail_at(d, "unterminated array");
                goto out;
            }
            if (*d->p == ',') {
                d->p++;
                continue;
            }
            if (*d->p == ']') {
                d->p++;
                break;
            }
            rc = fail_at(d, "expected ',' or ']'");
            goto out;
        }
    }
    size_t n = d->nvals - base;
    rf_json *items = NULL;
    if (n) {
        items = arena_alloc(d, n * sizeof *items);
        if (!items) {
            rc = RF_ERR_NOMEM;
            goto out;
        }
        memcpy(items, d->vals + base, n * sizeof *items);
    }
    v->type = RF_JSON_ARRAY;
    v->len = n;
    v->u.items = items;
    rc = RF_OK;
out:
    d->nvals = base;
    return rc;
}

static int parse_object(rf_json_doc *d, rf_json *v) {
    size_t base = d->nmems;
    int rc;
    d->p++;
    skip_ws(d);
    if (d->p < d->end && *d->p == '}') {
        d->p++;
    } else {
        for (;;) {
            rf_json_member m;
            skip_ws(d);
            if (d->p >= d->end || *d->p != '"') {
                rc = fail_at(d, "expected a key string");
                goto out;
            }
            if ((rc = parse_string(d, &m.key, &m.keylen))) goto out;
            skip_ws(d);
            if (d->p >= d->end || *d->p != ':') {
                rc = fail_at(d, "expected ':'");
                goto out;
            }
            d->p++;
            if ((rc = parse_value(d, &m.value)) || (rc = push_mem(d, &m))) goto out;
            skip_ws(d);
            if (d->p >= d->end) {
                rc = fail_at(d, "unterminated object");
                goto out;
            }
            if (*d->p == ',') {
                d->p++;
                continue;
            }
            if (*d->p == '}') {
                d->p++;
                break;
            }
            rc = fail_at(d, "expected ',' or '}'");
            goto out;
        }
    }
    size_t n = d->nmems - base;
    rf_json_member *mems = NULL;
    if (n) {
        mems = arena_alloc(d, n * sizeof *mems);
        if (!mems) {
            rc = RF_ERR_NOMEM;
            goto out;
        }
        memcpy(mems, d->mems + base, n * sizeof *mems);
    }
    v->type = RF_JSON_OBJECT;
    v->len = n;
    v->u.members = mems;
    rc = RF_OK;
out:
    d->nmems = base;
    return rc;
}

static int literal(rf_json_doc *d, const char *word, rf_json_type t, rf_json *v) {
    size_t n = strlen(word);
    if ((size_t)(d->end - d->p) < n || memcmp(d->p, word, n) != 0)
        return fail_at(d, "unexpected token");
    d->p += n;
    v->type = t;
    return RF_OK;
}

static int parse_value(rf_json_doc *d, rf_json *v) {
    memset(v, 0, sizeof *v);
    skip_ws(d);
    if (d->p >= d->end) return fail_at(d, "unexpected end of input");
    if (++d->depth > RF_JSON_MAX_DEPTH) return fail_at(d, "nesting too deep");
    int rc;
    switch (*d->p) {
    case '{':
        rc = parse_object(d, v);
        break;
    case '[':
        rc = parse_array(d, v);
        break;
    case '"':
        v->type = RF_JSON_STRING;
        rc = parse_string(d, &v->u.str, &v->len);
        break;
    case 't':
        rc = literal(d, "true", RF_JSON_TRUE, v);
        break;
    case 'f':
        rc = literal(d, "false", RF_JSON_FALSE, v);
        break;
    case 'n':
        rc = literal(d, "null", RF_JSON_NULL, v);
        break;
    default:
        rc = parse_number(d, v);
        break;
    }
    d->depth--;
    return rc;
}

int rf_json_parse(rf_json_doc *d, const char *text, size_t len, const rf_json **root) {
    arena_reset(d);
    d->nvals = d->nmems = 0;
    d->depth = 0;
    d->text = d->p = text;
    d->end = text + len;
    rf_json *v = arena_alloc(d, sizeof *v);
    if (!v) return RF_ERR_NOMEM;
    int rc = parse_value(d, v);
    if (rc) return rc;
    skip_ws(d);
    if (d->p != d->end) return fail_at(d, "trailing characters");
    *root = v;
    return RF_OK;
}

const rf_json *rf_json_get(const rf_json *obj, const char *key) {
    if (!obj || obj->type != RF_JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < obj->len; i++) {
        const rf_json_member *m = &obj->u.members[i];
        if (m->keylen == n && memcmp(m->key, key, n) == 0) return &m->value;
    }
    return NULL;
}

int rf_json_int64(const rf_json *v, int64_t *out) {
    if (!v || v->type != RF_JSON_NUMBER) return RF_ERR_INVALID;
    const char *s = v->u.str;
    size_t i = (s[0] == '-');
    if (i == v->len) return RF_ERR_RANGE;
    uint64_t acc = 0;
    for (; i < v->len; i++) {
        if (s[i] < '0' || s[i] > '9') return RF_ERR_RANGE; /* fraction or exponent */
        uint64_t dgt = (uint64_t)(s[i] - '0');
        if (acc > (UINT64_MAX - dgt) / 10) return RF_ERR_RANGE;
        acc = acc * 10 + dgt;
    }
    if (s[0] == '-') {
        if (acc > (uint64_t)INT64_MAX + 1) return RF_ERR_RANGE;
        *out = (int64_t)(0 - acc);
    } else {
        if (acc > (uint64_t)INT64_MAX) return RF_ERR_RANGE;
        *out = (int64_t)acc;
    }
    return RF_OK;
}

bool rf_json_is_str(const rf_json *v) {
    return v && v->type == RF_JSON_STRING;
}
