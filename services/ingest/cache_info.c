/* The ingest stage's facts for the stage cache (pipeline/stages.h). */
#include "pipeline/stages.h"

static const char *const defaults[] = {"format", "auto", "header", "true", "text_join", "\n", NULL};
static const char *const ignore[] = {"threads", "batch_docs", NULL};
static const char *const outputs[] = {"ingest", NULL};

const rf_stage_cache rf_ingest_cache = {
    .version = 1, .defaults = defaults, .ignore = ignore, .outputs = outputs};
