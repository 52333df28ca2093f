/* The status of an embedded run from its run directory: what `refinery status
 * RUN_DIR` prints for a `refinery run`, as `refinery status RUN` does for a
 * run on the services.
 *
 * It reads only the files the runner leaves (nothing is locked or changed):
 * stats.json, written when the run ends, has each stage's `cached`, `key`,
 * `attempts` (the retries, pipeline/retry.h) and `seconds`, and `run.ok`;
 * run.log has the error of a failed run. A directory with a run.log but no
 * stats.json is a run still going, or one that was killed: `unfinished`. */
#ifndef RF_PIPELINE_RUN_STATUS_H
#define RF_PIPELINE_RUN_STATUS_H

#include <stdbool.h>
#include <stdio.h>

/* Writes the status of the run in dir to out: one JSON line
 *
 *   {"run_dir":D,"state":"succeeded"|"failed"|"unfinished","error":E|null,
 *    "seconds":S|null,"stages":[{"stage":N,"cached":B,"attempts":A,
 *    "seconds":S,"key":K|null}, ...]}
 *
 * (stages in pipeline order, those stats.json records), or with lines a
 * progress-style line: `D failed | ingest cached | trainer 2 attempts 41.2s
 * | ... | error: E`. RF_ERR_NOT_FOUND when dir holds neither stats.json nor
 * run.log (not a run directory), RF_ERR_PARSE for a stats.json that is not
 * JSON; rf_errmsg() says which file. */
int rf_run_dir_status(const char *dir, bool lines, FILE *out);

#endif
