/* BERT: BertNormalizer, BertPreTokenizer and greedy longest-match WordPiece,
 * with HF's character classes (unicode_tables.h). */
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"
#include "common/utf8.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode_tables.h"

static inline uint8_t ccc_of(uint32_t cp) {
    return cp < 0x300 ? 0 : (uint8_t)utf8proc_get_property((utf8proc_int32_t)cp)->combining_class;
}

/* Appends cp keeping canonical order: a mark with a non-zero combining class
 * moves before preceding marks of a greater class (NFD's stable reordering). */
static int push_ordered(rf_u32vec *out, size_t floor, uint32_t cp) {
    if (rf_u32vec_push(out, cp)) return RF_ERR_NOMEM;
    uint8_t c = ccc_of(cp);
    if (c == 0) return 0;
    size_t i = out->n - 1;
    while (i > floor) {
        uint8_t p = ccc_of(out->v[i - 1]);
        if (p <= c) break;
        out->v[i] = out->v[i - 1];
        out->v[i - 1] = cp;
        i--;
    }
    return 0;
}

/* BertNormalizer over text into st->cps: clean_text, handle_chinese_chars,
 * strip_accents (NFD then drop nonspacing marks), lowercase -- in HF's order.
 * Every step is per character except NFD's reordering, and dropping marks
 * commutes with that stable reordering, so one pass suffices; lowercasing runs
 * after it because HF lowercases the reordered text. */
static int normalize(rf_tok_state *st, const char *text, size_t len) {
    const rf_tokenizer *t = st->tok;
    rf_u32vec *out = &st->cps;
    out->n = 0;
    if (rf_u32vec_reserve(out, len + 8)) return RF_ERR_NOMEM;
    bool nonascii = false;
    size_t floor = 0; /* reordering never crosses a starter */
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        unsigned char b = (unsigned char)text[i];
        if (b < 0x80) {
            cp = b;
            i++;
        } else {
            int k = rf_utf8_decode((const unsigned char *)text + i, len - i, &cp);
            if (k <= 0) return rf_fail(RF_ERR_INTERNAL, "invalid UTF-8 reached the normalizer");
            i += (size_t)k;
            nonascii = true;
        }
        if (!t->has_normalizer) {
            if (rf_u32vec_push(out, cp)) return RF_ERR_NOMEM;
            continue;
        }
        uint16_t f = rf_tok_cp_class(cp);
        if (t->clean_text) {
            if (f & RF_CP_REMOVE) continue;
            if (f & RF_CP_CLEAN_WS) cp = ' ', f = rf_tok_cp_class(' ');
        }
        if (cp < 0x80) {
            if (t->lowercase && cp - 'A' < 26u) cp += 32;
            if (rf_u32vec_push(out, cp)) return RF_ERR_NOMEM;
            floor = out->n;
            continue;
        }
        /* handle_chinese_chars pads before NFD, which still decomposes the
         * CJK compatibility ideographs (U+F900 -> U+8C48) */
        bool cjk = t->handle_chinese && (f & RF_CP_CJK);
        if (cjk) {
            if (rf_u32vec_push(out, ' ')) return RF_ERR_NOMEM;
            floor = out->n;
        }
        if (!t->strip_accents) {
            if (rf_u32vec_push(out, cp)) return RF_ERR_NOMEM;
        } else {
            utf8proc_int32_t dec[32];
            int last = 0;
            utf8proc_ssize_t nd =
                utf8proc_decompose_char((utf8proc_int32_t)cp, dec, 32, UTF8PROC_DECOMPOSE, &last);
            if (nd < 0 || nd > 32) return rf_fail(RF_ERR_INTERNAL, "NFD of U+%04X failed", cp);
            for (utf8proc_ssize_t k = 0; k < nd; k++) {
                uint32_t d = (uint32_t)dec[k];
                if (rf_tok_cp_class(d) & RF_CP_MN) continue;
                if (ccc_of(d) == 0) floor = out->n;
                if (push_ordered(out, floor, d)) return RF_ERR_NOMEM;
            }
        }
        if (cjk) {
            if (rf_u32vec_push(out, ' ')) return RF_ERR_NOMEM;
            floor = out->n;
        }
    }
    if (t->has_normalizer && t->lowercase && nonascii) {
        for (size_t i = 0; i < out->n; i++) {
            uint32_t cp = out->v[i], lo[3];
            if (cp < 0x80) { /* ASCII letters may come out of NFD (É -> E + U+0301) */
                if (cp - 'A' < 26u) out->v[i] = cp + 32;
                continue;
            }
            int k = rf_tok_lower(cp, lo);
            if (k == 1) {
                out->v[i] = lo[0];
                continue;
            }
            if (rf_u32vec_reserve(out, (size_t)k)) return RF_ERR_NOMEM;
            memmove(out->v + i + k, out->v + i + 1, (out->n - i - 1) * sizeof *out->v);
            memcpy(out->v + i, lo, (size_t)k * sizeof *lo);
            out->n += (size_t)k - 1;
            i += (size_t)k - 1;
        }
    }
    return 0;
}

