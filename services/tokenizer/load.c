/* Loaders: tokenizer.json, vocab.txt (BERT), vocab.json + merges.txt (GPT-2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/gguf.h"
#include "common/json.h"
#include "common/sys.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/tok_internal.h"

#define MAX_FILE ((size_t)1 << 30)

static bool str_is(const rf_json *v, const char *s) {
    return rf_json_is_str(v) && v->len == strlen(s) && memcmp(v->u.str, s, v->len) == 0;
}

static bool is_null(const rf_json *v) {
    return !v || v->type == RF_JSON_NULL;
}

static int get_bool(const rf_json *obj, const char *key, bool def, bool *out) {
    const rf_json *v = rf_json_get(obj, key);
    if (is_null(v))
        *out = def;
    else if (v->type == RF_JSON_TRUE || v->type == RF_JSON_FALSE)
        *out = v->type == RF_JSON_TRUE;
    else
        return rf_fail(RF_ERR_PARSE, "tokenizer.json: \"%s\" must be a boolean", key);
    return 0;
}

static int get_uint(const rf_json *obj, const char *key, uint64_t max, uint64_t *out) {
    int64_t x;
    const rf_json *v = rf_json_get(obj, key);
    if (!v || rf_json_int64(v, &x) || x < 0 || (uint64_t)x > max)
        return rf_fail(RF_ERR_PARSE, "tokenizer.json: \"%s\" must be an integer in [0, %llu]", key,
                       (unsigned long long)max);
    *out = (uint64_t)x;
    return 0;
}

static int type_of(const rf_json *obj, const char *what, const char **type) {
    const rf_json *ty = rf_json_get(obj, "type");
    if (!rf_json_is_str(ty)) return rf_fail(RF_ERR_PARSE, "tokenizer.json: %s has no type", what);
    *type = ty->u.str;
    return 0;
}

static int load_vocab_object(rf_tokenizer *t, const rf_json *vocab) {
    if (!vocab || vocab->type != RF_JSON_OBJECT)
        return rf_fail(RF_ERR_PARSE, "tokenizer.json: model.vocab must be an object");
    for (size_t i = 0; i < vocab->len; i++) {
        const rf_json_member *m = &vocab->u.members[i];
        int64_t id;
        if (rf_json_int64(&m->value, &id) || id < 0 || id > UINT32_MAX)
            return rf_fail(RF_ERR_PARSE, "vocabulary: bad id for token %.*s", (int)m->keylen,
                           m->key);
        int rc = rf_tok_set_token(t, m->key, m->keylen, (uint32_t)id);
        if (rc) return rc;
    }
    return 0;
}

/* One merge "a b" (or ["a", "b"]) -> ids. */
static int add_merge_strings(rf_tokenizer *t, const char *a, size_t al, const char *b, size_t bl,
                             uint32_t rank, rf_buf *tmp) {
    int64_t ia = rf_strmap_get(&t->vocab, a, al), ib = rf_strmap_get(&t->vocab, b, bl);
    tmp->len = 0;
    if (rf_buf_append(tmp, a, al) || rf_buf_append(tmp, b, bl)) return RF_ERR_NOMEM;
    int64_t im = rf_strmap_get(&t->vocab, tmp->data, tmp->len);
    if (ia < 0 || ib < 0 || im < 0)
        return rf_fail(RF_ERR_INVALID,
                       "merge %u (%.*s %.*s) uses a token missing from the vocabulary", rank + 1,
                       (int)al, a, (int)bl, b);
    return rf_tok_add_merge(t, (uint32_t)ia, (uint32_t)ib, rank, (uint32_t)im);
}

