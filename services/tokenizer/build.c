/* Helpers that fill an rf_tokenizer, shared by the loaders. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/hash.h"
#include "tokenizer/tok_internal.h"

#define MAX_ID (1u << 24) /* no real vocabulary comes near; bounds hostile files */

static int ensure_id(rf_tokenizer *t, uint32_t id) {
    if (id >= MAX_ID) return rf_fail(RF_ERR_RANGE, "token id %u is too large", id);
    if (id < t->vocab_size) return 0;
    if (id >= t->id_cap) {
        size_t cap = t->id_cap ? t->id_cap : 1024;
        while (cap <= id)
            cap *= 2;
        char **tok = realloc(t->id_tok, cap * sizeof *tok);
        if (!tok) return RF_ERR_NOMEM;
        t->id_tok = tok;
        uint32_t *len = realloc(t->id_len, cap * sizeof *len);
        if (!len) return RF_ERR_NOMEM;
        t->id_len = len;
        uint8_t *sp = realloc(t->id_special, cap);
        if (!sp) return RF_ERR_NOMEM;
        t->id_special = sp;
        for (size_t i = t->id_cap; i < cap; i++)
            tok[i] = NULL, len[i] = 0, sp[i] = 0;
        t->id_cap = (uint32_t)cap;
    }
    t->vocab_size = id + 1;
    return 0;
}

static int set_id_string(rf_tokenizer *t, const char *s, size_t len, uint32_t id) {
    int rc = ensure_id(t, id);
    if (rc) return rc;
    char *copy = malloc(len + 1);
    if (!copy) return RF_ERR_NOMEM;
    memcpy(copy, s, len);
    copy[len] = 0;
    free(t->id_tok[id]);
    t->id_tok[id] = copy;
    t->id_len[id] = (uint32_t)len;
    return 0;
}

int rf_tok_set_token(rf_tokenizer *t, const char *s, size_t len, uint32_t id) {
    int rc = set_id_string(t, s, len, id);
    if (rc) return rc;
    return rf_strmap_put(&t->vocab, s, len, id);
}

int rf_tok_add_added(rf_tokenizer *t, const char *s, size_t len, uint32_t id, bool special) {
    if (len == 0) return rf_fail(RF_ERR_INVALID, "empty added token");
    rf_tok_added *a = realloc(t->added, (t->n_added + 1) * sizeof *a);
    if (!a) return RF_ERR_NOMEM;
    t->added = a;
    char *copy = malloc(len + 1);
    if (!copy) return RF_ERR_NOMEM;
    memcpy(copy, s, len);
    copy[len] = 0;
    a[t->n_added++] = (rf_tok_added){copy, len, id, special};
    t->added_first[(unsigned char)s[0]] = 1;
    int rc = set_id_string(t, s, len, id);
    if (rc) return rc;
    t->id_special[id] = special;
    return 0;
}

/* Resizes the merge table to hold want entries at most half full. */
static int merges_rehash(rf_tokenizer *t, size_t want) {
    size_t old = t->merges ? t->merges_mask + 1 : 0, cap = 64;
    while (cap < want * 2)
        cap *= 2;
    if (cap <= old) return 0;
    rf_merge_slot *m = malloc(cap * sizeof *m);
    if (!m) return RF_ERR_NOMEM;
    for (size_t i = 0; i < cap; i++)
        m[i].key = UINT64_MAX;
    for (size_t i = 0; i < old; i++) {
        if (t->merges[i].key == UINT64_MAX) continue;
        size_t j = rf_mix64(t->merges[i].key) & (cap - 1);
        while (m[j].key != UINT64_MAX)
            j = (j + 1) & (cap - 1);
        m[j] = t->merges[i];
    }
    free(t->merges);
    t->merges = m;
    t->merges_mask = cap - 1;
    return 0;
}

int rf_tok_reserve_merges(rf_tokenizer *t, size_t n) {
    return merges_rehash(t, n);
}

