/* Inside the trainer: what train.c shares with parallel.c (the tp/pp mesh
 * loop), so that both visit the same data in the same order, record the same
 * checkpoint identity and write metrics.jsonl the same way. */
#ifndef RF_TR_TRAIN_INT_H
#define RF_TR_TRAIN_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "trainer/checkpoint.h"
#include "trainer/train.h"

/* The checkpoint identity of a run (train.c's run_ident): resolved schedule
 * in a, class weights cw[K] (NULL: unweighted). */
rf_train_ident rf_train_run_ident(const rf_dataset *d, const rf_train_opts *o, const rf_adamw *a,
                                  const float *cw, int K);
/* The loss denominator of sequences idx[0..n): class weights (cw, NULL: 1
 * each), or a causal-LM row's predicted tokens. */
double rf_train_batch_weight(const rf_dataset *d, const size_t *idx, size_t n, const float *cw);
/* <dir>/metrics.jsonl opened for this run (on resume at `step`, later lines
 * dropped). */
FILE *rf_train_open_metrics(const char *dir, bool resumed, uint64_t step);

#endif
