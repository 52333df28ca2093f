#include "pipeline/stages.h"

#include <string.h>

static const rf_stage_ops *const all[] = {&rf_ingest_stage, &rf_dedup_stage, &rf_tokenizer_stage,
                                          &rf_trainer_stage, &rf_evaluator_stage};
static const rf_stage_table table = {all, sizeof all / sizeof all[0]};

const rf_stage_table *rf_pipeline_stages(void) {
    return &table;
}

const rf_stage_cache *rf_pipeline_stage_cache(const char *name) {
    static const struct {
        const char *name;
        const rf_stage_cache *c;
    } map[] = {{"ingest", &rf_ingest_cache},
               {"dedup", &rf_dedup_cache},
               {"tokenizer", &rf_tokenizer_cache},
               {"trainer", &rf_trainer_cache},
               {"evaluator", &rf_evaluator_cache}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].name, name)) return map[i].c;
    return NULL;
}
