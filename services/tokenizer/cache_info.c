/* The tokenizer stage's facts for the stage cache (pipeline/stages.h); the
 * defaults are stage_tokenizer.c's. */
#include "pipeline/stages.h"

static const char *const defaults[] = {"max_length",
                                       "128",
                                       "add_special_tokens",
                                       "true",
                                       "eval_fraction",
                                       "0.1",
                                       "seed",
                                       "0",
                                       "pack",
                                       "false",
                                       "block_len",
                                       "1024",
                                       "eos_token",
                                       "<|endoftext|>",
                                       "append_eos",
                                       "false",
                                       "batch_size",
                                       "32",
                                       "partitions",
                                       "2",
                                       NULL};
static const char *const ignore[] = {"threads", NULL};
static const char *const outputs[] = {"tokenizer", NULL};

const rf_stage_cache rf_tokenizer_cache = {
    .version = 1, .defaults = defaults, .ignore = ignore, .outputs = outputs};
