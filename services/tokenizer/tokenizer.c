/* Encoding pipeline: added tokens, model, truncation, template, padding. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/utf8.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode_tables.h"

int rf_u32vec_reserve(rf_u32vec *a, size_t extra) {
    if (a->n + extra <= a->cap) return 0;
    size_t cap = a->cap ? a->cap : 64;
    while (cap < a->n + extra)
        cap *= 2;
    uint32_t *v = realloc(a->v, cap * sizeof *v);
    if (!v) return RF_ERR_NOMEM;
    a->v = v;
    a->cap = cap;
    return 0;
}

rf_tokenizer *rf_tok_alloc(void) {
    rf_tok_unicode_init();
    rf_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    rf_strmap_init(&t->vocab);
    rf_strmap_init(&t->cont);
    t->max_chars_per_word = 100;
    return t;
}

static void free_template(rf_tok_template *tp) {
    for (size_t i = 0; i < tp->n; i++)
        free(tp->pieces[i].ids);
    free(tp->pieces);
    memset(tp, 0, sizeof *tp);
}

void rf_tokenizer_free(rf_tokenizer *t) {
    if (!t) return;
    rf_strmap_free(&t->vocab);
    rf_strmap_free(&t->cont);
    for (uint32_t i = 0; i < t->vocab_size; i++)
        free(t->id_tok[i]);
    free(t->id_tok);
    free(t->id_len);
    free(t->id_special);
    free(t->cont_prefix);
    free(t->merges);
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    free_template(&t->single);
    free_template(&t->pair);
    free(t->dec_prefix);
    free(t);
}

rf_tok_kind rf_tokenizer_kind(const rf_tokenizer *t) {
    return t->kind;
}

uint32_t rf_tokenizer_vocab_size(const rf_tokenizer *t) {
    return t->vocab_size;
}

int64_t rf_tokenizer_token_to_id(const rf_tokenizer *t, const char *token) {
    size_t len = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && memcmp(t->added[i].content, token, len) == 0)
            return t->added[i].id;
    return rf_strmap_get(&t->vocab, token, len);
}

const char *rf_tokenizer_id_to_token(const rf_tokenizer *t, uint32_t id, size_t *len) {
    if (id >= t->vocab_size || !t->id_tok[id]) return NULL;
    if (len) *len = t->id_len[id];
    return t->id_tok[id];
}

bool rf_tokenizer_is_special(const rf_tokenizer *t, uint32_t id) {
    return id < t->vocab_size && t->id_special[id];
}

size_t rf_tokenizer_truncation(const rf_tokenizer *t, rf_tok_side *side) {
    if (side) *side = t->trunc_side;
    return t->trunc_max;
}

void rf_tokenizer_set_truncation(rf_tokenizer *t, size_t max_length, rf_tok_trunc_strategy strategy,
                                 rf_tok_side side) {
    t->trunc_max = max_length;
    t->trunc_strategy = strategy;
    t->trunc_side = side;
}

void rf_tokenizer_set_padding(rf_tokenizer *t, bool enabled, size_t length, uint32_t pad_id,
                              uint32_t pad_type_id, size_t multiple_of, rf_tok_side side) {
    t->pad = enabled;
    t->pad_len = length;
    t->pad_id = pad_id;
    t->pad_type_id = pad_type_id;
    t->pad_multiple = multiple_of;
    t->pad_side = side;
}

rf_tok_state *rf_tok_state_new(const rf_tokenizer *t) {
    rf_tok_state *st = calloc(1, sizeof *st);
    if (st) st->tok = t;
    return st;
}

void rf_tok_state_free(rf_tok_state *st) {
    if (!st) return;
    rf_buf_free(&st->repair);
    rf_buf_free(&st->word);
    rf_buf_free(&st->cache_keys);
    free(st->cps.v);
    free(st->offs.v);
    free(st->ids_a.v);
    free(st->ids_b.v);
    free(st->sym.v);
    free(st->rank.v);
    free(st->link.v);
    free(st->heap);
    free(st->cache);
    free(st->cache_ids.v);
    free(st);
}

uint64_t rf_tok_state_repaired(const rf_tok_state *st) {
    return st->repaired;
}

void rf_tok_encoding_free(rf_tok_encoding *e) {
    free(e->ids);
    free(e->type_ids);
    free(e->attention_mask);
    free(e->special_mask);
    memset(e, 0, sizeof *e);
}

/* Leftmost-longest added token at or after s[from]: returns its index and
 * start through *at, or -1. */
