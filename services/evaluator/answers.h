/* Generated-answer accuracy of a chat model on held-out SFT conversations:
 * the SFT result ("does the model now answer the question?"), measured the
 * same way before and after fine-tuning.
 *
 * The data is what the tokenizer stage writes for conversations: token
 * shards PREFIX.{bin,idx} with the loss mask PREFIX.mask beside them
 * (tokenizer/chat.h; 1 = the token is an assistant answer's). Per
 * conversation: the PROMPT is its tokens before the first mask-1 token (the
 * rendering up to "<|im_start|>assistant\n"); the REFERENCE is the mask-1
 * tokens from there up to the first end id of the model (its "<|im_end|>")
 * or mask-0 token. The model continues the prompt greedily (generate.h) for
 * at most len(reference) + 4 tokens, stopping at an end id; the answer is
 * correct when its text and the reference's, each with surrounding white
 * space removed and ASCII letters lowered, are equal. */
#ifndef RF_EVAL_ANSWERS_H
#define RF_EVAL_ANSWERS_H

#include <stddef.h>

#include "common/buf.h"
#include "evaluator/lm.h"

typedef struct rf_answers {
    size_t n;       /* conversations scored */
    size_t correct; /* exact answers */
    size_t skipped; /* without a prompt or a reference */
    double accuracy, seconds;
} rf_answers;

/* Scores the first max_n conversations (0: all) of PREFIX. Appends
 * {"accuracy","n","correct","skipped","seconds","answers":{text: count, ...
 * the 8 most frequent},"examples":[{"reference","answer"} x 3]} to json.
 * No PREFIX.mask is RF_ERR_NOT_FOUND; one of another size RF_ERR_CORRUPT. */
int rf_lm_answers(const rf_lm *lm, const char *prefix, int max_n, rf_buf *json, rf_answers *out);

#endif
