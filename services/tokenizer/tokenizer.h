/* Hugging Face-compatible tokenizers: BERT WordPiece and GPT-2 byte-level BPE,
 * loaded from tokenizer.json (or the older vocab.txt / vocab.json+merges.txt
 * layouts), giving bit-exact the ids of `tokenizers`' Tokenizer.encode().
 *
 * A loaded rf_tokenizer is immutable and may be shared by threads; each thread
 * encodes through its own rf_tok_state (scratch buffers and the BPE word cache),
 * so encoding allocates nothing per token once the buffers have grown.
 *
 * Invalid UTF-8: input is expected to be valid (the ingest stage repairs it).
 * If it is not, each maximal invalid subpart is replaced by U+FFFD before
 * encoding -- what Python's bytes.decode("utf-8", "replace") hands to HF -- and
 * the state counts the repaired inputs (rf_tok_state_repaired). */
#ifndef RF_TOKENIZER_TOKENIZER_H
#define RF_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

typedef struct rf_tokenizer rf_tokenizer;
typedef struct rf_tok_state rf_tok_state;

typedef enum rf_tok_kind { RF_TOK_WORDPIECE = 1, RF_TOK_BPE = 2 } rf_tok_kind;
typedef enum rf_tok_trunc_strategy {
    RF_TRUNC_LONGEST_FIRST,
    RF_TRUNC_ONLY_FIRST,
    RF_TRUNC_ONLY_SECOND
} rf_tok_trunc_strategy;
typedef enum rf_tok_side { RF_SIDE_RIGHT, RF_SIDE_LEFT } rf_tok_side;

/* Loads a tokenizer from:
 *   - a tokenizer.json file (any file whose content is a JSON object);
 *   - a vocab.txt (one WordPiece token per line): BERT uncased defaults, as
 *     transformers' BertTokenizerFast builds them;
 *   - a vocab.json with merges.txt beside it: GPT-2 byte-level BPE, as
 *     transformers' GPT2TokenizerFast builds it (<|endoftext|> special);
 *   - a GGUF model file (*.gguf): the tokenizer its metadata carries
 *     (gguf_tokenizer.h);
 *   - a directory holding tokenizer.json, or vocab.json+merges.txt, or vocab.txt.
 * Unsupported components (another normalizer, model or pre-tokenizer type) fail
 * with RF_ERR_UNSUPPORTED naming the component. */
int rf_tokenizer_load(const char *path, rf_tokenizer **out);
/* Parses tokenizer.json text. */
int rf_tokenizer_from_json(const char *text, size_t len, rf_tokenizer **out);
void rf_tokenizer_free(rf_tokenizer *tok);

/* A byte-level BPE tokenizer from arrays, as a GGUF file's metadata stores a
 * "gpt2" tokenizer (tokenizer.ggml.tokens, .merges, .token_type), configured
 * as transformers builds it from such a file: GPT-2 regex ByteLevel
 * pre-tokenizer without prefix space, ByteLevel decoder, no BOS/EOS added.
 * Token i has id i; a token not spelled in GPT-2's byte alphabet is respelled
 * byte by byte. Merges are "left right" strings, best first. token_types may be
 * NULL; type 3 (control) makes the token a special added token, type 4
 * (user-defined) a plain added token. Nothing is borrowed after return. */
typedef struct rf_tok_bpe_arrays {
    size_t n_tokens;
    const char *const *tokens;
    const size_t *token_lens;
    const int32_t *token_types;
    size_t n_merges;
    const char *const *merges;
    const size_t *merge_lens;
} rf_tok_bpe_arrays;
int rf_tokenizer_from_bpe_arrays(const rf_tok_bpe_arrays *a, rf_tokenizer **out);

rf_tok_kind rf_tokenizer_kind(const rf_tokenizer *tok);
/* One more than the largest id (model vocabulary and added tokens). */
uint32_t rf_tokenizer_vocab_size(const rf_tokenizer *tok);
/* Id of a token string (model vocabulary or added token), or -1. */
int64_t rf_tokenizer_token_to_id(const rf_tokenizer *tok, const char *token);
/* Token string of an id (NULL if none); *len receives its length. */
const char *rf_tokenizer_id_to_token(const rf_tokenizer *tok, uint32_t id, size_t *len);
bool rf_tokenizer_is_special(const rf_tokenizer *tok, uint32_t id);

/* Truncation and padding as in tokenizer.json (loaded from it; these setters
 * override). max_length 0 disables truncation. */
void rf_tokenizer_set_truncation(rf_tokenizer *tok, size_t max_length,
                                 rf_tok_trunc_strategy strategy, rf_tok_side side);
/* The truncation max_length (0: none) and side in effect. */
size_t rf_tokenizer_truncation(const rf_tokenizer *tok, rf_tok_side *side);
/* length 0 = pad to the longest of a batch ("BatchLongest"); enabled=false
 * disables padding. */
void rf_tokenizer_set_padding(rf_tokenizer *tok, bool enabled, size_t length, uint32_t pad_id,
                              uint32_t pad_type_id, size_t multiple_of, rf_tok_side side);

/* An encoded sequence. The caller owns it (zero-initialize, reuse across calls,
 * rf_tok_encoding_free at the end). */
typedef struct rf_tok_encoding {
    uint32_t *ids;
    uint32_t *type_ids;
    uint8_t *attention_mask;
    uint8_t *special_mask; /* 1 for tokens added by the post-processor or padding */
    size_t len;
    size_t cap;
} rf_tok_encoding;

void rf_tok_encoding_free(rf_tok_encoding *e);

rf_tok_state *rf_tok_state_new(const rf_tokenizer *tok);
void rf_tok_state_free(rf_tok_state *st);
uint64_t rf_tok_state_repaired(const rf_tok_state *st);

/* Tokenizer.encode(text, add_special_tokens=add_special): added tokens split
 * out, normalization, pre-tokenization, model, truncation, post-processor
 * template, padding (a fixed length only: BatchLongest needs a batch). */
int rf_tok_encode(rf_tok_state *st, const char *text, size_t len, bool add_special,
                  rf_tok_encoding *out);
/* Tokenizer.encode(a, b): a pair, with token_type_ids from the template. */
int rf_tok_encode_pair(rf_tok_state *st, const char *a, size_t alen, const char *b, size_t blen,
                       bool add_special, rf_tok_encoding *out);
/* Pads e to length (no-op when e is already as long) per the padding settings. */
int rf_tok_pad(const rf_tokenizer *tok, rf_tok_encoding *e, size_t length);

/* Tokenizer.decode(ids, skip_special_tokens): appends text to out. Ids with no
 * token are skipped, as HF does. */
int rf_tok_decode(const rf_tokenizer *tok, const uint32_t *ids, size_t n, bool skip_special,
                  rf_buf *out);

#endif
