/* Text generation with a causal LM (lm.h): the prompt run through the model
 * once (its keys and values cached, trainer/causal_infer.h), then one token
 * at a time, each chosen from the last position's logits:
 *
 *   - greedy (temperature <= 0): the arg-max, the first of equal logits
 *     (torch.argmax), i.e. transformers' generate(do_sample=False);
 *   - sampling (temperature > 0), in the order of transformers' logits
 *     warpers: logits / temperature; top-k keeps the tokens whose logit is
 *     at least the k-th largest (ties at the threshold stay, as
 *     TopKLogitsWarper); top-p keeps, in order of decreasing probability, the
 *     tokens whose preceding cumulative probability is below top_p (so at
 *     least one, as TopPLogitsWarper); then one draw from the softmax of what
 *     is kept with the seeded PRNG of common/rng.h. The same seed gives the
 *     same tokens (not torch's: the generator differs).
 *
 * Generation stops after max_new_tokens, at one of the model's end ids (which
 * is emitted, as transformers returns it), or when the model's positions run
 * out (finish reason "length" in both cases of a limit).
 *
 * Chat: the prompt as one user message through the model's ChatML template
 * with the generation prompt (tokenizer/chat.h rf_chat_render). Other
 * templates are RF_ERR_UNSUPPORTED. The rendered text is
 * tokenized without added special tokens (apply_chat_template's tokenize),
 * its <|im_start|> / <|im_end|> matched as the special tokens they are. */
#ifndef RF_EVAL_GENERATE_H
#define RF_EVAL_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/rng.h"
#include "evaluator/lm.h"
#include "tokenizer/chat.h"

typedef struct rf_sampling {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* <= 0 or >= 1: off */
    uint64_t seed;
} rf_sampling;

/* Checks the settings (RF_ERR_INVALID: NaN, negative top_p, ...). */
int rf_sampling_check(const rf_sampling *s);

/* A sampler's scratch for vocabularies of up to V tokens. */
typedef struct rf_sampler {
    rf_sampling s;
    rf_rng rng;
    int V;
    float *p;     /* [V] */
    int32_t *idx; /* [V] */
} rf_sampler;

int rf_sampler_init(rf_sampler *sm, const rf_sampling *s, int V);
void rf_sampler_free(rf_sampler *sm);
/* The next token from logits[0..V). */
int32_t rf_sampler_next(rf_sampler *sm, const float *logits);

typedef struct rf_gen_opts {
    int max_new_tokens; /* <= 0: 64 */
    rf_sampling sampling;
    bool chat; /* prompt as one user message through the chat template */
} rf_gen_opts;

/* Receives each generated token: its id, the new text it completes
 * (decoded without special tokens; a token that ends inside a UTF-8
 * character gives "" and the character comes with the token that completes
 * it), and on the last token the finish reason ("eos" or "length"; NULL
 * before). Non-zero stops generation with that value. */
typedef int (*rf_gen_token_fn)(void *user, int32_t id, const char *piece, size_t len,
                               const char *finish);

typedef struct rf_gen_result {
    int32_t *prompt_ids; /* malloc'd; the caller frees both */
    int n_prompt;
    int32_t *ids; /* generated, the end token included when reached */
    int n;
    const char *finish; /* "eos", "length" or "stopped" (the callback's) */
} rf_gen_result;

void rf_gen_result_free(rf_gen_result *r);

/* The prompt's ids: tokenized as tokenizer(prompt) does, or through the chat
 * template when chat. */
int rf_gen_prompt_ids(const rf_lm *lm, const char *prompt, bool chat, int32_t **ids, int *n);

/* Generates from prompt ids[0..n) (at least one). cb may be NULL; res may be
 * NULL. */
int rf_generate_ids(const rf_lm *lm, const int32_t *ids, int n, const rf_gen_opts *o,
                    rf_gen_token_fn cb, void *user, rf_gen_result *res);
/* rf_gen_prompt_ids then rf_generate_ids. */
int rf_generate(const rf_lm *lm, const char *prompt, const rf_gen_opts *o, rf_gen_token_fn cb,
                void *user, rf_gen_result *res);

#endif
