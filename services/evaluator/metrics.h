/* Classification metrics: confusion matrix, accuracy, per-class and macro
 * precision/recall/F1, mean loss; and their JSON report. A class with no
 * predicted (or no true) examples has precision (recall) 0, as scikit-learn
 * reports with zero_division=0. */
#ifndef RF_EVAL_METRICS_H
#define RF_EVAL_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

typedef struct rf_metrics {
    int k;               /* classes */
    uint64_t *confusion; /* [k*k], row = true class, column = predicted */
    uint64_t n;
    double loss_sum;
} rf_metrics;

typedef struct rf_class_scores {
    double precision, recall, f1;
    uint64_t support;
} rf_class_scores;

int rf_metrics_init(rf_metrics *m, int k);
void rf_metrics_free(rf_metrics *m);
/* Adds one example; label and pred must be in [0, k). */
void rf_metrics_add(rf_metrics *m, int label, int pred, double loss);
double rf_metrics_accuracy(const rf_metrics *m);
double rf_metrics_loss(const rf_metrics *m);
rf_class_scores rf_metrics_class(const rf_metrics *m, int c);
/* Unweighted mean over classes of precision, recall, F1. */
rf_class_scores rf_metrics_macro(const rf_metrics *m);
/* {"examples":N,"accuracy":..,"loss":..,"macro":{..},"per_class":[..],"confusion":[[..]]} */
int rf_metrics_to_json(const rf_metrics *m, rf_buf *out);

#endif
