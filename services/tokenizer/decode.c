/* Ids back to text: HF's WordPiece and ByteLevel decoders. */
#include <string.h>

#include "common/error.h"
#include "common/utf8.h"
#include "tokenizer/tok_internal.h"

/* HF's wordpiece cleanup, applied to each token (with its leading space). */
static const char *const cleanup_from[] = {" .",  " ?",      " !",  " ,",   " ' ", " n't",
                                           " 'm", " do not", " 's", " 've", " 're"};
static const char *const cleanup_to[] = {".",  "?",      "!",  ",",   "'",  "n't",
                                         "'m", " don't", "'s", "'ve", "'re"};

/* Appends s with every occurrence of from[k] replaced by to[k], rule by rule. */
static int append_cleaned(rf_buf *out, const char *s, size_t n, rf_buf *tmp) {
    rf_buf cur = RF_BUF_INIT;
    if (rf_buf_append(&cur, s, n)) return RF_ERR_NOMEM;
    for (size_t r = 0; r < sizeof cleanup_from / sizeof *cleanup_from; r++) {
        const char *f = cleanup_from[r];
        size_t fl = strlen(f);
        tmp->len = 0;
        for (size_t i = 0; i < cur.len;) {
            if (cur.len - i >= fl && memcmp(cur.data + i, f, fl) == 0) {
                if (rf_buf_puts(tmp, cleanup_to[r])) goto nomem;
                i += fl;
            } else {
                if (rf_buf_putc(tmp, cur.data[i])) goto nomem;
                i++;
            }
        }
        cur.len = 0;
        if (rf_buf_append(&cur, tmp->data ? tmp->data : "", tmp->len)) goto nomem;
    }
    int rc = rf_buf_append(out, cur.data ? cur.data : "", cur.len);
    rf_buf_free(&cur);
    return rc;
nomem:
    rf_buf_free(&cur);
    return RF_ERR_NOMEM;
}

static int decode_wordpiece(const rf_tokenizer *t, const uint32_t *ids, size_t n, bool skip,
                            rf_buf *out) {
    const char *pre = t->dec_prefix ? t->dec_prefix : "##";
    size_t pl = strlen(pre), k = 0;
    rf_buf tok = RF_BUF_INIT, tmp = RF_BUF_INIT;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t len;
        const char *s = rf_tokenizer_id_to_token(t, ids[i], &len);
        if (!s || (skip && t->id_special[ids[i]])) continue;
        tok.len = 0;
        if (k++ == 0)
            rc = rf_buf_append(&tok, s, len);
        else if (len >= pl && memcmp(s, pre, pl) == 0)
            rc = rf_buf_append(&tok, s + pl, len - pl);
        else
            rc = rf_buf_putc(&tok, ' ') || rf_buf_append(&tok, s, len) ? RF_ERR_NOMEM : 0;
        if (!rc)
            rc = t->dec_cleanup ? append_cleaned(out, tok.data, tok.len, &tmp)
                                : rf_buf_append(out, tok.data, tok.len);
    }
    rf_buf_free(&tok);
    rf_buf_free(&tmp);
    return rc;
}

static int decode_bytelevel(const rf_tokenizer *t, const uint32_t *ids, size_t n, bool skip,
                            rf_buf *out) {
    rf_buf raw = RF_BUF_INIT;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t len;
        const char *s = rf_tokenizer_id_to_token(t, ids[i], &len);
        if (!s || (skip && t->id_special[ids[i]])) continue;
        size_t mark = raw.len;
        bool mapped = true;
        for (size_t j = 0; j < len && mapped;) {
            uint32_t cp;
            int k = rf_utf8_decode((const unsigned char *)s + j, len - j, &cp);
            if (k <= 0 || cp >= 324 || t->char_byte[cp] < 0) {
                mapped = false;
                break;
            }
            rc = rf_buf_putc(&raw, (char)t->char_byte[cp]);
            j += (size_t)k;
        }
        /* a token with a character outside the byte map goes through as it is */
        if (!mapped) {
            raw.len = mark;
            rc = rf_buf_append(&raw, s, len);
        }
    }
    if (!rc && rf_utf8_repair(raw.data ? raw.data : "", raw.len, out) < 0) rc = RF_ERR_NOMEM;
    rf_buf_free(&raw);
    return rc;
}

int rf_tok_decode(const rf_tokenizer *t, const uint32_t *ids, size_t n, bool skip_special,
                  rf_buf *out) {
    if (t->decoder == RF_DEC_WORDPIECE) return decode_wordpiece(t, ids, n, skip_special, out);
    if (t->decoder == RF_DEC_BYTELEVEL) return decode_bytelevel(t, ids, n, skip_special, out);
    /* no decoder: tokens joined by spaces, as HF does */
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *s = rf_tokenizer_id_to_token(t, ids[i], &len);
        if (!s || (skip_special && t->id_special[ids[i]])) continue;
        if ((!first && rf_buf_putc(out, ' ')) || rf_buf_append(out, s, len)) return RF_ERR_NOMEM;
        first = false;
    }
    return 0;
}
