/* A causal language model loaded for inference: the network (GPT-2 or
 * Llama, trainer/causal_infer.h), its tokenizer, its end-of-sequence ids and
 * its chat template. What `refinery eval --task lm`, `refinery generate` and
 * Evaluator.Generate load.
 *
 * `path` is one of:
 *   - a Hugging Face folder with config.json (model_type "gpt2" or "llama"),
 *     model.safetensors and the tokenizer (tokenizer.json, or vocab.json +
 *     merges.txt); end-of-sequence ids from generation_config.json, else
 *     config.json (an integer or a list); the chat template from
 *     tokenizer_config.json's "chat_template" (a string) or chat_template.jinja;
 *   - a GGUF file of architecture "llama" (trainer/llama_gguf.h), weights
 *     dequantized to fp32, tokenizer, EOS and chat template from its metadata
 *     (trainer/gguf_tokenizer.h, tokenizer.chat_template);
 *   - a folder without config.json holding exactly one *.gguf file.
 * Anything else is an error naming the path (RF_ERR_NOT_FOUND,
 * RF_ERR_UNSUPPORTED, ...).
 *
 * A loaded rf_lm is immutable: threads share it, each running its own
 * rf_infer state (weights are only read). */
#ifndef RF_EVAL_LM_H
#define RF_EVAL_LM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/lru.h"
#include "tokenizer/tokenizer.h"
#include "trainer/causal_infer.h"

#define RF_LM_MAX_EOS 8

typedef struct rf_lm {
    rf_causal_model model; /* owned */
    rf_causal_dims dims;
    rf_tokenizer *tok;
    int32_t eos[RF_LM_MAX_EOS]; /* generation stops at any of these */
    int n_eos;
    char *chat_template; /* NULL: none */
    char *path;          /* what was loaded (the .gguf file for a GGUF folder) */
    const char *arch;    /* "gpt2" or "llama" */
    rf_lru_entry lru;    /* rf_lm_cache's bookkeeping */
} rf_lm;

int rf_lm_load(const char *path, rf_lm **out);
/* The same with a model folder's model on backend be (trainer/backend.h):
 * generation then runs there (causal_infer.c's slot path). A GGUF file
 * (dequantized on load) stays on the CPU whatever be. */
int rf_lm_load_on(const char *path, const rf_backend *be, rf_lm **out);
/* rf_lm_load, then (adapter not NULL) the PEFT LoRA folder `adapter`
 * (adapter_config.json + adapter_model.safetensors, as peft's save_pretrained
 * or the trainer write them) merged into the fp32 weights
 * (trainer/lora.h: rf_lora_merge_peft), so the model computes base plus
 * adapter. An adapter whose targets, rank or shapes do not fit the model, a
 * non-LoRA peft type or a missing file is an error naming the adapter. */
int rf_lm_load_adapter(const char *path, const char *adapter, rf_lm **out);
void rf_lm_free(rf_lm *lm);
bool rf_lm_is_eos(const rf_lm *lm, int32_t id);

/* The last `cap` models used stay loaded (least recently used evicted), as
 * classifier.h's cache: an entry handed out stays valid until released, even
 * if evicted meanwhile; a path that fails to load is not cached. Keys are the
 * paths as given. */
typedef struct rf_lm_cache rf_lm_cache;

int rf_lm_cache_new(int cap, rf_lm_cache **out);
void rf_lm_cache_free(rf_lm_cache *cc);
int rf_lm_cache_get(rf_lm_cache *cc, const char *path, rf_lm **out);
/* The model at path with the PEFT adapter folder `adapter` merged
 * (rf_lm_load_adapter; NULL: none), cached under the pair: the same model with
 * another adapter, or none, is another entry. */
int rf_lm_cache_get_adapter(rf_lm_cache *cc, const char *path, const char *adapter, rf_lm **out);
void rf_lm_cache_release(rf_lm_cache *cc, rf_lm *lm);
int64_t rf_lm_cache_loads(rf_lm_cache *cc);

#endif
