/* Text cleaning (see clean.h for the order of the steps and why).
 *
 * Speed: review text is mostly ASCII. Pure-ASCII input skips UTF-8 decoding and
 * NFKC entirely, and non-ASCII input calls utf8proc only when some code point
 * could change under NFKC; everything after NFKC is one pass into `out`. */
#include "ingest/clean.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"
#include "common/utf8.h"
#include "ingest/html.h"

void rf_clean_opts_default(rf_clean_opts *o) {
    *o = (rf_clean_opts){
        .utf8 = RF_UTF8_REPAIR,
        .nfkc = true,
        .strip_control = true,
        .collapse_whitespace = true,
    };
}

int rf_clean_opts_from_cfg(const rf_cfg *section, rf_clean_opts *o) {
    static const char *const KEYS[] = {
        "utf8",          "nfkc",       "strip_control", "collapse_whitespace",
        "html_unescape", "strip_tags", "lowercase",     NULL};
    static const char *const POLICIES[] = {"repair", "reject", NULL};
    if (!section) return 0;
    int rc = rf_cfg_check_keys(section, KEYS);
    int policy = 0;
    if (!rc) rc = rf_cfg_enum(section, "utf8", POLICIES, (int)o->utf8, &policy);
    if (!rc) o->utf8 = policy == 0 ? RF_UTF8_REPAIR : RF_UTF8_REJECT;
    if (!rc) rc = rf_cfg_bool(section, "nfkc", o->nfkc, &o->nfkc);
    if (!rc) rc = rf_cfg_bool(section, "strip_control", o->strip_control, &o->strip_control);
    if (!rc)
        rc = rf_cfg_bool(section, "collapse_whitespace", o->collapse_whitespace,
                         &o->collapse_whitespace);
    if (!rc) rc = rf_cfg_bool(section, "html_unescape", o->html_unescape, &o->html_unescape);
    if (!rc) rc = rf_cfg_bool(section, "strip_tags", o->strip_tags, &o->strip_tags);
    if (!rc) rc = rf_cfg_bool(section, "lowercase", o->lowercase, &o->lowercase);
    return rc;
}

static bool is_ascii(const char *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull) return false;
    }
    for (; i < n; i++)
        if ((unsigned char)s[i] & 0x80) return false;
    return true;
}

/* True if NFKC leaves cp unchanged wherever it stands: a starter that is not
 * the second half of any composition and is its own NFKC (no decomposition,
 * or a canonical one that composes back, like U+00E9). Hangul jamo compose
 * algorithmically and are never inert. Checked against utf8proc's NFKC for
 * every code point between 384 composition starters on each side (the inert
 * ones with a decomposition) or 7 common neighbours (the others).
 * utf8proc 2.6 marks second halves with comb_index >= 0x8000; test_clean's
 * random parity test would catch a change of that encoding. */
static bool nfkc_inert(uint32_t cp) {
    const utf8proc_property_t *prop = utf8proc_get_property((utf8proc_int32_t)cp);
    if (prop->combining_class != 0 ||
        (prop->comb_index != UINT16_MAX && prop->comb_index >= 0x8000) ||
        (cp >= 0x1100 && cp <= 0x11FF))
        return false;
    if (prop->decomp_seqindex == UINT16_MAX) return true;
    utf8proc_int32_t d[32];
    int boundclass = 0;
    utf8proc_ssize_t k = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32,
                                                 UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, &boundclass);
    if (k < 1 || k > 32) return false;
    k = utf8proc_normalize_utf32(d, k, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    return k == 1 && (uint32_t)d[0] == cp;
}

/* True if NFKC may change valid UTF-8 s[0..n). */
static bool nfkc_needed(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = rf_utf8_decode(p + i, n - i, &cp);
        if (k < 0) return true; /* cannot happen on valid input; let utf8proc judge */
        i += (size_t)k;
        if (!nfkc_inert(cp)) return true;
    }
    return false;
}

/* Byte classes of ASCII for the final pass. */
enum { C_TEXT = 0, C_SPACE = 1, C_CTRL = 2 };
static const unsigned char ASCII_CLASS[128] = {
    [0x00] = C_CTRL,  [0x01] = C_CTRL,  [0x02] = C_CTRL,  [0x03] = C_CTRL,  [0x04] = C_CTRL,
    [0x05] = C_CTRL,  [0x06] = C_CTRL,  [0x07] = C_CTRL,  [0x08] = C_CTRL,  ['\t'] = C_SPACE,
    ['\n'] = C_SPACE, [0x0B] = C_SPACE, [0x0C] = C_SPACE, ['\r'] = C_SPACE, [0x0E] = C_CTRL,
    [0x0F] = C_CTRL,  [0x10] = C_CTRL,  [0x11] = C_CTRL,  [0x12] = C_CTRL,  [0x13] = C_CTRL,
    [0x14] = C_CTRL,  [0x15] = C_CTRL,  [0x16] = C_CTRL,  [0x17] = C_CTRL,  [0x18] = C_CTRL,
    [0x19] = C_CTRL,  [0x1A] = C_CTRL,  [0x1B] = C_CTRL,  [0x1C] = C_CTRL,  [0x1D] = C_CTRL,
    [0x1E] = C_CTRL,  [0x1F] = C_CTRL,  [' '] = C_SPACE,  [0x7F] = C_CTRL,
};