static int load_merges_array(rf_tokenizer *t, const rf_json *merges) {
    if (!merges || merges->type != RF_JSON_ARRAY)
        return rf_fail(RF_ERR_PARSE, "tokenizer.json: model.merges must be an array");
    int rc = rf_tok_reserve_merges(t, merges->len);
    rf_buf tmp = RF_BUF_INIT;
    for (size_t i = 0; i < merges->len && !rc; i++) {
        const rf_json *m = &merges->u.items[i];
        if (rf_json_is_str(m)) {
            const char *sp = memchr(m->u.str, ' ', m->len);
            if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - m->u.str)))
                rc = rf_fail(RF_ERR_PARSE, "merge %zu is not two tokens", i + 1);
            else
                rc = add_merge_strings(t, m->u.str, (size_t)(sp - m->u.str), sp + 1,
                                       m->len - (size_t)(sp + 1 - m->u.str), (uint32_t)i, &tmp);
        } else if (m->type == RF_JSON_ARRAY && m->len == 2 && rf_json_is_str(&m->u.items[0]) &&
                   rf_json_is_str(&m->u.items[1])) {
            const rf_json *a = &m->u.items[0], *b = &m->u.items[1];
            rc = add_merge_strings(t, a->u.str, a->len, b->u.str, b->len, (uint32_t)i, &tmp);
        } else {
            rc = rf_fail(RF_ERR_PARSE, "merge %zu is neither \"a b\" nor [a, b]", i + 1);
        }
    }
    rf_buf_free(&tmp);
    return rc;
}

static int load_model(rf_tokenizer *t, const rf_json *model) {
    if (!model || model->type != RF_JSON_OBJECT)
        return rf_fail(RF_ERR_PARSE, "tokenizer.json: no model object");
    const rf_json *ty = rf_json_get(model, "type");
    bool bpe = ty ? str_is(ty, "BPE") : rf_json_get(model, "merges") != NULL;
    if (ty && !bpe && !str_is(ty, "WordPiece"))
        return rf_fail(RF_ERR_UNSUPPORTED, "tokenizer.json: model type %s is not supported",
                       rf_json_is_str(ty) ? ty->u.str : "?");
    int rc = load_vocab_object(t, rf_json_get(model, "vocab"));
    if (rc) return rc;
    if (bpe) {
        const rf_json *v;
        if (!is_null(v = rf_json_get(model, "dropout")))
            return rf_fail(RF_ERR_UNSUPPORTED, "BPE dropout is not supported");
        if (!is_null(v = rf_json_get(model, "continuing_subword_prefix")) && v->len)
            return rf_fail(RF_ERR_UNSUPPORTED, "BPE continuing_subword_prefix is not supported");
        if (!is_null(v = rf_json_get(model, "end_of_word_suffix")) && v->len)
            return rf_fail(RF_ERR_UNSUPPORTED, "BPE end_of_word_suffix is not supported");
        bool flag = false;
        if ((rc = get_bool(model, "byte_fallback", false, &flag))) return rc;
        if (flag) return rf_fail(RF_ERR_UNSUPPORTED, "BPE byte_fallback is not supported");
        if ((rc = get_bool(model, "ignore_merges", false, &flag))) return rc;
        if (flag) return rf_fail(RF_ERR_UNSUPPORTED, "BPE ignore_merges is not supported");
        return load_merges_array(t, rf_json_get(model, "merges"));
    }
    const rf_json *unk = rf_json_get(model, "unk_token");
    if (rf_json_is_str(unk)) {
        int64_t id = rf_strmap_get(&t->vocab, unk->u.str, unk->len);
        if (id < 0) return rf_fail(RF_ERR_INVALID, "WordPiece unk_token is not in the vocabulary");
        t->unk_id = (uint32_t)id;
        t->has_unk = true;
    }
    const rf_json *pre = rf_json_get(model, "continuing_subword_prefix");
    if (rf_json_is_str(pre) && !(t->cont_prefix = strndup(pre->u.str, pre->len)))
        return RF_ERR_NOMEM;
    if (rf_json_get(model, "max_input_chars_per_word")) {
        uint64_t m;
        if ((rc = get_uint(model, "max_input_chars_per_word", UINT32_MAX, &m))) return rc;
        t->max_chars_per_word = (uint32_t)m;
    }
    return 0;
}

