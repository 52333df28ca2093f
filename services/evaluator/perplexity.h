/* Perplexity of a causal LM on a text, with the strided sliding window of
 * Hugging Face's guide "Perplexity of fixed-length models"
 * (https://huggingface.co/docs/transformers/perplexity), reproduced to its
 * token counting:
 *
 *   for begin in 0, stride, 2 stride, ... < n:
 *       end = min(begin + max_len, n); trg = end - prev_end
 *       window ids[begin..end), labels: its last trg positions (all when
 *       trg >= its length), the rest -100
 *       mean = the model's loss: mean NLL over the labels it counts after the
 *              shift (label k is predicted by position k - 1)
 *       nll_sum += mean * (valid - 1)    valid = labelled positions; the guide
 *       tokens  += valid - 1             subtracts the batch size (1) for the shift
 *       prev_end = end; stop when end == n
 *   nll = nll_sum / tokens, perplexity = exp(nll)
 *
 * Each window starts at position 0 (no position offset), as the guide's
 * model(input_ids) call does. The first window scores valid - 1 tokens and
 * the guide counts them exactly; each later one scores all its trg tokens
 * (its first label is preceded by context) while the guide counts trg - 1 of
 * them: the mean is what the model computes, the weight the guide's, and
 * `tokens` is the guide's n_tokens. `scored` reports the tokens actually
 * scored.
 *
 * Memory: the model's weights, its key/value cache for max_len positions, the
 * per-chunk scratch of causal_infer.h and the LM head over `head_rows` rows at
 * a time ([head_rows, vocab] floats) -- never [max_len, vocab]. */
#ifndef RF_EVAL_PERPLEXITY_H
#define RF_EVAL_PERPLEXITY_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "evaluator/lm.h"

typedef struct rf_ppl_opts {
    int max_len;   /* window; 0: the model's position limit */
    int stride;    /* 0: max_len / 2 (at least 1) */
    int chunk;     /* tokens per forward pass inside a window; 0: 512 */
    int head_rows; /* rows of logits at a time; 0: 64 */
    /* rf_perplexity_run: a PEFT LoRA folder merged into the model
     * (rf_lm_load_adapter); NULL: none */
    const char *adapter;
    /* called after each window (may be NULL) */
    void (*progress)(void *user, int window, int windows);
    void *user;
} rf_ppl_opts;

typedef struct rf_ppl_result {
    double perplexity, nll, nll_sum;
    int64_t tokens;  /* the guide's n_tokens */
    int64_t scored;  /* tokens whose NLL entered a window's mean */
    int64_t seq_len; /* tokens of the text */
    int windows, max_len, stride;
} rf_ppl_result;

/* The windows the loop above runs for n tokens. */
int rf_ppl_windows(int64_t n, int max_len, int stride);

/* Over token ids[0..n) (n >= 2). */
int rf_perplexity_ids(const rf_lm *lm, const int32_t *ids, int64_t n, const rf_ppl_opts *o,
                      rf_ppl_result *r);
/* Over a text: tokenized whole with the model's tokenizer, special tokens
 * added as its post-processor adds them (tokenizer(text) in transformers). */
int rf_perplexity_text(const rf_lm *lm, const char *text, size_t len, const rf_ppl_opts *o,
                       rf_ppl_result *r);

/* `refinery eval --task lm`: loads model_path (lm.h), reads data_path (a
 * UTF-8 text file; CRLF line ends become LF, nothing else changes), computes
 * the perplexity and writes the JSON report (atomically to report_path
 * unless NULL; appended to *json unless NULL):
 *   {"task": "lm", "model", ["adapter" when o->adapter,] "data", "perplexity", "nll", "tokens",
 * "scored", "seq_len", "windows", "max_len", "stride", "nll_sum", "seconds"} */
int rf_perplexity_run(const char *model_path, const char *data_path, const rf_ppl_opts *o,
                      const char *report_path, rf_buf *json);

#endif
