/* The ingest service's Kafka source: raw records pulled from a topic
 * (docs.raw) instead of pushed over gRPC, to docs.clean / docs.rejected as
 * Ingest.Push sends them, exactly once per message.
 *
 * A message holds records of one run: key = the run id, value = JSON Lines
 * (or the format the run's `ingest:` section names; plain, gzip or zstd),
 * mapped, cleaned and filtered with the run's `ingest:` settings, so the same
 * lines mean the same documents as in `refinery run`. Ids default to
 * "<topic>[<partition>]@<offset>:<line>". A message with an empty value is
 * the run's end marker: once it and every message before it are recorded,
 * the run is sealed. Producers keep a run on one partition (the key does
 * that), so the marker comes after the run's records.
 *
 * Exactly once: a message is a batch whose seq is 2^62 + partition * 2^40 +
 * offset (apart from Push's timestamp seqs and the file source's small
 * numbers). The stage loop (stage_loop.h) skips it when it is delivered again
 * after a crash, and downstream stages skip its output batch the same way.
 * Its kept documents go out as one DocumentBatch with that (run, seq), its
 * refused records as Reject messages, its counts as one stage_progress row
 * of stage "ingest".
 *
 * With a store the run must exist (else the message is counted as
 * source.unknown_run and skipped), a pending run becomes running, and the
 * records of a sealed or ended run are rejected as run_closed. Without a
 * store every message uses the service's settings and nothing is sealed. */
#ifndef RF_SVC_INGEST_KAFKA_SOURCE_H
#define RF_SVC_INGEST_KAFKA_SOURCE_H

#include <stddef.h>

#include "common/stats.h"
#include "ingest/ingest.h"
#include "runtime/kafka/kafka.h"
#include "runtime/store/store.h"
#include "runtime/stage_loop.h"

typedef struct rf_ingest_source_opts {
    rf_kafka_producer *producer;
    rf_store *store;              /* optional; the stage loop's connection */
    const char *topic_clean;      /* "docs.clean" */
    const char *topic_rejected;   /* "docs.rejected" */
    const rf_ingest_opts *ingest; /* settings of runs whose spec has no `ingest:` section */
    size_t max_batch_bytes;       /* a DocumentBatch stays below this; 0 means 900,000 */
    rf_stats *stats;              /* source.reasons.<reason> */
} rf_ingest_source_opts;

typedef struct rf_ingest_source rf_ingest_source;

int rf_ingest_source_new(const rf_ingest_source_opts *o, rf_ingest_source **out);
void rf_ingest_source_free(rf_ingest_source *s);

/* The stage loop's callbacks (user = the source). */
int rf_ingest_source_identify(void *user, const rf_kafka_msg *m, rf_stage_batch_id *id);
int rf_ingest_source_process(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                             rf_kafka_tracker *t, rf_store_counts *counts);
int rf_ingest_source_after_record(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id);

/* The source on its own thread: a consumer of topic in group, a stage loop
 * (stage "ingest", counters source.in, .out, .rejected, .bad_messages,
 * .unknown_run, ...) and, with conninfo, a PostgreSQL connection of its own.
 * It runs until rf_svc_stopping(); a failure logs, requests the service's
 * stop (rf_svc_request_stop) and is returned by rf_ingest_source_join. */
typedef struct rf_ingest_source_thread_opts {
    rf_ingest_source_opts source; /* store and stats are set by the thread */
    const rf_kafka_opts *kafka;
    const char *topic, *group;
    const char *conninfo; /* NULL: no store */
    size_t max_messages;
    double delivery_timeout_s;
} rf_ingest_source_thread_opts;

typedef struct rf_ingest_source_thread rf_ingest_source_thread;

/* Connects (consumer, store) before it returns, so that a bad setting fails
 * the start. */
int rf_ingest_source_start(const rf_ingest_source_thread_opts *o, rf_ingest_source_thread **out);
/* Waits for the thread (after rf_svc_request_stop or a signal), merges its
 * counters into stats, frees it; the loop's result. */
int rf_ingest_source_join(rf_ingest_source_thread *t, rf_stats *stats);

#endif
