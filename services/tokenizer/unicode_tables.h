/* Character classes exactly as Hugging Face `tokenizers` applies them (see
 * scripts/parity/tokenizer_unicode_tables.py for why they are measured, not
 * taken from a Unicode database). rf_tok_cp_class() is a table lookup. */
#ifndef RF_TOKENIZER_UNICODE_TABLES_H
#define RF_TOKENIZER_UNICODE_TABLES_H

#include <stddef.h>
#include <stdint.h>

enum {
    RF_CP_REMOVE = 1 << 0,   /* BertNormalizer clean_text drops it (controls, \0, U+FFFD) */
    RF_CP_CLEAN_WS = 1 << 1, /* clean_text turns it into ' ' */
    RF_CP_WS = 1 << 2,       /* BertPreTokenizer splits on it (Rust char::is_whitespace) */
    RF_CP_PUNCT = 1 << 3,    /* BertPreTokenizer isolates it */
    RF_CP_MN = 1 << 4,       /* strip_accents drops it after NFD (nonspacing mark) */
    RF_CP_CJK = 1 << 5,      /* handle_chinese_chars pads it with spaces */
    RF_CP_L = 1 << 6,        /* \p{L} in the GPT-2 regex */
    RF_CP_N = 1 << 7,        /* \p{N} */
    RF_CP_S = 1 << 8,        /* \s */
    RF_CP_HAS_LOWER = 1 << 9 /* lowercasing changes it */
};

typedef struct rf_cp_range {
    uint32_t lo, hi;
} rf_cp_range;
typedef struct rf_cp_class_table {
    uint16_t flag;
    const rf_cp_range *ranges;
    size_t n;
} rf_cp_class_table;
typedef struct rf_cp_map {
    uint32_t cp, to;
} rf_cp_map;
typedef struct rf_cp_multi {
    uint32_t cp;
    uint32_t n;
    uint32_t to[3];
} rf_cp_multi;

extern const rf_cp_class_table rf_tok_class_tables[];
extern const size_t rf_tok_class_table_count;
extern const rf_cp_map rf_tok_lower_single[]; /* sorted by cp */
extern const size_t rf_tok_lower_single_count;
extern const rf_cp_multi rf_tok_lower_multi[];
extern const size_t rf_tok_lower_multi_count;

/* Flags of every code point, built once (thread-safe) on first use. */
extern const uint16_t *rf_tok_cp_flags;
void rf_tok_unicode_init(void);

static inline uint16_t rf_tok_cp_class(uint32_t cp) {
    return cp < 0x110000 ? rf_tok_cp_flags[cp] : 0;
}

/* Lowercase of cp as HF does it (Rust char::to_lowercase): writes 1..3 code
 * points to out and returns the count. */
int rf_tok_lower(uint32_t cp, uint32_t out[3]);

#endif
