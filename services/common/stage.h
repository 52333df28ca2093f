/* Stages of the embedded pipeline (`refinery run`). Each stage library defines
 * one rf_stage_ops; the pipeline lists them in one table (pipeline/stages.h),
 * in order, and runs the ones whose section appears in the spec.
 *
 * Streaming stages pass document batches through bounded queues:
 *   source    (ingest):           produce() emits batches;
 *   transform (dedup, tokenizer): process() receives batches in stream order
 *                                 and emits zero or more; finish() flushes.
 * Batch stages (trainer, evaluator) run() after the stream has ended, reading
 * what earlier stages wrote into the run directory.
 * emit() takes ownership of the batch; process() owns its input batch (emit it
 * onwards or free it). Return 0 or a negative rf_err (rf_fail for detail). */
#ifndef RF_STAGE_H
#define RF_STAGE_H

#include "common/config.h"
#include "common/doc.h"
#include "common/stats.h"

typedef struct rf_run_ctx {
    const char *run_dir;  /* where stage outputs go */
    const rf_cfg *spec;   /* the whole spec, for cross-stage settings */
    rf_stats *stats;      /* counters, named "<stage>.<counter>" */
    volatile int *cancel; /* set non-zero on SIGINT/SIGTERM */
    int threads;          /* worker threads available to a stage */
} rf_run_ctx;

typedef int (*rf_emit_fn)(void *emit_ctx, rf_doc_batch *batch);

typedef struct rf_stage_ops {
    const char *name;        /* spec section name, e.g. "ingest" */
    int order;               /* 10 ingest, 20 dedup, 30 tokenizer, 40 trainer, 50 evaluator */
    const char *const *keys; /* allowed keys in the section, NULL-terminated */
    int (*open)(const rf_cfg *section, rf_run_ctx *ctx, void **state);
    int (*produce)(void *state, rf_emit_fn emit, void *emit_ctx);
    int (*process)(void *state, rf_doc_batch *in, rf_emit_fn emit, void *emit_ctx);
    int (*finish)(void *state, rf_emit_fn emit, void *emit_ctx);
    int (*run)(void *state);
    void (*close)(void *state);
} rf_stage_ops;

/* A list of stages in pipeline order (ascending `order`). */
typedef struct rf_stage_table {
    const rf_stage_ops *const *stages;
    size_t n;
} rf_stage_table;

/* The stage of t named name, or NULL. */
const rf_stage_ops *rf_stage_find(const rf_stage_table *t, const char *name);

#endif
