/* Byte-level BPE from plain arrays: how a GGUF file's metadata stores a "gpt2"
 * tokenizer (tokenizer.ggml.tokens / merges / token_type), built the way
 * transformers builds it from such a file (integrations/gguf: GPT2Tokenizer
 * over the vocabulary and merges, control tokens as special added tokens,
 * user-defined ones as plain added tokens, ByteLevel pre-tokenizer with the
 * GPT-2 regex and no prefix space, ByteLevel decoder, no BOS/EOS added). */
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/error.h"
#include "tokenizer/tok_internal.h"

/* Decodes the UTF-8 code point at s[*i] and advances *i; -1 if malformed. */
static int32_t next_cp(const unsigned char *s, size_t n, size_t *i) {
    unsigned c = s[*i];
    int k = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (k < 0 || (size_t)k >= n - *i) return -1;
    uint32_t cp = k == 0 ? c : c & (0x3Fu >> k);
    for (int j = 1; j <= k; j++) {
        unsigned d = s[*i + (size_t)j];
        if ((d & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (d & 0x3F);
    }
    *i += (size_t)k + 1;
    return (int32_t)cp;
}

/* True if every character of s is in GPT-2's byte alphabet. */
static bool spelled_in_bytes(const rf_tokenizer *t, const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int32_t cp = next_cp((const unsigned char *)s, n, &i);
        if (cp < 0 || cp >= 324 || t->char_byte[cp] < 0) return false;
    }
    return true;
}

/* The byte-alphabet spelling of s's UTF-8 bytes (what HF does to a token that
 * is not spelled in the alphabet already). */
static int respell(const rf_tokenizer *t, const char *s, size_t n, rf_buf *out) {
    out->len = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = t->byte_char[(unsigned char)s[i]];
        char u[2];
        size_t k = c < 0x80 ? (u[0] = (char)c, 1)
                            : (u[0] = (char)(0xC0 | c >> 6), u[1] = (char)(0x80 | (c & 0x3F)), 2);
        if (rf_buf_append(out, u, k)) return RF_ERR_NOMEM;
    }
    return 0;
}

int rf_tokenizer_from_bpe_arrays(const rf_tok_bpe_arrays *a, rf_tokenizer **out) {
    *out = NULL;
    if (a->n_tokens == 0 || a->n_tokens > (1u << 24))
        return rf_fail(RF_ERR_INVALID, "bpe arrays: %zu tokens", a->n_tokens);
    rf_tokenizer *t = rf_tok_alloc();
    if (!t) return RF_ERR_NOMEM;
    rf_tok_init_bytelevel(t);
    rf_buf tmp = RF_BUF_INIT, m2 = RF_BUF_INIT;
    int rc = 0;
    for (size_t i = 0; i < a->n_tokens && !rc; i++) {
        const char *s = a->tokens[i];
        size_t n = a->token_lens[i];
        if (spelled_in_bytes(t, s, n)) {
            rc = rf_tok_set_token(t, s, n, (uint32_t)i);
        } else if (!(rc = respell(t, s, n, &tmp))) {
            rc = rf_tok_set_token(t, tmp.data ? tmp.data : "", tmp.len, (uint32_t)i);
        }
    }
    if (!rc) rc = rf_tok_reserve_merges(t, a->n_merges);
    for (size_t i = 0; i < a->n_merges && !rc; i++) {
        const char *s = a->merges[i];
        size_t n = a->merge_lens[i];
        const char *sp = memchr(s, ' ', n);
        if (!sp || sp == s || sp + 1 == s + n || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) {
            rc = rf_fail(RF_ERR_INVALID, "merge %zu (%.*s) is not two tokens", i + 1, (int)n, s);
            break;
        }
        size_t al = (size_t)(sp - s), bl = n - al - 1;
        int64_t ia = rf_strmap_get(&t->vocab, s, al), ib = rf_strmap_get(&t->vocab, sp + 1, bl);
        m2.len = 0;
        if (rf_buf_append(&m2, s, al) || rf_buf_append(&m2, sp + 1, bl)) {
            rc = RF_ERR_NOMEM;
            break;
        }
        int64_t im = rf_strmap_get(&t->vocab, m2.data, m2.len);
        if (ia < 0 || ib < 0 || im < 0)
            rc =
                rf_fail(RF_ERR_INVALID, "merge %zu (%.*s) uses a token missing from the vocabulary",
                        i + 1, (int)n, s);
        else
            rc = rf_tok_add_merge(t, (uint32_t)ia, (uint32_t)ib, (uint32_t)i, (uint32_t)im);
    }
    /* control tokens (type 3) become special added tokens, user-defined ones
     * (type 4) plain added tokens, each under its vocabulary id */
    for (size_t i = 0; a->token_types && i < a->n_tokens && !rc; i++) {
        int32_t ty = a->token_types[i];
        const char *s = a->tokens[i];
        size_t n = a->token_lens[i];
        if ((ty != 3 && ty != 4) || n == 0) continue;
        if (ty == 3 && !spelled_in_bytes(t, s, n)) continue; /* a llama.cpp mislabel: HF skips it */
        int64_t id = rf_strmap_get(&t->vocab, s, n);
        if (id < 0) continue;
        rc = rf_tok_add_added(t, s, n, (uint32_t)id, ty == 3);
    }
    if (!rc) {
        t->add_prefix_space = false;
        t->decoder = RF_DEC_BYTELEVEL;
        t->allow_missing_bytes = true; /* SmolLM2 has no token for some control bytes */
        rc = rf_tok_finish_bpe(t);
    }
    /* TemplateProcessing "A" and "A B:1", as transformers sets it */
    if (!rc) rc = rf_tok_template_add(&t->single, 0, 0, NULL, 0);
    if (!rc) rc = rf_tok_template_add(&t->pair, 0, 0, NULL, 0);
    if (!rc) rc = rf_tok_template_add(&t->pair, 1, 1, NULL, 0);
    if (!rc) t->has_template = true;
    rf_buf_free(&tmp);
    rf_buf_free(&m2);
    if (rc) {
        rf_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}
