/* GGUF metadata -> rf_tokenizer: gathers the string arrays (pointers into the
 * mapped file) and hands them to rf_tokenizer_from_bpe_arrays. */
#include "tokenizer/gguf_tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static bool str_is(const char *s, size_t n, const char *lit) {
    return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

/* The strings of a string array: parallel pointer and length arrays (malloc'd). */
static int gather(const rf_gguf_kv *kv, const char ***s, size_t **len) {
    size_t n = (size_t)kv->n;
    *s = malloc((n ? n : 1) * sizeof **s);
    *len = malloc((n ? n : 1) * sizeof **len);
    if (!*s || !*len) return RF_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = rf_gguf_arr_str(kv, i, &(*s)[i], &(*len)[i]);
        if (rc) return rc;
    }
    return 0;
}

static int64_t opt_id(const rf_gguf_file *f, const char *key) {
    uint64_t v;
    return rf_gguf_get_u64(f, key, &v) == 0 && v < INT64_MAX ? (int64_t)v : -1;
}

int rf_gguf_tokenizer(const rf_gguf_file *f, rf_tokenizer **out, rf_gguf_tok_ids *ids) {
    *out = NULL;
    const char *s;
    size_t n;
    int rc = rf_gguf_get_str(f, "tokenizer.ggml.model", &s, &n);
    if (rc) return rf_fail_ctx(rc, "gguf tokenizer");
    if (!str_is(s, n, "gpt2"))
        return rf_fail(
            RF_ERR_UNSUPPORTED,
            "gguf tokenizer: model '%.*s' is not supported (only byte-level BPE, 'gpt2')", (int)n,
            s);
    rc = rf_gguf_get_str(f, "tokenizer.ggml.pre", &s, &n);
    if (rc == 0 && !str_is(s, n, "default") && !str_is(s, n, "gpt-2") && !str_is(s, n, "smollm"))
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "gguf tokenizer: pre-tokenizer '%.*s' is not supported (default, gpt-2, "
                       "smollm are)",
                       (int)n, s);
    if (rc && rc != RF_ERR_NOT_FOUND) return rc;
    const char *flags[] = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"};
    for (int i = 0; i < 2; i++) {
        bool b = false;
        rc = rf_gguf_get_bool(f, flags[i], &b);
        if (rc && rc != RF_ERR_NOT_FOUND) return rc;
        if (b)
            return rf_fail(RF_ERR_UNSUPPORTED, "gguf tokenizer: %s = true is not supported",
                           flags[i]);
    }
    const rf_gguf_kv *toks = rf_gguf_find_kv(f, "tokenizer.ggml.tokens"),
                     *merges = rf_gguf_find_kv(f, "tokenizer.ggml.merges"),
                     *types = rf_gguf_find_kv(f, "tokenizer.ggml.token_type");
    if (!toks || !merges)
        return rf_fail(RF_ERR_NOT_FOUND, "gguf tokenizer: no tokenizer.ggml.tokens or .merges");
    if (toks->type != RF_GGUF_ARRAY || toks->arr_type != RF_GGUF_STRING ||
        merges->type != RF_GGUF_ARRAY || merges->arr_type != RF_GGUF_STRING)
        return rf_fail(RF_ERR_INVALID, "gguf tokenizer: tokens and merges must be string arrays");
    if (types && (types->type != RF_GGUF_ARRAY || types->n != toks->n))
        return rf_fail(RF_ERR_INVALID, "gguf tokenizer: token_type must be an array of %llu",
                       (unsigned long long)toks->n);
    rf_tok_bpe_arrays a = {.n_tokens = (size_t)toks->n, .n_merges = (size_t)merges->n};
    const char **ts = NULL, **ms = NULL;
    size_t *tl = NULL, *ml = NULL;
    int32_t *tt = NULL;
    rc = gather(toks, &ts, &tl);
    if (!rc) rc = gather(merges, &ms, &ml);
    if (!rc && types) {
        if (!(tt = malloc((a.n_tokens ? a.n_tokens : 1) * sizeof *tt))) rc = RF_ERR_NOMEM;
        for (size_t i = 0; !rc && i < a.n_tokens; i++) {
            int64_t v;
            rc = rf_gguf_arr_int(types, i, &v);
            tt[i] = (int32_t)(v < 0 || v > 64 ? -1 : v);
        }
    }
    if (!rc) {
        a.tokens = ts, a.token_lens = tl, a.merges = ms, a.merge_lens = ml, a.token_types = tt;
        rc = rf_tokenizer_from_bpe_arrays(&a, out);
    }
    free(ts), free(tl), free(ms), free(ml), free(tt);
    if (rc) return rf_fail_ctx(rc, "gguf tokenizer");
    if (ids) {
        ids->bos = opt_id(f, "tokenizer.ggml.bos_token_id");
        ids->eos = opt_id(f, "tokenizer.ggml.eos_token_id");
        ids->unk = opt_id(f, "tokenizer.ggml.unknown_token_id");
        ids->pad = opt_id(f, "tokenizer.ggml.padding_token_id");
    }
    return 0;
}
