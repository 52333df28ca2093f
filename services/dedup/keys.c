/* The keys of the `dedup:` section of a spec (pipeline/stages.h), in an object
 * of their own so that checking a spec links nothing else of the stage. */
#include "pipeline/stages.h"

const char *const rf_dedup_keys[] = {"ngram",   "char_ngrams", "bands",     "rows",    "threshold",
                                     "verify",  "set_cap",     "normalize", "threads", "cache",
                                     "retries", "resources",   NULL};
