/* Scores a sequence classifier on a labelled dataset (dropout off), and the
 * evaluator driver shared by `refinery eval`, `refinery train` (trainer.eval)
 * and the evaluator stage of `refinery run`. */
#ifndef RF_EVAL_EVALUATE_H
#define RF_EVAL_EVALUATE_H

#include "common/buf.h"
#include "evaluator/metrics.h"
#include "trainer/dataset.h"
#include "trainer/model.h"

/* Receives every evaluated sequence i of the dataset d, in order: its gold
 * label, the predicted one and the K class probabilities. Non-zero stops the
 * evaluation with that error. */
typedef struct rf_eval_sink {
    int (*example)(void *user, const rf_dataset *d, size_t i, int gold, int pred,
                   const float *probs, int K);
    void *user;
} rf_eval_sink;

/* Runs m over every labelled sequence of d in batches of batch_size and fills
 * metrics (initialised here with m's label count; the caller frees it).
 * Sequences with a label outside the model's classes are an error. */
int rf_evaluate(rf_bert *m, const rf_dataset *d, int batch_size, rf_metrics *out);
/* The same, handing each sequence to sink (may be NULL). */
int rf_evaluate_ex(rf_bert *m, const rf_dataset *d, int batch_size, const rf_eval_sink *sink,
                   rf_metrics *out);

/* Fills d with the data to evaluate, its sequences truncated to max_len (the
 * caller's, capped at the model's max_position_embeddings). */
typedef int (*rf_eval_load_fn)(void *user, int max_len, rf_dataset *d);

/* The evaluator driver, shared by rf_evaluate_run (files) and the evaluator
 * service (its intake of tokens.eval): loads model_dir (dropout off), has
 * load fill d, and evaluates d's labelled sequences into mt (initialised with
 * the model's classes, mt->n = 0 when d has none; the caller frees d and mt,
 * also on error). Errors name the model folder, or are load's own. */
int rf_evaluate_model(const char *model_dir, int max_len, int batch_size, rf_eval_load_fn load,
                      void *user, const rf_eval_sink *sink, rf_dataset *d, rf_metrics *mt);

typedef struct rf_eval_opts {
    const char *model_dir;        /* Hugging Face folder (config, weights, tokenizer) */
    const char *data;             /* shard prefix/directory, JSONL or TSV (rf_dataset_load) */
    int max_len;                  /* capped at the model's max_position_embeddings */
    int batch_size;               /* sequences per forward pass */
    const char *report_path;      /* JSON report written atomically there, unless NULL */
    const char *predictions_path; /* one JSON line per example (predictions.h), unless NULL */
    const char *device;           /* backend (rf_backend_for): NULL or "cpu", "cuda" */
    int samples; /* a causal LM: sample generations in the report (lm_loss.h); 0: none */
    /* SFT data (data with a .mask, answers.h): the generated-answer accuracy of
     * the first `answers` conversations (0: none) as "answers", and of `base`
     * (the model before fine-tuning; NULL: none) as "answers_before". A
     * model_dir holding a PEFT adapter (adapter_config.json) is scored over
     * base (else its base_model_name_or_path): the answers on SFT data, else
     * the perplexity of data's documents ("documents", "documents_before":
     * each document its own sequence, windows of max_len as perplexity.h;
     * the first `documents` of them, 0: all). */
    int answers;
    int documents;
    const char *base;
} rf_eval_opts;

/* rf_evaluate_model on the data files of o (no sequence is an error), then
 * writes the report and the predictions (each atomically) where asked; the
 * report is also appended to *json when json is not NULL. */
int rf_evaluate_run(const rf_eval_opts *o, rf_buf *json);

/* rf_evaluate_run without predictions. */
int rf_evaluate_path(const char *model_dir, const char *data, int max_len, int batch_size,
                     const char *report_path, rf_buf *json);

#endif
