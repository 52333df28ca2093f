/* The dedup stage's facts for the stage cache (pipeline/stages.h); the
 * defaults are rf_dedup_opts_default's. */
#include "pipeline/stages.h"

static const char *const defaults[] = {"ngram",   "5",    "char_ngrams", "false", "bands",  "20",
                                       "rows",    "5",    "threshold",   "0.7",   "verify", "true",
                                       "set_cap", "2048", "normalize",   "all",   NULL};
static const char *const ignore[] = {"threads", NULL};
static const char *const outputs[] = {"dedup", NULL};

const rf_stage_cache rf_dedup_cache = {
    .version = 1, .defaults = defaults, .ignore = ignore, .outputs = outputs};
