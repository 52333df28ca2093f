/* The stages' names, order and keys, without their code (pipeline/stages.h):
 * each key list lives in a small object of its stage library, so that a
 * binary checking specs links none of the stages' work. */
#include "pipeline/stages.h"

static const rf_stage_ops ingest = {.name = "ingest", .order = 10, .keys = rf_ingest_keys};
static const rf_stage_ops dedup = {.name = "dedup", .order = 20, .keys = rf_dedup_keys};
static const rf_stage_ops tokenizer = {.name = "tokenizer", .order = 30, .keys = rf_tokenizer_keys};
static const rf_stage_ops trainer = {.name = "trainer", .order = 40, .keys = rf_trainer_spec_keys};
static const rf_stage_ops evaluator = {.name = "evaluator", .order = 50, .keys = rf_evaluator_keys};

static const rf_stage_ops *const all[] = {&ingest, &dedup, &tokenizer, &trainer, &evaluator};
static const rf_stage_table table = {all, sizeof all / sizeof all[0]};

const rf_stage_table *rf_pipeline_schema(void) {
    return &table;
}
