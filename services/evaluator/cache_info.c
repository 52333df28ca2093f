/* The evaluator stage's facts for the stage cache (pipeline/stages.h); the
 * defaults are stage_evaluator.c's. */
#include "pipeline/stages.h"

static const char *const defaults[] = {"max_len", "128", "batch_size", "64", NULL};
static const char *const outputs[] = {"evaluator", NULL};
static const char *const output_keys[] = {"predictions", NULL};

const rf_stage_cache rf_evaluator_cache = {
    .version = 1, .outputs = outputs, .defaults = defaults, .output_keys = output_keys};
