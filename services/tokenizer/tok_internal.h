/* Internals shared by the tokenizer's source files (not a public API). */
#ifndef RF_TOKENIZER_TOK_INTERNAL_H
#define RF_TOKENIZER_TOK_INTERNAL_H

#include "tokenizer/strmap.h"
#include "tokenizer/tokenizer.h"

/* A growable uint32 array owned by whoever embeds it. */
typedef struct rf_u32vec {
    uint32_t *v;
    size_t n, cap;
} rf_u32vec;

int rf_u32vec_reserve(rf_u32vec *a, size_t extra);
static inline int rf_u32vec_push(rf_u32vec *a, uint32_t x) {
    if (a->n == a->cap) {
        int rc = rf_u32vec_reserve(a, 1);
        if (rc) return rc;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct rf_tok_added {
    char *content;
    size_t len;
    uint32_t id;
    bool special;
} rf_tok_added;

/* One piece of a TemplateProcessing template: a special token's ids, or the
 * sequence A (seq 0) / B (seq 1). */
typedef struct rf_tok_piece {
    int seq; /* -1 for a special token */
    uint32_t type_id;
    uint32_t *ids;
    size_t n_ids;
} rf_tok_piece;

typedef struct rf_tok_template {
    rf_tok_piece *pieces;
    size_t n;
} rf_tok_template;

#define RF_BPE_NO_BYTE UINT32_MAX

/* BPE merge table: (left id, right id) -> (rank, merged id), open addressing. */
typedef struct rf_merge_slot {
    uint64_t key; /* left << 32 | right; UINT64_MAX marks an empty slot */
    uint32_t rank;
    uint32_t id;
} rf_merge_slot;

typedef enum rf_tok_decoder { RF_DEC_NONE, RF_DEC_WORDPIECE, RF_DEC_BYTELEVEL } rf_tok_decoder;

struct rf_tokenizer {
    rf_tok_kind kind;
    /* vocabulary: model tokens and added tokens */
    rf_strmap vocab;
    char **id_tok; /* id -> token (NULL for holes), strings owned here */
    uint32_t *id_len;
    uint8_t *id_special;
    uint32_t vocab_size; /* one more than the largest id */
    uint32_t id_cap;     /* allocated length of the id arrays */

    /* BertNormalizer (has_normalizer false = none) */
    bool has_normalizer, clean_text, handle_chinese, strip_accents, lowercase;

    /* WordPiece */
    rf_strmap cont; /* continuation tokens keyed without their prefix */
    char *cont_prefix;
    uint32_t unk_id;
    bool has_unk;
    uint32_t max_chars_per_word;

    /* byte-level BPE */
    bool add_prefix_space;
    /* A byte whose one-byte token is missing gets byte_id RF_BPE_NO_BYTE and is
     * dropped from words, as HF's BPE without unk/byte_fallback drops it. Only
     * the array constructor allows this; the file loaders refuse such a
     * vocabulary. */
    bool allow_missing_bytes;
    rf_merge_slot *merges;
    size_t merges_mask, merges_count;
    uint32_t byte_id[256];    /* id of the one-byte token of each byte */
    uint16_t byte_char[256];  /* GPT-2 bytes_to_unicode */
    int16_t char_byte[324];   /* inverse (code points < 324), -1 if none */
    uint8_t ascii_class[128]; /* GPT-2 regex class of each ASCII byte (bpe.c) */

    /* added tokens, matched leftmost-longest before normalization */
    rf_tok_added *added;
    size_t n_added;
    uint8_t added_first[256]; /* 1 if some added token starts with this byte */

    /* post-processor */
    bool has_template;
    rf_tok_template single, pair;

    /* truncation (max 0 = off) and padding */
    size_t trunc_max;
    rf_tok_trunc_strategy trunc_strategy;
    rf_tok_side trunc_side;
    bool pad;
    size_t pad_len, pad_multiple;
    uint32_t pad_id, pad_type_id;
    rf_tok_side pad_side;

    rf_tok_decoder decoder;
    char *dec_prefix;
    bool dec_cleanup;
};

/* The BPE word cache of one thread: piece bytes -> ids. 16 bytes a slot so
 * the table stays small enough for the CPU caches. */
typedef struct rf_bpe_cache_slot {
    uint32_t tag;     /* high hash bits | 1; 0 marks an empty slot */
    uint32_t key_off; /* in cache_keys */
    uint32_t val_off; /* in cache_ids */
    uint16_t key_len, val_len;
} rf_bpe_cache_slot;

struct rf_tok_state {
    const rf_tokenizer *tok;
    rf_buf repair;
    rf_u32vec cps;  /* normalized code points */
    rf_u32vec offs; /* byte offset of each char of a word */
    rf_buf word;    /* UTF-8 of a word */
    rf_u32vec ids_a, ids_b;
    rf_u32vec sym, rank; /* BPE working arrays (short words) */
    rf_u32vec link;      /* long words: next/prev symbol indices, 2 per byte */
    struct rf_bpe_cand *heap;
    size_t heap_cap;
    rf_bpe_cache_slot *cache;
    size_t cache_mask, cache_count;
    rf_buf cache_keys;
    rf_u32vec cache_ids;
    uint64_t repaired;
};

/* Model encoders: append ids of a segment with no added tokens in it. */
int rf_wordpiece_encode(rf_tok_state *st, const char *text, size_t len, rf_u32vec *out);
int rf_bpe_encode(rf_tok_state *st, const char *text, size_t len, rf_u32vec *out);
void rf_bpe_init_classes(rf_tokenizer *t);

/* Helpers for the loaders. */
int rf_tok_set_token(rf_tokenizer *t, const char *s, size_t len, uint32_t id);
int rf_tok_reserve_merges(rf_tokenizer *t, size_t n);
int rf_tok_add_merge(rf_tokenizer *t, uint32_t left, uint32_t right, uint32_t rank, uint32_t id);
void rf_tok_init_bytelevel(rf_tokenizer *t);
int rf_tok_finish_bpe(rf_tokenizer *t);
int rf_tok_finish_wordpiece(rf_tokenizer *t);
int rf_tok_add_added(rf_tokenizer *t, const char *s, size_t len, uint32_t id, bool special);
int rf_tok_template_add(rf_tok_template *tp, int seq, uint32_t type_id, const uint32_t *ids,
                        size_t n);
int rf_tok_bert_template(rf_tokenizer *t, uint32_t cls, uint32_t sep);
rf_tokenizer *rf_tok_alloc(void);

/* Grows every array of e to hold n tokens (tokenizer.c). */
int rf_tok_encoding_reserve(rf_tok_encoding *e, size_t n);

#endif