static long find_added(const rf_tokenizer *t, const char *s, size_t n, size_t from, size_t *at) {
    for (size_t i = from; i < n; i++) {
        if (!t->added_first[(unsigned char)s[i]]) continue;
        long best = -1;
        for (size_t k = 0; k < t->n_added; k++) {
            const rf_tok_added *a = &t->added[k];
            if (a->len <= n - i && (best < 0 || a->len > t->added[best].len) &&
                memcmp(s + i, a->content, a->len) == 0)
                best = (long)k;
        }
        if (best >= 0) {
            *at = i;
            return best;
        }
    }
    return -1;
}

static int model_encode(rf_tok_state *st, const char *s, size_t n, rf_u32vec *out) {
    if (n == 0) return 0;
    return st->tok->kind == RF_TOK_BPE ? rf_bpe_encode(st, s, n, out)
                                       : rf_wordpiece_encode(st, s, n, out);
}

/* Model ids of text: added tokens split out first, the rest through the model. */
static int encode_seq(rf_tok_state *st, const char *text, size_t len, rf_u32vec *out) {
    if (!rf_utf8_valid(text, len)) {
        st->repair.len = 0;
        if (rf_utf8_repair(text, len, &st->repair) < 0) return RF_ERR_NOMEM;
        st->repaired++;
        text = st->repair.data;
        len = st->repair.len;
    }
    const rf_tokenizer *t = st->tok;
    size_t pos = 0;
    while (pos < len) {
        size_t at = len;
        long k = t->n_added ? find_added(t, text, len, pos, &at) : -1;
        int rc = model_encode(st, text + pos, (k < 0 ? len : at) - pos, out);
        if (rc) return rc;
        if (k < 0) break;
        if (rf_u32vec_push(out, t->added[k].id)) return RF_ERR_NOMEM;
        pos = at + t->added[k].len;
    }
    return 0;
}

static size_t template_added(const rf_tok_template *tp) {
    size_t n = 0;
    for (size_t i = 0; i < tp->n; i++)
        if (tp->pieces[i].seq < 0) n += tp->pieces[i].n_ids;
    return n;
}

static void truncate_to(rf_u32vec *v, size_t n, rf_tok_side side) {
    if (v->n <= n) return;
    if (side == RF_SIDE_LEFT) memmove(v->v, v->v + (v->n - n), n * sizeof *v->v);
    v->n = n;
}

/* HF's truncate_encodings (without overflow: the removed tokens are dropped). */
static int truncate_seqs(const rf_tokenizer *t, rf_u32vec *a, rf_u32vec *b, size_t added) {
    if (!t->trunc_max) return 0;
    if (t->trunc_max < added)
        return rf_fail(RF_ERR_INVALID, "truncation max_length %zu is below the %zu added tokens",
                       t->trunc_max, added);
    size_t max = t->trunc_max - added;
    size_t total = a->n + (b ? b->n : 0);
    if (total <= max) return 0;
    if (!b || t->trunc_strategy == RF_TRUNC_ONLY_FIRST) {
        if (b && b->n >= max) return rf_fail(RF_ERR_INVALID, "sequence B alone exceeds max_length");
        truncate_to(a, max - (b ? b->n : 0), t->trunc_side);
        return 0;
    }
    if (t->trunc_strategy == RF_TRUNC_ONLY_SECOND) {
        if (a->n >= max) return rf_fail(RF_ERR_INVALID, "sequence A alone exceeds max_length");
        truncate_to(b, max - a->n, t->trunc_side);
        return 0;
    }
    /* LongestFirst: the shorter keeps its length if that leaves it no more
     * than the longer gets; otherwise both get half (the longer the odd one). */
    size_t n1 = a->n, n2 = b->n;
    bool swap = n1 > n2;
    if (swap) n1 = b->n, n2 = a->n;
    if (2 * n1 > max) {
        n1 = max / 2;
        n2 = n1 + max % 2;
    } else {
        n2 = max - n1;
    }
    if (swap) {
        size_t x = n1;
        n1 = n2;
        n2 = x;
    }
    truncate_to(a, n1, t->trunc_side);
    truncate_to(b, n2, t->trunc_side);
    return 0;
}