int rf_tok_add_merge(rf_tokenizer *t, uint32_t left, uint32_t right, uint32_t rank, uint32_t id) {
    int rc = merges_rehash(t, t->merges_count + 1);
    if (rc) return rc;
    uint64_t key = (uint64_t)left << 32 | right;
    size_t j = rf_mix64(key) & t->merges_mask;
    for (; t->merges[j].key != UINT64_MAX; j = (j + 1) & t->merges_mask) {
        if (t->merges[j].key == key) { /* a repeated merge: the later one wins, as in HF */
            t->merges[j].rank = rank;
            t->merges[j].id = id;
            return 0;
        }
    }
    t->merges[j] = (rf_merge_slot){key, rank, id};
    t->merges_count++;
    return 0;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * others to U+0100 upwards in byte order. */
void rf_tok_init_bytelevel(rf_tokenizer *t) {
    uint32_t next = 256;
    for (int i = 0; i < 324; i++)
        t->char_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        t->byte_char[b] = (uint16_t)(keep ? (uint32_t)b : next++);
        t->char_byte[t->byte_char[b]] = (int16_t)b;
    }
}

int rf_tok_finish_bpe(rf_tokenizer *t) {
    t->kind = RF_TOK_BPE;
    rf_tok_init_bytelevel(t);
    rf_bpe_init_classes(t);
    for (int b = 0; b < 256; b++) {
        char u[4];
        uint32_t c = t->byte_char[b];
        size_t n = c < 0x80 ? (u[0] = (char)c, 1)
                            : (u[0] = (char)(0xC0 | c >> 6), u[1] = (char)(0x80 | (c & 0x3F)), 2);
        int64_t id = rf_strmap_get(&t->vocab, u, n);
        if (id < 0 && !t->allow_missing_bytes)
            return rf_fail(RF_ERR_INVALID, "byte-level BPE vocabulary lacks byte 0x%02X", b);
        t->byte_id[b] = id < 0 ? RF_BPE_NO_BYTE : (uint32_t)id;
    }
    if (!t->merges) return rf_tok_reserve_merges(t, 1);
    return 0;
}

int rf_tok_finish_wordpiece(rf_tokenizer *t) {
    t->kind = RF_TOK_WORDPIECE;
    const char *pre = t->cont_prefix ? t->cont_prefix : "##";
    size_t pl = strlen(pre);
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        const char *s = t->id_tok[id];
        if (!s || rf_strmap_get(&t->vocab, s, t->id_len[id]) != (int64_t)id) continue;
        if (t->id_len[id] > pl && memcmp(s, pre, pl) == 0) {
            int rc = rf_strmap_put(&t->cont, s + pl, t->id_len[id] - pl, id);
            if (rc) return rc;
        }
    }
    return 0;
}

int rf_tok_template_add(rf_tok_template *tp, int seq, uint32_t type_id, const uint32_t *ids,
                        size_t n) {
    rf_tok_piece *p = realloc(tp->pieces, (tp->n + 1) * sizeof *p);
    if (!p) return RF_ERR_NOMEM;
    tp->pieces = p;
    uint32_t *copy = NULL;
    if (n) {
        copy = malloc(n * sizeof *copy);
        if (!copy) return RF_ERR_NOMEM;
        memcpy(copy, ids, n * sizeof *copy);
    }
    p[tp->n++] = (rf_tok_piece){seq, type_id, copy, n};
    return 0;
}

/* [CLS] A [SEP] and [CLS] A [SEP] B:1 [SEP]:1, as BertProcessing builds. */
int rf_tok_bert_template(rf_tokenizer *t, uint32_t cls, uint32_t sep) {
    int rc = 0;
    rc = rc ? rc : rf_tok_template_add(&t->single, -1, 0, &cls, 1);
    rc = rc ? rc : rf_tok_template_add(&t->single, 0, 0, NULL, 0);
    rc = rc ? rc : rf_tok_template_add(&t->single, -1, 0, &sep, 1);
    rc = rc ? rc : rf_tok_template_add(&t->pair, -1, 0, &cls, 1);
    rc = rc ? rc : rf_tok_template_add(&t->pair, 0, 0, NULL, 0);
    rc = rc ? rc : rf_tok_template_add(&t->pair, -1, 0, &sep, 1);
    rc = rc ? rc : rf_tok_template_add(&t->pair, 1, 1, NULL, 0);
    rc = rc ? rc : rf_tok_template_add(&t->pair, -1, 1, &sep, 1);
    if (!rc) t->has_template = true;
    return rc;
}
