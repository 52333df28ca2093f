/* The dedup service's stage: DocumentBatch from docs.clean -> the dedup
 * engine -> kept documents (cluster set) as a DocumentBatch to docs.unique
 * and duplicates (cluster = their representative's) as a DocumentBatch to
 * docs.duplicates, both with the input batch's (run_id, seq). Every input
 * batch gets a docs.unique message, empty when all its documents were
 * duplicates; docs.duplicates only gets batches that had some.
 *
 * Each run is deduplicated on its own: its engine and journal live in
 * INDEX/<run_id>/ (a hash-named directory for run ids that are not plain
 * [A-Za-z0-9._-]), opened at the run's first batch, so documents of one run
 * never make those of another duplicates.
 *
 * Decisions are durable before outputs are produced (engine commit with its
 * batch journal, dedup_journal.h), and a batch decided before is answered
 * from those decisions, never decided again: a batch redelivered after a
 * crash yields the same outputs, whatever happened in between. */
#ifndef RF_SVC_DEDUP_SERVICE_H
#define RF_SVC_DEDUP_SERVICE_H

#include "common/stats.h"
#include "dedup/dedup.h"
#include "runtime/kafka/kafka.h"
#include "runtime/store/store.h"
#include "runtime/stage_loop.h"

typedef struct rf_dedup_service_opts {
    rf_dedup_opts engine;
    const char *index_dir; /* created when missing */
    rf_kafka_producer *producer;
    const char *topic_unique, *topic_dups;
} rf_dedup_service_opts;

typedef struct rf_dedup_service rf_dedup_service;

/* Creates the index directory; runs' indexes open (and replay their
 * journals, logging how much was decided before) at their first batch. */
int rf_dedup_service_open(const rf_dedup_service_opts *o, rf_dedup_service **out);
void rf_dedup_service_close(rf_dedup_service *s);

/* rf_stage_loop.prepare: decides every new batch of a poll, writes them to
 * their runs' journals and makes them durable with one journal sync and one
 * engine commit per run (not one per batch); process() then answers those
 * batches from the decisions, as it answers redelivered ones. */
int rf_dedup_service_prepare(void *user, const rf_kafka_msg *const *msgs, size_t n);

/* rf_stage_loop.process: user is the rf_dedup_service. A batch not decided
 * before is decided, journaled and committed on its own. counts: in, out
 * (kept), duplicate. */
int rf_dedup_service_process(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                             rf_kafka_tracker *t, rf_store_counts *counts);

/* Engine counters per open run under "dedup.<run_id>." (docs, kept, exact, near, ...). */
int rf_dedup_service_report(rf_dedup_service *s, rf_stats *stats);

#endif