int rf_tok_encoding_reserve(rf_tok_encoding *e, size_t n) {
    if (n <= e->cap) return 0;
    size_t cap = e->cap ? e->cap : 64;
    while (cap < n)
        cap *= 2;
    uint32_t *ids = realloc(e->ids, cap * sizeof *ids);
    if (ids) e->ids = ids;
    uint32_t *ty = realloc(e->type_ids, cap * sizeof *ty);
    if (ty) e->type_ids = ty;
    uint8_t *am = realloc(e->attention_mask, cap);
    if (am) e->attention_mask = am;
    uint8_t *sm = realloc(e->special_mask, cap);
    if (sm) e->special_mask = sm;
    if (!ids || !ty || !am || !sm) return RF_ERR_NOMEM;
    e->cap = cap;
    return 0;
}

static int enc_append(rf_tok_encoding *e, const uint32_t *ids, size_t n, uint32_t type_id,
                      uint8_t special) {
    if (rf_tok_encoding_reserve(e, e->len + n)) return RF_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        e->ids[e->len] = ids[i];
        e->type_ids[e->len] = type_id;
        e->attention_mask[e->len] = 1;
        e->special_mask[e->len] = special;
        e->len++;
    }
    return 0;
}

int rf_tok_pad(const rf_tokenizer *t, rf_tok_encoding *e, size_t length) {
    if (t->pad_multiple > 0 && length % t->pad_multiple)
        length += t->pad_multiple - length % t->pad_multiple;
    if (e->len >= length) return 0;
    size_t extra = length - e->len;
    if (rf_tok_encoding_reserve(e, length)) return RF_ERR_NOMEM;
    size_t at = e->len;
    if (t->pad_side == RF_SIDE_LEFT) {
        memmove(e->ids + extra, e->ids, e->len * sizeof *e->ids);
        memmove(e->type_ids + extra, e->type_ids, e->len * sizeof *e->type_ids);
        memmove(e->attention_mask + extra, e->attention_mask, e->len);
        memmove(e->special_mask + extra, e->special_mask, e->len);
        at = 0;
    }
    for (size_t i = at; i < at + extra; i++) {
        e->ids[i] = t->pad_id;
        e->type_ids[i] = t->pad_type_id;
        e->attention_mask[i] = 0;
        e->special_mask[i] = 1;
    }
    e->len = length;
    return 0;
}

static int encode_full(rf_tok_state *st, const char *a, size_t alen, const char *b, size_t blen,
                       bool add_special, rf_tok_encoding *out) {
    const rf_tokenizer *t = st->tok;
    st->ids_a.n = st->ids_b.n = 0;
    int rc = encode_seq(st, a, alen, &st->ids_a);
    if (!rc && b) rc = encode_seq(st, b, blen, &st->ids_b);
    if (rc) return rc;
    const rf_tok_template *tp = b ? &t->pair : &t->single;
    bool templ = add_special && t->has_template;
    rc = truncate_seqs(t, &st->ids_a, b ? &st->ids_b : NULL, templ ? template_added(tp) : 0);
    if (rc) return rc;
    out->len = 0;
    if (!templ) {
        rc = enc_append(out, st->ids_a.v, st->ids_a.n, 0, 0);
        if (!rc && b) rc = enc_append(out, st->ids_b.v, st->ids_b.n, 1, 0);
    } else {
        for (size_t i = 0; i < tp->n && !rc; i++) {
            const rf_tok_piece *p = &tp->pieces[i];
            if (p->seq < 0)
                rc = enc_append(out, p->ids, p->n_ids, p->type_id, 1);
            else {
                const rf_u32vec *v = p->seq == 0 ? &st->ids_a : &st->ids_b;
                rc = enc_append(out, v->v, v->n, p->type_id, 0);
            }
        }
    }
    if (rc) return rc;
    if (t->pad && t->pad_len) return rf_tok_pad(t, out, t->pad_len);
    return 0;
}

int rf_tok_encode(rf_tok_state *st, const char *text, size_t len, bool add_special,
                  rf_tok_encoding *out) {
    return encode_full(st, text, len, NULL, 0, add_special, out);
}

int rf_tok_encode_pair(rf_tok_state *st, const char *a, size_t alen, const char *b, size_t blen,
                       bool add_special, rf_tok_encoding *out) {
    return encode_full(st, a, alen, b, blen, add_special, out);
}
