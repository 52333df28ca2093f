/* The minimal evaluation of a causal language model (trainer.task:
 * causal_lm): the mean token loss and perplexity on held-out data packed as
 * the trainer packs it (trainer/lm_data.h: rows of max_len, one segment per
 * document, each document's first token not predicted). Non-overlapping
 * rows, no sliding window: `refinery eval --task lm` (the generation work)
 * is the fuller one. */
#ifndef RF_EVAL_LM_LOSS_H
#define RF_EVAL_LM_LOSS_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "trainer/dataset.h"
#include "trainer/model_iface.h"

typedef struct rf_lm_eval {
    double loss;       /* mean over predicted tokens (natural log) */
    double perplexity; /* exp(loss) */
    uint64_t tokens;   /* predicted tokens */
    size_t rows;
} rf_lm_eval;

/* Runs m (a causal LM) over every row of d (rf_lm_data_load's) in batches of
 * batch_size rows. No predicted token is RF_ERR_INVALID. */
int rf_lm_evaluate(rf_model *m, const rf_dataset *d, int batch_size, rf_lm_eval *out);

/* Sample generations for the report: `n` rows spread evenly over d (row
 * i * d->n / n); each row's first document gives the prompt (its first
 * RF_LM_SAMPLE_PROMPT tokens, at most half of the document) and the text's own
 * next RF_LM_SAMPLE_NEW tokens as the reference; the model (lm, evaluator/lm.h)
 * continues the prompt greedily for as many tokens (generate.h). Appends
 * ,"samples":[{"row","prompt","completion","reference","new_tokens","finish"}]
 * to json (nothing when n <= 0 or no row has two tokens). */
#define RF_LM_SAMPLE_PROMPT 24
#define RF_LM_SAMPLE_NEW    32
struct rf_lm;
int rf_lm_samples(const struct rf_lm *lm, const rf_dataset *d, int n, rf_buf *json);

/* Loads model_dir on `device` (rf_backend_for: NULL or "cpu", "cuda", ...)
 * and data (any lm_data.h source, packed at max_len capped at the model's
 * positions), evaluates, and appends the JSON report
 * {"task":"causal_lm","eval_loss",...,"perplexity",...} to json, with
 * `samples` sample generations (rf_lm_samples; 0: none; these run on the CPU,
 * lm.h). */
int rf_lm_evaluate_path(const char *model_dir, const char *device, const char *data, int max_len,
                        int batch_size, int samples, rf_buf *json);

#endif
