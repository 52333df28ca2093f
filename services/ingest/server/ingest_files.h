/* refinery.v1.Ingest/Load: the ingest service reads a run's input files
 * itself, exactly once even when it is killed mid-file.
 *
 * Load(run) checks the run (exists, pending or running, not sealed) and its
 * spec's ingest.inputs: each path is taken relative to the service's input
 * root and must resolve (realpath, symlinks followed) to a regular file
 * inside it: an absolute path or one that leads out is INVALID_ARGUMENT, a
 * missing file NOT_FOUND, each naming the path. It then records the run in
 * the `loads` table (with the batch size, fixed from then on), moves it to
 * running and starts a loader thread; the call returns at once.
 *
 * The loader runs the ingest library over the files with the spec's
 * `ingest:` settings, as `refinery run` does (format, mapping, cleaning,
 * filters; text must be UTF-8 or is rejected, as for Push; no augmentation).
 * Internal batch k (numbered 0, 1, 2, ... in input order, the same on every
 * run of the same files and batch size) goes to the clean topic as a
 * DocumentBatch with seq = k (when it kept documents) and its rejects to the
 * rejects topic; once Kafka has them, the batch's counts are recorded in
 * stage_progress (stage "ingest", seq k), in order, a few batches per
 * statement. When every file is in, the run is sealed. An unreadable or
 * corrupt input fails the run with the reason; a Kafka or PostgreSQL failure
 * is retried from the last recorded batch (five times, with backoff), then
 * fails the run. A cancelled run stops its loader within --cancel-poll.
 *
 * Resume: rf_ingest_files_resume starts a loader for every run in `loads`
 * that is running and not sealed, from its first batch without a progress
 * row (batches before it are read but not sent again). A batch produced
 * but not yet recorded when the process died is produced again with the
 * same seq, which the downstream stages skip as a replay. A PostgreSQL
 * advisory lock per run (held by the loader's connection) keeps two
 * processes from loading the same run at once. Push seqs (microsecond
 * timestamps) and file seqs (< 2^40) never meet. */
#ifndef RF_SVC_INGEST_FILES_H
#define RF_SVC_INGEST_FILES_H

#include <stddef.h>

#include "common/stats.h"
#include "runtime/kafka/kafka.h"
#include "runtime/rpc/rpc.h"

typedef struct rf_ingest_files_opts {
    rf_kafka_producer *producer; /* shared; owned by the caller */
    const char *pg;              /* PostgreSQL conninfo; NULL: Load is refused */
    const char *input_root;      /* NULL: Load is refused */
    const char *topic_clean;     /* "docs.clean" */
    const char *topic_rejected;  /* "docs.rejected" */
    size_t batch_docs;         /* records per batch for new loads (spec's ingest.batch_docs wins) */
    double delivery_timeout_s; /* per wait for Kafka */
    double cancel_poll_s;      /* how often a loader reads its run's state; 0 means 1 */
    double max_rate;           /* records/s per load, to spare downstream and the topic's retention;
                                * 0: as fast as it goes */
} rf_ingest_files_opts;

typedef struct rf_ingest_files rf_ingest_files;

int rf_ingest_files_new(const rf_ingest_files_opts *o, rf_ingest_files **out);
/* Adds Ingest/Load to s. */
int rf_ingest_files_register(rf_ingest_files *f, rf_rpc_server *s);
/* Starts loaders for the unfinished file-loaded runs; *started (may be
 * NULL) is how many. Nothing to do without a store or an input root. */
int rf_ingest_files_resume(rf_ingest_files *f, size_t *started);
/* Stops every loader at its current batch (what was produced is delivered
 * and recorded first) and joins them; the next start resumes them. */
void rf_ingest_files_stop(rf_ingest_files *f);
/* load.requests, load.started, load.batches, load.records, load.kept,
 * load.rejected, load.sealed, load.failed, load.cancelled, load.retries. */
rf_stats *rf_ingest_files_stats(rf_ingest_files *f);
/* Stops (if needed) and frees. */
void rf_ingest_files_free(rf_ingest_files *f);

#endif
