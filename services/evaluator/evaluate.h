/* Scores a sequence classifier on a labelled dataset (dropout off). */
#ifndef RF_EVAL_EVALUATE_H
#define RF_EVAL_EVALUATE_H

#include "evaluator/metrics.h"
#include "trainer/dataset.h"
#include "trainer/model.h"

/* Runs m over every labelled sequence of d in batches of batch_size and fills
 * metrics (initialised here with m's label count; the caller frees it).
 * Sequences with a label outside the model's classes are an error. */
int rf_evaluate(rf_bert *m, const rf_dataset *d, int batch_size, rf_metrics *out);

/* Loads the model folder and the data (shards or JSONL), evaluates, and writes
 * the JSON report to report_path (atomically) when not NULL; the report is also
 * returned in *json when json is not NULL. */
int rf_evaluate_path(const char *model_dir, const char *data, int max_len, int batch_size,
                     const char *report_path, rf_buf *json);

#endif
