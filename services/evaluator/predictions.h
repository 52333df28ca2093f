/* Per-example predictions of an evaluation, as JSON Lines, one per evaluated
 * sequence in data order:
 *   {"index":I,"id":"..","text":"..","label":GOLD,"pred":P,"probs":[p0,..]}
 * index  position of the sequence among the loaded data's sequences;
 * id     the document id: JSONL records carry it ("id"; the loader skips a
 *        record without one). Token shards do not keep document ids (their records hold
 *        only start, len, label and the dedup cluster; tokenizer/shard.h), nor
 *        do TSV rows, so their lines have no "id": index identifies them;
 * text   the record's text for JSONL; for shards and TSV the token ids decoded
 *        with the model folder's tokenizer (special tokens dropped; truncated
 *        to max_len like the sequence), omitted when the folder has none;
 * probs  softmax of the logits (rf_softmax_argmax), pred their arg-max.
 * The lines are kept in memory and written atomically by commit. */
#ifndef RF_EVAL_PREDICTIONS_H
#define RF_EVAL_PREDICTIONS_H

#include <stddef.h>

#include "trainer/dataset.h"

typedef struct rf_pred_writer rf_pred_writer;

/* For the dataset that rf_dataset_load makes of data with model_dir's
 * tokenizer (JSONL: the ids and texts are read here). */
int rf_pred_writer_open(const char *path, const char *data, const char *model_dir,
                        rf_pred_writer **out);
/* An rf_eval_sink callback (user = the writer). */
int rf_pred_writer_example(void *user, const rf_dataset *d, size_t i, int gold, int pred,
                           const float *probs, int K);
/* Writes the lines to path (temporary file, fsync, rename). For JSONL, every
 * labelled record must have had its line (else the data changed meanwhile). */
int rf_pred_writer_commit(rf_pred_writer *w);
void rf_pred_writer_free(rf_pred_writer *w);

#endif