static int load_normalizer(rf_tokenizer *t, const rf_json *n) {
    if (is_null(n)) return 0;
    const char *type = "";
    int rc = type_of(n, "normalizer", &type);
    if (rc) return rc;
    if (strcmp(type, "BertNormalizer") != 0)
        return rf_fail(RF_ERR_UNSUPPORTED, "normalizer %s is not supported", type);
    t->has_normalizer = true;
    if ((rc = get_bool(n, "clean_text", true, &t->clean_text)) ||
        (rc = get_bool(n, "handle_chinese_chars", true, &t->handle_chinese)) ||
        (rc = get_bool(n, "lowercase", true, &t->lowercase)))
        return rc;
    /* strip_accents: null means "follow lowercase" */
    return get_bool(n, "strip_accents", t->lowercase, &t->strip_accents);
}

static int load_pre_tokenizer(rf_tokenizer *t, const rf_json *p, bool bpe) {
    const char *type = "(none)";
    int rc;
    if (!is_null(p) && (rc = type_of(p, "pre_tokenizer", &type))) return rc;
    if (!bpe && strcmp(type, "BertPreTokenizer") == 0) return 0;
    if (bpe && strcmp(type, "ByteLevel") == 0) {
        bool regex = true;
        if ((rc = get_bool(p, "use_regex", true, &regex))) return rc;
        if (!regex) return rf_fail(RF_ERR_UNSUPPORTED, "ByteLevel with use_regex=false");
        return get_bool(p, "add_prefix_space", false, &t->add_prefix_space);
    }
    return rf_fail(RF_ERR_UNSUPPORTED, "pre_tokenizer %s with a %s model is not supported", type,
                   bpe ? "BPE" : "WordPiece");
}

/* TemplateProcessing: "single"/"pair" lists of {"SpecialToken": {"id", "type_id"}}
 * or {"Sequence": {"id": "A"|"B", "type_id"}}; ids of specials from "special_tokens". */
static int load_template(rf_tokenizer *t, rf_tok_template *tp, const rf_json *list,
                         const rf_json *specials) {
    if (!list || list->type != RF_JSON_ARRAY)
        return rf_fail(RF_ERR_PARSE, "TemplateProcessing: template must be an array");
    for (size_t i = 0; i < list->len; i++) {
        const rf_json *it = &list->u.items[i], *sp = rf_json_get(it, "SpecialToken"),
                      *sq = rf_json_get(it, "Sequence"), *body = sp ? sp : sq;
        uint64_t type_id;
        const rf_json *id = rf_json_get(body, "id");
        if (!body || !rf_json_is_str(id) || get_uint(body, "type_id", UINT32_MAX, &type_id))
            return rf_fail(RF_ERR_PARSE, "TemplateProcessing: bad piece %zu", i);
        int rc;
        if (sq) {
            int seq = str_is(id, "A") ? 0 : str_is(id, "B") ? 1 : -1;
            if (seq < 0)
                return rf_fail(RF_ERR_PARSE, "TemplateProcessing: sequence id %s", id->u.str);
            rc = rf_tok_template_add(tp, seq, (uint32_t)type_id, NULL, 0);
        } else {
            const rf_json *ids = rf_json_get(rf_json_get(specials, id->u.str), "ids");
            if (!ids || ids->type != RF_JSON_ARRAY || ids->len > 64)
                return rf_fail(RF_ERR_PARSE, "TemplateProcessing: no ids for %s", id->u.str);
            uint32_t buf[64];
            for (size_t k = 0; k < ids->len; k++) {
                int64_t x;
                if (rf_json_int64(&ids->u.items[k], &x) || x < 0 || x >= t->vocab_size)
                    return rf_fail(RF_ERR_PARSE, "TemplateProcessing: bad id for %s", id->u.str);
                buf[k] = (uint32_t)x;
            }
            rc = rf_tok_template_add(tp, -1, (uint32_t)type_id, buf, ids->len);
        }
        if (rc) return rc;
    }
    return 0;
}

