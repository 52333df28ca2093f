/* The trainer stage's facts for the stage cache (pipeline/stages.h); the
 * defaults are spec.c's. Its threads stay in the key: the sums of a step are
 * split by thread. */
#include "pipeline/stages.h"

static const char *const defaults[] = {"max_len",
                                       "128",
                                       "eval_batch_size",
                                       "64",
                                       "epochs",
                                       "1",
                                       "max_steps",
                                       "0",
                                       "batch_size",
                                       "32",
                                       "grad_accum",
                                       "1",
                                       "seed",
                                       "42",
                                       "stop_after",
                                       "0",
                                       "warmup_steps",
                                       "-1",
                                       "lr",
                                       "5e-5",
                                       "weight_decay",
                                       "0",
                                       "warmup_ratio",
                                       "0",
                                       "clip_norm",
                                       "1",
                                       "beta1",
                                       "0.9",
                                       "beta2",
                                       "0.999",
                                       "eps",
                                       "1e-8",
                                       "dropout",
                                       "true",
                                       "shuffle",
                                       "true",
                                       "resume",
                                       "true",
                                       NULL};
static const char *const ignore[] = {"log_every", "checkpoint_every", NULL};
static const char *const outputs[] = {"trainer", "model", NULL};
static const char *const output_keys[] = {"output", "export", NULL};

const rf_stage_cache rf_trainer_cache = {.version = 1,
                                         .defaults = defaults,
                                         .ignore = ignore,
                                         .outputs = outputs,
                                         .output_keys = output_keys,
                                         .progress_file = "trainer/metrics.jsonl",
                                         .progress_field = "step",
                                         .total_key = "max_steps",
                                         .unit = "steps"};