/* Unicode White_Space outside ASCII. */
static bool is_uspace(uint32_t cp) {
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

typedef struct pass {
    const rf_clean_opts *o;
    rf_clean_result *res;
    char *w;      /* write cursor in out->data */
    bool any;     /* something other than whitespace was written */
    bool pending; /* a collapsed space waits for the next visible character */
} pass;

/* Classifies one code point: C_SPACE/C_CTRL (under the options in force) or C_TEXT. */
static inline int classify(const pass *p, uint32_t cp) {
    int cls;
    if (cp < 0x80)
        cls = ASCII_CLASS[cp];
    else
        cls = is_uspace(cp) ? C_SPACE : (cp <= 0x9F ? C_CTRL : C_TEXT);
    if (cls == C_SPACE && !p->o->collapse_whitespace) {
        /* \t \n \r and ' ' stay; other whitespace controls (\v \f U+0085) are
         * controls when there is no collapsing to turn them into spaces. */
        bool kept = cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp >= 0xA0;
        cls = kept ? C_TEXT : C_CTRL;
    }
    if (cls == C_CTRL && !p->o->strip_control) cls = C_TEXT;
    return cls;
}

#define ONES 0x0101010101010101ull
#define HIGH 0x8080808080808080ull

/* Per-byte flags (0x80 in each byte of w equal to b); exact for any bytes. */
static inline uint64_t bytes_eq(uint64_t w, unsigned char b) {
    uint64_t v = w ^ (ONES * b);
    return ~(((v & ~HIGH) + ~HIGH) | v) & HIGH;
}

/* Per-byte flag of the capitals 'A'..'Z' in ASCII w (bit-twiddling hacks'
 * hasbetween). */
static inline uint64_t bytes_upper(uint64_t w) {
    uint64_t low = w & ~HIGH;
    return (ONES * (127 + 'Z' + 1) - low) & ~w & (low + ONES * (127 - ('A' - 1))) & HIGH;
}

/* True if the eight bytes w are printable ASCII and single spaces, the last
 * not a space (and no capitals when lowering): final_pass copies them as is. */
static inline bool chunk_plain(uint64_t w, bool lower) {
    uint64_t sp = bytes_eq(w, ' ');
    uint64_t bad = (w & HIGH) | ((w - ONES * 0x20) & ~w & HIGH) | bytes_eq(w, 0x7F) |
                   (sp & (sp << 8)) | (sp & (HIGH << 56));
    if (lower) bad |= bytes_upper(w);
    return bad == 0;
}

/* Controls, whitespace and lowercase over valid UTF-8 s[0..n) into p->w. */
static void final_pass(pass *p, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    const bool lower = p->o->lowercase;
    char *w = p->w;
    for (size_t i = 0; i < n;) {
        /* Fast path: printable ASCII and single spaces, most of review text. */
        unsigned char c = u[i];
        if ((unsigned char)(c - 0x21) < 0x5E) {
            if (p->pending) *w++ = ' ';
            p->pending = false;
            p->any = true;
            for (;;) {
                uint64_t x;
                while (i + 8 <= n && (memcpy(&x, u + i, 8), chunk_plain(x, lower))) {
                    memcpy(w, &x, 8);
                    w += 8;
                    i += 8;
                }
                while (i < n && (unsigned char)((c = u[i]) - 0x21) < 0x5E) {
                    *w++ = (char)(lower && (unsigned char)(c - 'A') < 26 ? c | 0x20 : c);
                    i++;
                }
                if (i + 1 < n && u[i] == ' ' && (unsigned char)(u[i + 1] - 0x21) < 0x5E) {
                    *w++ = ' ';
                    i++;
                    continue;
                }
                break;
            }
            continue;
        }
        uint32_t cp = c;
        int len = c < 0x80 ? 1 : rf_utf8_decode(u + i, n - i, &cp); /* valid: len > 0 */
        int cls = classify(p, cp);
        if (cls == C_SPACE) {
            p->pending = p->any;
        } else if (cls == C_CTRL) {
            p->res->controls_removed++;
            p->res->nul_bytes += cp == 0;
        } else {
            if (p->pending) *w++ = ' ';
            p->pending = false;
            p->any = true;
            if (lower && cp >= 0x80)
                w += rf_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), w);
            else
                for (int k = 0; k < len; k++)
                    *w++ = s[i + k];
        }
        i += (size_t)len;
    }
    p->w = w;
}

/* Drops the characters final_pass would drop as controls, ahead of NFKC: text
 * on both sides of a removed control must be normalized together (a jamo L,
 * NUL, jamo V composes once the NUL is gone). */