static int load_post_processor(rf_tokenizer *t, const rf_json *p) {
    if (is_null(p)) return 0;
    const char *type = "";
    int rc = type_of(p, "post_processor", &type);
    if (rc) return rc;
    if (strcmp(type, "ByteLevel") == 0) return 0; /* only adjusts offsets */
    if (strcmp(type, "TemplateProcessing") == 0) {
        const rf_json *sp = rf_json_get(p, "special_tokens");
        if ((rc = load_template(t, &t->single, rf_json_get(p, "single"), sp)) ||
            (rc = load_template(t, &t->pair, rf_json_get(p, "pair"), sp)))
            return rc;
        t->has_template = true;
        return 0;
    }
    if (strcmp(type, "BertProcessing") == 0) {
        const rf_json *cls = rf_json_get(p, "cls"), *sep = rf_json_get(p, "sep");
        int64_t c, s;
        if (!cls || !sep || cls->type != RF_JSON_ARRAY || sep->type != RF_JSON_ARRAY ||
            cls->len != 2 || sep->len != 2 || rf_json_int64(&cls->u.items[1], &c) ||
            rf_json_int64(&sep->u.items[1], &s) || c < 0 || s < 0 || c >= t->vocab_size ||
            s >= t->vocab_size)
            return rf_fail(RF_ERR_PARSE, "BertProcessing: bad cls/sep");
        return rf_tok_bert_template(t, (uint32_t)c, (uint32_t)s);
    }
    return rf_fail(RF_ERR_UNSUPPORTED, "post_processor %s is not supported", type);
}

static int load_side(const rf_json *obj, rf_tok_side *side) {
    const rf_json *d = rf_json_get(obj, "direction");
    if (is_null(d) || str_is(d, "Right"))
        *side = RF_SIDE_RIGHT;
    else if (str_is(d, "Left"))
        *side = RF_SIDE_LEFT;
    else
        return rf_fail(RF_ERR_PARSE, "tokenizer.json: bad direction");
    return 0;
}

static int load_truncation(rf_tokenizer *t, const rf_json *tr) {
    if (is_null(tr)) return 0;
    uint64_t max;
    int rc = get_uint(tr, "max_length", 1u << 30, &max);
    if (rc || (rc = load_side(tr, &t->trunc_side))) return rc;
    const rf_json *s = rf_json_get(tr, "strategy");
    if (is_null(s) || str_is(s, "LongestFirst"))
        t->trunc_strategy = RF_TRUNC_LONGEST_FIRST;
    else if (str_is(s, "OnlyFirst"))
        t->trunc_strategy = RF_TRUNC_ONLY_FIRST;
    else if (str_is(s, "OnlySecond"))
        t->trunc_strategy = RF_TRUNC_ONLY_SECOND;
    else
        return rf_fail(RF_ERR_PARSE, "truncation: unknown strategy");
    t->trunc_max = max;
    return 0;
}

