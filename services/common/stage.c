#include "common/stage.h"

#include <stdlib.h>
#include <string.h>

/* Filled by constructors before main(); read-only afterwards. */
#define MAX_STAGES 16
static const rf_stage_ops *stages[MAX_STAGES];
static size_t nstages;

void rf_stage_register(const rf_stage_ops *ops) {
    if (nstages == MAX_STAGES) abort(); /* a build with more stages than slots is a bug */
    size_t i = nstages++;
    while (i > 0 && stages[i - 1]->order > ops->order) {
        stages[i] = stages[i - 1];
        i--;
    }
    stages[i] = ops;
}

const rf_stage_ops *const *rf_stage_list(size_t *n) {
    *n = nstages;
    return stages;
}

const rf_stage_ops *rf_stage_find(const char *name) {
    for (size_t i = 0; i < nstages; i++)
        if (strcmp(stages[i]->name, name) == 0) return stages[i];
    return NULL;
}