static int strip_controls(pass *p, const char *s, size_t n, rf_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t done = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = u[i];
        int len = cp < 0x80 ? 1 : rf_utf8_decode(u + i, n - i, &cp);
        if (classify(p, cp) == C_CTRL) {
            if (rf_buf_append(out, s + done, i - done)) return RF_ERR_NOMEM;
            p->res->controls_removed++;
            p->res->nul_bytes += cp == 0;
            done = i + (size_t)len;
        }
        i += (size_t)len;
    }
    return rf_buf_append(out, s + done, n - done) ? RF_ERR_NOMEM : 0;
}

/* Last step: writes s[0..n) into out through final_pass, or as a plain copy when
 * no option of that pass is on. */
static int finish(const rf_clean_opts *o, const char *s, size_t n, rf_buf *out,
                  rf_clean_result *res) {
    /* A lowercase mapping can grow a code point from 2 to 3 bytes. */
    if (rf_buf_reserve(out, n + n / 2 + 4)) return RF_ERR_NOMEM;
    pass p = {o, res, out->data, false, false};
    if (!o->strip_control && !o->collapse_whitespace && !o->lowercase) {
        memcpy(p.w, s, n);
        p.w += n;
    } else {
        final_pass(&p, s, n);
    }
    out->len = (size_t)(p.w - out->data);
    out->data[out->len] = '\0';
    return 0;
}

/* The scratch buffer not holding s, emptied: each step reads one and writes
 * the other. */
static rf_buf *scratch(rf_buf stage[2], const char *s) {
    rf_buf *b = stage[0].data == s ? &stage[1] : &stage[0];
    rf_buf_reset(b);
    return b;
}

int rf_clean_text(const rf_clean_opts *o, const char *in, size_t n, rf_buf *out,
                  rf_clean_result *res) {
    memset(res, 0, sizeof *res);
    rf_buf_reset(out);
    if (n == 0) {
        res->reject = "empty";
        return rf_buf_reserve(out, 0) ? RF_ERR_NOMEM : 0;
    }
    rf_buf stage[2] = {RF_BUF_INIT, RF_BUF_INIT}, *b; /* allocated only when a step runs */
    utf8proc_uint8_t *nfkc = NULL;
    const char *s = in;
    int rc = 0;
    bool ascii = is_ascii(in, n);

    if (!ascii && !rf_utf8_valid(in, n)) {
        if (o->utf8 == RF_UTF8_REJECT) {
            res->reject = "invalid_utf8";
            goto done;
        }
        long r = rf_utf8_repair(in, n, b = scratch(stage, s));
        if (r < 0) goto nomem;
        res->utf8_repairs = (size_t)r;
        s = b->data;
        n = b->len;
    }
    if (o->strip_tags && memchr(s, '<', n)) {
        if (rf_html_strip_tags(s, n, b = scratch(stage, s), &res->tags_removed)) goto nomem;
        s = b->data;
        n = b->len;
    }
    if (o->html_unescape && memchr(s, '&', n)) {
        if (rf_html_unescape(s, n, b = scratch(stage, s), &res->entities_decoded)) goto nomem;
        s = b->data;
        n = b->len;
        if (res->entities_decoded) ascii = is_ascii(s, n);
    }
    if (o->nfkc && !ascii && nfkc_needed(s, n)) {
        if (o->strip_control) {
            pass p = {o, res, NULL, false, false};
            if (strip_controls(&p, s, n, b = scratch(stage, s))) goto nomem;
            s = b->data;
            n = b->len;
        }
        utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfkc,
                                            UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        if (len < 0) {
            rc = len == UTF8PROC_ERROR_NOMEM
                     ? RF_ERR_NOMEM
                     : rf_fail(RF_ERR_INTERNAL, "utf8proc: %s", utf8proc_errmsg(len));
            goto done;
        }
        s = (const char *)nfkc;
        n = (size_t)len;
    }
    if (finish(o, s, n, out, res)) goto nomem;
    /* Lowercasing comes after NFKC, and can undo it: U+0130 (I with dot above)
     * lowercases to a plain 'i', which composes with a following combining
     * acute into U+00ED. Normalizing once more keeps cleaning idempotent (a
     * second pass would otherwise change the text); it only runs when the
     * output still holds a code point NFKC could change. */
    if (o->nfkc && o->lowercase && !ascii && nfkc_needed(out->data, out->len)) {
        free(nfkc);
        utf8proc_ssize_t len =
            utf8proc_map((const utf8proc_uint8_t *)out->data, (utf8proc_ssize_t)out->len, &nfkc,
                         UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        if (len < 0) {
            nfkc = NULL;
            rc = len == UTF8PROC_ERROR_NOMEM
                     ? RF_ERR_NOMEM
                     : rf_fail(RF_ERR_INTERNAL, "utf8proc: %s", utf8proc_errmsg(len));
            goto done;
        }
        rf_buf_reset(out);
        if (rf_buf_append(out, (const char *)nfkc, (size_t)len)) goto nomem;
    }
    if (out->len == 0) res->reject = "empty";
    goto done;
nomem:
    rc = RF_ERR_NOMEM;
done:
    free(nfkc);
    rf_buf_free(&stage[0]);
    rf_buf_free(&stage[1]);
    return rc;
}