static int load_padding(rf_tokenizer *t, const rf_json *p) {
    if (is_null(p)) return 0;
    uint64_t id = 0, type_id = 0, mult = 0, fixed = 0;
    int rc;
    if ((rc = load_side(p, &t->pad_side))) return rc;
    if (rf_json_get(p, "pad_id") && (rc = get_uint(p, "pad_id", t->vocab_size, &id))) return rc;
    if (rf_json_get(p, "pad_type_id") && (rc = get_uint(p, "pad_type_id", UINT32_MAX, &type_id)))
        return rc;
    if (!is_null(rf_json_get(p, "pad_to_multiple_of")) &&
        (rc = get_uint(p, "pad_to_multiple_of", 1u << 20, &mult)))
        return rc;
    const rf_json *s = rf_json_get(p, "strategy");
    if (s && s->type == RF_JSON_OBJECT && rf_json_get(s, "Fixed")) {
        if ((rc = get_uint(s, "Fixed", 1u << 30, &fixed))) return rc;
    } else if (!is_null(s) && !str_is(s, "BatchLongest")) {
        return rf_fail(RF_ERR_PARSE, "padding: unknown strategy");
    }
    t->pad = true;
    t->pad_id = (uint32_t)id;
    t->pad_type_id = (uint32_t)type_id;
    t->pad_multiple = mult;
    t->pad_len = fixed;
    return 0;
}

static int load_decoder(rf_tokenizer *t, const rf_json *d) {
    if (is_null(d)) return 0;
    const char *type = "";
    int rc = type_of(d, "decoder", &type);
    if (rc) return rc;
    if (strcmp(type, "ByteLevel") == 0) {
        t->decoder = RF_DEC_BYTELEVEL;
        return 0;
    }
    if (strcmp(type, "WordPiece") == 0) {
        const rf_json *p = rf_json_get(d, "prefix");
        t->decoder = RF_DEC_WORDPIECE;
        if (!(t->dec_prefix = rf_json_is_str(p) ? strndup(p->u.str, p->len) : strdup("##")))
            return RF_ERR_NOMEM;
        return get_bool(d, "cleanup", true, &t->dec_cleanup);
    }
    return rf_fail(RF_ERR_UNSUPPORTED, "decoder %s is not supported", type);
}

static int load_added(rf_tokenizer *t, const rf_json *list) {
    if (is_null(list)) return 0;
    if (list->type != RF_JSON_ARRAY) return rf_fail(RF_ERR_PARSE, "added_tokens must be an array");
    for (size_t i = 0; i < list->len; i++) {
        const rf_json *a = &list->u.items[i], *content = rf_json_get(a, "content");
        uint64_t id;
        bool special = false, normalized = false, lstrip = false, rstrip = false, single = false;
        int rc;
        if (!rf_json_is_str(content) || content->len == 0)
            return rf_fail(RF_ERR_PARSE, "added_tokens[%zu]: no content", i);
        if ((rc = get_uint(a, "id", (1u << 24) - 1, &id)) ||
            (rc = get_bool(a, "special", false, &special)) ||
            (rc = get_bool(a, "normalized", !special, &normalized)) ||
            (rc = get_bool(a, "lstrip", false, &lstrip)) ||
            (rc = get_bool(a, "rstrip", false, &rstrip)) ||
            (rc = get_bool(a, "single_word", false, &single)))
            return rc;
        if (lstrip || rstrip || single)
            return rf_fail(RF_ERR_UNSUPPORTED, "added token %s: lstrip/rstrip/single_word",
                           content->u.str);
        /* matched on the raw text; that equals HF only if normalizing cannot
         * change what matches, i.e. with no normalizer */
        if (normalized && t->has_normalizer)
            return rf_fail(RF_ERR_UNSUPPORTED, "added token %s: normalized with a normalizer",
                           content->u.str);
        if ((rc = rf_tok_add_added(t, content->u.str, content->len, (uint32_t)id, special)))
            return rc;
    }
    return 0;
}

