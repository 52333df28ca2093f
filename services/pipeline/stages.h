/* The stages of `refinery run`, in pipeline order: one explicit table instead
 * of self-registration, so that a binary links the stage libraries it names
 * and no others. Each rf_<name>_stage is defined by its library, in
 * services/<name>/stage_<name>.c. */
#ifndef RF_PIPELINE_STAGES_H
#define RF_PIPELINE_STAGES_H

#include "common/stage.h"

extern const rf_stage_ops rf_ingest_stage;    /* order 10: source */
extern const rf_stage_ops rf_dedup_stage;     /* order 20: transform */
extern const rf_stage_ops rf_tokenizer_stage; /* order 30: transform */
extern const rf_stage_ops rf_trainer_stage;   /* order 40: batch */
extern const rf_stage_ops rf_evaluator_stage; /* order 50: batch */

/* The five stages above, in order. */
const rf_stage_table *rf_pipeline_stages(void);

/* The keys of each stage's spec section, NULL-terminated; each in an object
 * of its own (services/<stage>/keys.c, ingest/opts.c, trainer/spec.c). */
extern const char *const rf_ingest_keys[];
extern const char *const rf_dedup_keys[];
extern const char *const rf_tokenizer_keys[];
extern const char *const rf_trainer_spec_keys[];
extern const char *const rf_evaluator_keys[];

/* What the stage cache (pipeline/cache.h) knows of a stage, one per stage in
 * services/<stage>/cache_info.c, next to its keys. */
typedef struct rf_stage_cache {
    /* The version of the stage's code and on-disk format: bump it when a change
     * of the code changes what the stage writes, so older entries stop matching. */
    unsigned version;
    const char *const *defaults;    /* "key", "value", ...: applied before hashing */
    const char *const *ignore;      /* keys that never change the outputs (threads) */
    const char *const *outputs;     /* what the stage writes in the run directory */
    const char *const *output_keys; /* set, outputs leave the run directory: not cached */
    /* A batch stage's progress for the progress bars: the last line of the
     * JSON Lines file progress_file (in the run directory) has progress_field,
     * and the section's total_key (when set above 0) is the total. */
    const char *progress_file, *progress_field, *total_key, *unit;
} rf_stage_cache;

extern const rf_stage_cache rf_ingest_cache;
extern const rf_stage_cache rf_dedup_cache;
extern const rf_stage_cache rf_tokenizer_cache;
extern const rf_stage_cache rf_trainer_cache;
extern const rf_stage_cache rf_evaluator_cache;

/* The cache facts of the five stages by name; NULL for any other stage (the
 * cache then uses version 0, no defaults, and the output <run_dir>/<name>). */
const rf_stage_cache *rf_pipeline_stage_cache(const char *name);

/* The same stages with only name, order and keys set: what checking a spec
 * needs (rf_pipeline_check_spec's default), linking none of their code. */
const rf_stage_table *rf_pipeline_schema(void);

#endif