/* Greedy longest-match WordPiece over the UTF-8 word w[0..offs[n]) of n
 * characters, character i starting at byte offs[i] (offs NULL: ASCII, so
 * character i is byte i); "##" pieces after the first. The whole word becomes
 * [UNK] if it is too long or any part of it has no match. */
static int wordpiece_utf8(const rf_tokenizer *t, const char *w, const uint32_t *offs, size_t n,
                          rf_u32vec *out) {
    if (n > t->max_chars_per_word) goto unk;
    size_t mark = out->n;
    for (size_t start = 0; start < n;) {
        const rf_strmap *map = start == 0 ? &t->vocab : &t->cont;
        size_t end = n, from = offs ? offs[start] : start;
        int64_t id = -1;
        for (; end > start; end--) {
            id = rf_strmap_get(map, w + from, (offs ? offs[end] : end) - from);
            if (id >= 0) break;
        }
        if (id < 0) {
            out->n = mark;
            goto unk;
        }
        if (rf_u32vec_push(out, (uint32_t)id)) return RF_ERR_NOMEM;
        start = end;
    }
    return 0;
unk:
    if (!t->has_unk)
        return rf_fail(RF_ERR_INVALID, "WordPiece: no [UNK] token for an unknown word");
    return rf_u32vec_push(out, t->unk_id) ? RF_ERR_NOMEM : 0;
}

/* WordPiece of the normalized word cps[0..n). */
static int wordpiece_word(rf_tok_state *st, const uint32_t *cps, size_t n, rf_u32vec *out) {
    if (n > st->tok->max_chars_per_word) return wordpiece_utf8(st->tok, NULL, NULL, n, out);
    rf_buf *w = &st->word;
    rf_u32vec *offs = &st->offs;
    w->len = 0;
    offs->n = 0;
    if (rf_buf_reserve(w, n * 4) || rf_u32vec_reserve(offs, n + 1)) return RF_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        offs->v[offs->n++] = (uint32_t)w->len;
        if (cps[i] < 0x80)
            w->data[w->len++] = (char)cps[i];
        else
            w->len += rf_utf8_encode(cps[i], w->data + w->len);
    }
    offs->v[offs->n++] = (uint32_t)w->len;
    return wordpiece_utf8(st->tok, w->data, offs->v, n, out);
}

/* ASCII input (the common case) needs neither code points nor NFD: one pass
 * over the bytes normalizes, splits and looks words up in place. The classes
 * are HF's (an ASCII byte is removed, whitespace or punctuation exactly as
 * the general path decides). */
static int wordpiece_ascii(rf_tok_state *st, const char *text, size_t len, rf_u32vec *out) {
    const rf_tokenizer *t = st->tok;
    rf_buf *w = &st->word;
    w->len = 0;
    if (rf_buf_reserve(w, len)) return RF_ERR_NOMEM;
    char *buf = w->data;
    size_t n = 0, start = 0;
    int rc;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)text[i];
        uint16_t f = rf_tok_cp_class(b);
        if (t->has_normalizer && t->clean_text) {
            if (f & RF_CP_REMOVE) continue;
            if (f & RF_CP_CLEAN_WS) b = ' ', f = rf_tok_cp_class(' ');
        }
        if (f & (RF_CP_WS | RF_CP_PUNCT)) {
            if (n > start && (rc = wordpiece_utf8(t, buf + start, NULL, n - start, out))) return rc;
            if (f & RF_CP_PUNCT) {
                buf[n] = (char)b;
                if ((rc = wordpiece_utf8(t, buf + n, NULL, 1, out))) return rc;
            }
            start = n;
            continue;
        }
        if (t->has_normalizer && t->lowercase && (unsigned)(b - 'A') < 26u) b += 32;
        buf[n++] = (char)b;
    }
    if (n > start && (rc = wordpiece_utf8(t, buf + start, NULL, n - start, out))) return rc;
    return 0;
}

static bool all_ascii(const char *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, s + i, 8);
        if (x & 0x8080808080808080ull) return false;
    }
    for (; i < n; i++)
        if ((unsigned char)s[i] & 0x80) return false;
    return true;
}

int rf_wordpiece_encode(rf_tok_state *st, const char *text, size_t len, rf_u32vec *out) {
    if (all_ascii(text, len)) return wordpiece_ascii(st, text, len, out);
    int rc = normalize(st, text, len);
    if (rc) return rc;
    /* BertPreTokenizer: split on whitespace, isolate punctuation */
    const uint32_t *c = st->cps.v;
    size_t n = st->cps.n, start = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t f = rf_tok_cp_class(c[i]);
        if (!(f & (RF_CP_WS | RF_CP_PUNCT))) continue;
        if (i > start && (rc = wordpiece_word(st, c + start, i - start, out))) return rc;
        if ((f & RF_CP_PUNCT) && (rc = wordpiece_word(st, c + i, 1, out))) return rc;
        start = i + 1;
    }
    if (n > start && (rc = wordpiece_word(st, c + start, n - start, out))) return rc;
    return 0;
}
