#include "common/stage.h"

#include <string.h>

const rf_stage_ops *rf_stage_find(const rf_stage_table *t, const char *name) {
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->stages[i]->name, name) == 0) return t->stages[i];
    return NULL;
}
