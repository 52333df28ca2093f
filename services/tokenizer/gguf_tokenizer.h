/* The tokenizer a GGUF file carries in its metadata, as a Refinery tokenizer
 * (services/tokenizer) giving the ids of transformers'
 * AutoTokenizer.from_pretrained(dir, gguf_file=...).
 *
 * Supported: tokenizer.ggml.model "gpt2" (byte-level BPE) with a pre-tokenizer
 * (tokenizer.ggml.pre) that transformers splits with the GPT-2 regex: absent,
 * "default", "gpt-2" or "smollm" (SmolLM2; llama.cpp also splits digits one by
 * one there, transformers does not -- we follow transformers, and SmolLM2's
 * merges hold no digit, so both give the same ids on digits). Other models
 * (sentencepiece "llama", ...) and pre-tokenizers with their own regex
 * (llama3, qwen2, ...) are RF_ERR_UNSUPPORTED, named in the message; so is
 * tokenizer.ggml.add_bos_token / add_eos_token set to true. */
#ifndef RF_TOK_GGUF_TOKENIZER_H
#define RF_TOK_GGUF_TOKENIZER_H

#include <stdint.h>

#include "tokenizer/tokenizer.h"
#include "common/gguf.h"

/* Special token ids from the metadata; -1 where the key is absent. */
typedef struct rf_gguf_tok_ids {
    int64_t bos, eos, unk, pad;
} rf_gguf_tok_ids;

/* Builds the tokenizer; ids may be NULL. The tokenizer owns copies of all it
 * needs: f may be freed afterwards. */
int rf_gguf_tokenizer(const rf_gguf_file *f, rf_tokenizer **out, rf_gguf_tok_ids *ids);

#endif
