/* The keys of the `evaluator:` section of a spec (pipeline/stages.h), in an object
 * of their own so that checking a spec links nothing else of the stage. */
#include "pipeline/stages.h"

const char *const rf_evaluator_keys[] = {"model",       "data",    "max_len",   "batch_size",
                                         "predictions", "samples", "cache",     "retries",
                                         "resources",   "answers", "documents", NULL};
