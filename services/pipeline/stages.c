#include "pipeline/stages.h"

static const rf_stage_ops *const all[] = {&rf_ingest_stage, &rf_dedup_stage, &rf_tokenizer_stage,
                                          &rf_trainer_stage, &rf_evaluator_stage};
static const rf_stage_table table = {all, sizeof all / sizeof all[0]};

const rf_stage_table *rf_pipeline_stages(void) {
    return &table;
}
