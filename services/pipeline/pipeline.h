/* The embedded runner behind `refinery run SPEC.yaml`: every registered stage
 * whose section appears in the spec runs in one process. Streaming stages each
 * get a thread, joined by bounded queues of document batches (backpressure:
 * a slow stage stalls the ones before it instead of growing memory); batch
 * stages run afterwards in order. The run directory receives each stage's
 * outputs, stats.json and run.log. */
#ifndef RF_PIPELINE_H
#define RF_PIPELINE_H

#include <stdbool.h>
#include <stdio.h>

#include "comm/comm.h"
#include "common/config.h"
#include "common/stage.h"

typedef struct rf_pipeline_opts {
    const char *spec_path;
    const char *out_dir;          /* overrides run.out; NULL for the default runs/<name> */
    FILE *progress;               /* live progress line (a terminal), or NULL */
    volatile int *cancel;         /* set non-zero to stop (SIGINT/SIGTERM) */
    const rf_stage_table *stages; /* NULL: the five stages (pipeline/stages.h) */
    bool no_cache;                /* --no-cache: neither reuse nor store (run.cache: false) */
    double progress_every;        /* without progress: a log line a running stage every so
                                     many seconds (0: none) */
} rf_pipeline_opts;

/* Runs the pipeline. On return *run_dir (malloc'd, caller frees) names the run
 * directory if one was created. Returns 0 or a negative rf_err with rf_errmsg(). */
int rf_pipeline_run(const rf_pipeline_opts *opts, char **run_dir);

/* The same for one rank of a data-parallel group (comm NULL or of world size
 * 1: rf_pipeline_run). Rank 0 runs every stage; the data stages (those before
 * the trainer) run on rank 0 only: the other ranks wait for its word, which
 * carries the run directory (a broadcast, bounded by the group's timeout:
 * REFINERY_COMM_TIMEOUT must cover the data stages), then every rank runs the
 * trainer stage with the group, and only rank 0 runs what follows it (export,
 * evaluator) and writes stats.json and run.log. The caller owns the group; the
 * spec must have a trainer: section. */
int rf_pipeline_run_group(const rf_pipeline_opts *opts, rf_comm *comm, char **run_dir);

/* The shape checks rf_pipeline_run makes before opening anything: every
 * top-level key is `run` or a stage of `stages` (NULL: the five stages'
 * schema, pipeline/stages.h), the run: settings are
 * known and in range, each stage section is a mapping of that stage's keys, and there is at least
 * one stage section. Errors name the key and line. (The Control service checks submitted specs with
 * it.) */
int rf_pipeline_check_spec(const rf_cfg *spec, const rf_stage_table *stages);

#endif