int rf_tokenizer_from_json(const char *text, size_t len, rf_tokenizer **out) {
    *out = NULL;
    rf_json_doc *doc = rf_json_doc_new();
    rf_tokenizer *t = rf_tok_alloc();
    if (!doc || !t) {
        rf_json_doc_free(doc);
        rf_tokenizer_free(t);
        return RF_ERR_NOMEM;
    }
    const rf_json *root;
    int rc = rf_json_parse(doc, text, len, &root);
    if (!rc && root->type != RF_JSON_OBJECT)
        rc = rf_fail(RF_ERR_PARSE, "tokenizer.json: not an object");
    const rf_json *model = rc ? NULL : rf_json_get(root, "model");
    bool bpe = false;
    if (!rc) rc = load_model(t, model);
    if (!rc) bpe = !rf_json_get(model, "type") || str_is(rf_json_get(model, "type"), "BPE");
    if (!rc) rc = load_normalizer(t, rf_json_get(root, "normalizer"));
    if (!rc && bpe && t->has_normalizer)
        rc = rf_fail(RF_ERR_UNSUPPORTED, "a normalizer with a BPE model is not supported");
    if (!rc) rc = load_pre_tokenizer(t, rf_json_get(root, "pre_tokenizer"), bpe);
    if (!rc) rc = load_added(t, rf_json_get(root, "added_tokens"));
    if (!rc) rc = bpe ? rf_tok_finish_bpe(t) : rf_tok_finish_wordpiece(t);
    if (!rc) rc = load_post_processor(t, rf_json_get(root, "post_processor"));
    if (!rc) rc = load_truncation(t, rf_json_get(root, "truncation"));
    if (!rc) rc = load_padding(t, rf_json_get(root, "padding"));
    if (!rc) rc = load_decoder(t, rf_json_get(root, "decoder"));
    rf_json_doc_free(doc);
    if (rc) {
        rf_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* vocab.txt: one token per line (trailing whitespace trimmed), id = line
 * index; configured like transformers' BertTokenizerFast (uncased). */
static int load_vocab_txt(const char *path, rf_tokenizer **out) {
    char *text;
    size_t len;
    int rc = rf_read_file(path, MAX_FILE, &text, &len);
    if (rc) return rc;
    rf_tokenizer *t = rf_tok_alloc();
    if (!t) {
        free(text);
        return RF_ERR_NOMEM;
    }
    uint32_t id = 0;
    for (size_t i = 0; i < len && !rc; id++) {
        size_t e = i;
        while (e < len && text[e] != '\n')
            e++;
        size_t end = e;
        while (end > i && (text[end - 1] == ' ' || text[end - 1] == '\t' || text[end - 1] == '\r'))
            end--;
        rc = rf_tok_set_token(t, text + i, end - i, id);
        i = e + 1;
    }
    free(text);
    t->has_normalizer = t->clean_text = t->handle_chinese = t->strip_accents = t->lowercase = true;
    t->decoder = RF_DEC_WORDPIECE;
    t->dec_cleanup = true;
    if (!rc && !(t->dec_prefix = strdup("##"))) rc = RF_ERR_NOMEM;
    static const char *const specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (size_t k = 0; k < 5 && !rc; k++) {
        int64_t sid = rf_strmap_get(&t->vocab, specials[k], strlen(specials[k]));
        if (sid < 0)
            rc = rf_fail(RF_ERR_INVALID, "%s: no %s token", path, specials[k]);
        else
            rc = rf_tok_add_added(t, specials[k], strlen(specials[k]), (uint32_t)sid, true);
    }
    if (!rc) {
        t->unk_id = t->added[1].id;
        t->has_unk = true;
        rc = rf_tok_finish_wordpiece(t);
    }
    if (!rc) rc = rf_tok_bert_template(t, t->added[2].id, t->added[3].id);
    if (rc) {
        rf_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* vocab.json + merges.txt: configured like transformers' GPT2TokenizerFast
 * (ByteLevel without prefix space, <|endoftext|> a special added token). */
static int load_gpt2_files(const char *vocab_path, const char *merges_path, rf_tokenizer **out) {
    char *vtext = NULL, *mtext = NULL;
    size_t vlen, mlen;
    rf_json_doc *doc = rf_json_doc_new();
    rf_tokenizer *t = rf_tok_alloc();
    rf_buf tmp = RF_BUF_INIT;
    const rf_json *root;
    int rc = !doc || !t ? RF_ERR_NOMEM : 0;
    if (!rc) rc = rf_read_file(vocab_path, MAX_FILE, &vtext, &vlen);
    if (!rc) rc = rf_read_file(merges_path, MAX_FILE, &mtext, &mlen);
    if (!rc) rc = rf_json_parse(doc, vtext, vlen, &root);
    if (!rc) rc = load_vocab_object(t, root);
    size_t lines = 0;
    for (size_t i = 0; !rc && i < mlen; i++)
        lines += mtext[i] == '\n';
    if (!rc) rc = rf_tok_reserve_merges(t, lines + 1);
    uint32_t rank = 0;
    for (size_t i = 0, lineno = 1; !rc && i < mlen; lineno++) {
        size_t e = i;
        while (e < mlen && mtext[e] != '\n')
            e++;
        size_t end = e;
        if (end > i && mtext[end - 1] == '\r') end--;
        const char *s = mtext + i;
        size_t n = end - i;
        i = e + 1;
        if (n == 0 || (n >= 8 && memcmp(s, "#version", 8) == 0)) continue;
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
            rc = rf_fail(RF_ERR_PARSE, "%s:%zu: not two tokens", merges_path, lineno);
        else
            rc = add_merge_strings(t, s, (size_t)(sp - s), sp + 1, n - (size_t)(sp + 1 - s), rank++,
                                   &tmp);
    }
    if (!rc) {
        t->decoder = RF_DEC_BYTELEVEL;
        int64_t eot = rf_strmap_get(&t->vocab, "<|endoftext|>", 13);
        if (eot >= 0) rc = rf_tok_add_added(t, "<|endoftext|>", 13, (uint32_t)eot, true);
    }
    if (!rc) rc = rf_tok_finish_bpe(t);
    rf_buf_free(&tmp);
    free(vtext);
    free(mtext);
    rf_json_doc_free(doc);
    if (rc) {
        rf_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int rf_tokenizer_load(const char *path, rf_tokenizer **out) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return rf_fail(RF_ERR_NOT_FOUND, "%s: no such file", path);
    char a[4096], b[4096];
    if (S_ISDIR(st.st_mode)) {
        snprintf(a, sizeof a, "%s/tokenizer.json", path);
        if (file_exists(a)) return rf_tokenizer_load(a, out);
        snprintf(a, sizeof a, "%s/vocab.json", path);
        if (file_exists(a)) return rf_tokenizer_load(a, out);
        snprintf(a, sizeof a, "%s/vocab.txt", path);
        if (file_exists(a)) return load_vocab_txt(a, out);
        return rf_fail(RF_ERR_NOT_FOUND, "%s: no tokenizer.json, vocab.json or vocab.txt", path);
    }
    if (ends_with(path, ".txt")) return load_vocab_txt(path, out);
    if (ends_with(path, ".gguf")) { /* the tokenizer in a model file's metadata */
        rf_gguf_file *f;
        int rc = rf_gguf_open(path, &f);
        if (!rc) rc = rf_gguf_tokenizer(f, out, NULL);
        rf_gguf_free(f);
        return rc;
    }
    if (ends_with(path, "vocab.json")) {
        size_t dir = strlen(path) - strlen("vocab.json");
        if (dir >= sizeof b - 16) return rf_fail(RF_ERR_RANGE, "path too long");
        snprintf(b, sizeof b, "%.*smerges.txt", (int)dir, path);
        if (!file_exists(b)) return rf_fail(RF_ERR_NOT_FOUND, "%s: no merges.txt beside it", path);
        return load_gpt2_files(path, b, out);
    }
    char *text;
    size_t len;
    int rc = rf_read_file(path, MAX_FILE, &text, &len);
    if (rc) return rc;
    rc = rf_tokenizer_from_json(text, len, out);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", rf_errmsg());
        rf_fail(rc, "%s: %s", path, msg);
    }
    free(text);
    return rc;
}
