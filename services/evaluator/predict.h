/* The one inference path of the evaluator: a batch of dataset sequences,
 * padded by rf_batch_collate, through the model with dropout off, and each
 * row's arg-max label and class probabilities. Used by rf_evaluate (labelled
 * data, metrics) and by rf_classifier (raw texts, Classify). */
#ifndef RF_EVAL_PREDICT_H
#define RF_EVAL_PREDICT_H

#include <stdint.h>

#include "trainer/dataset.h"
#include "trainer/model.h"

/* probs[0..K) = softmax(z) (computed in double with the largest logit
 * subtracted); returns the arg-max, the first of equal logits. */
int rf_softmax_argmax(const float *z, int K, float *probs);

/* Runs m over sequences idx[0..B) of d, padded to the longest into bb (reused
 * across calls). pred[b] gets row b's label and, when not NULL, probs[b*K..]
 * its probabilities and loss[b] its cross-entropy against d's label (which
 * must then be in [0, K); the labels are also handed to the forward pass). */
int rf_predict_batch(rf_bert *m, const rf_dataset *d, const size_t *idx, int B, rf_batch_buf *bb,
                     int32_t *pred, float *probs, float *loss);

#endif
