/* The keys of the `tokenizer:` section of a spec (pipeline/stages.h), in an object
 * of their own so that checking a spec links nothing else of the stage. */
#include "pipeline/stages.h"

const char *const rf_tokenizer_keys[] = {
    "tokenizer",  "max_length", "add_special_tokens", "eval_fraction", "seed",    "pack",
    "block_len",  "eos_token",  "batch_size",         "partitions",    "threads", "cache",
    "append_eos", "retries",    "resources",          "chat_template", NULL};
