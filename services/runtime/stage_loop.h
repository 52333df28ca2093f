/* The main loop of a Kafka-to-Kafka stage service (dedup, tokenizer, ...):
 *
 *   poll input messages -> for each batch: skip if already recorded, else
 *   process (produce outputs) -> wait until every output is in Kafka ->
 *   record each batch's counts in PostgreSQL -> commit the input offsets
 *
 * PostgreSQL sees two statements per poll, not two per batch: one looks up
 * which of the poll's batches are recorded, one records all the new ones
 * (so a poll's rows are written all or none).
 *
 * A crash anywhere before the commit replays the poll's batches. A batch
 * whose progress row exists was finished before (only its commit was lost)
 * and is skipped, so its counts and outputs are not repeated; a batch that
 * crashed before its row was written is processed again, and its outputs
 * reach the next stage twice with the same (run_id, seq), which that stage's
 * own loop skips as a replay. Output batches must therefore keep the
 * (run_id, seq) of the input batch they come from.
 *
 * Loss detection: records of the input deleted before the stage consumed
 * them (retention) are reported by the consumer as gaps (kafka.h), which the
 * loop records in PostgreSQL (input_gaps) before committing past them. With
 * `upstream` set, every check_interval_s the loop looks for runs (pending
 * or running) with batches that upstream recorded with documents and this
 * stage has not; a run whose partition of every input topic is assigned to
 * this member and consumed to the log's end cannot receive them any more
 * (upstream records a batch only once it is in Kafka), so the run is ended
 * FAILED with a reason naming the stage, the missing batches (count and seq
 * range), the topic, the partition, the offsets deleted, and "probable
 * retention". Never a silent stall: the reason shows in `refinery status`.
 *
 * Single-threaded: the loop owns its consumer, store and tracker; the
 * producer may be shared. */
#ifndef RF_SVC_STAGE_LOOP_H
#define RF_SVC_STAGE_LOOP_H

#include <stddef.h>
#include <stdint.h>

#include "common/stats.h"
#include "runtime/kafka/kafka.h"
#include "runtime/store/store.h"

typedef struct rf_stage_batch_id {
    char run_id[128];
    uint64_t seq;
} rf_stage_batch_id;

typedef struct rf_stage_loop {
    const char *stage; /* progress rows and counters are named after it */
    rf_kafka_consumer *consumer;
    rf_kafka_producer *producer;
    rf_store *store;           /* NULL: no replay detection, no progress rows */
    size_t max_messages;       /* per poll; 0 means 16 */
    double poll_timeout_s;     /* 0 means 0.5 */
    double delivery_timeout_s; /* 0 means 30 */
    /* The batch identity of an input message; < 0 for a message that is not
     * a batch, which is then counted as <stage>.bad_messages and skipped. */
    int (*identify)(void *user, const rf_kafka_msg *m, rf_stage_batch_id *id);
    /* Produces the outputs of one input batch with rf_kafka_produce_tracked
     * on t and fills counts. RF_ERR_PARSE means the message is not a batch of
     * this stage (it does not decode, or its strings are not UTF-8): the loop
     * records it as one rejected record, counts <stage>.bad_batches and goes
     * on. Any other error < 0 stops the loop without committing. */
    int (*process)(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                   rf_kafka_tracker *t, rf_store_counts *counts);
    /* Optional, called once per poll before process() with the messages it
     * will get (not replays, not bad messages), so that a stage can do work
     * for the whole poll at once (the dedup service makes a poll's decisions
     * durable with one sync). < 0 stops the loop without committing. */
    int (*prepare)(void *user, const rf_kafka_msg *const *msgs, size_t n);
    /* Optional, called once the poll's progress rows are recorded and before
     * its offsets are committed, for every batch processed now or skipped as
     * already done (not for bad messages): work that must follow the
     * batch's row, done again on a replay, so it must be idempotent (the
     * ingest service's Kafka source seals a run at its end marker here).
     * < 0 stops the loop without committing. */
    int (*after_record)(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id);
    void *user;
    rf_stats *stats;      /* optional: <stage>.batches, .replayed, .bad_messages, .unknown_run,
                           * .bad_batches, .in, .out, ... */
    const char *counters; /* the counters' prefix when it is not the stage's name */
    /* Loss detection (see above): the stage whose batches this one consumes
     * ("ingest" for dedup, "dedup" for the tokenizer); NULL: no run check
     * (gaps are still recorded). Needs a store. */
    const char *upstream;
    double check_interval_s; /* 0 means 5 */
    double next_check_;      /* internal: when the next run check is due */
} rf_stage_loop;

/* One poll's worth: the number of messages handled (0 when none came), or a
 * negative rf_err when processing, delivery, recording or the commit failed
 * (nothing of that poll is committed). */
int rf_stage_loop_step(rf_stage_loop *l);
/* Steps until rf_svc_stopping() (the poll in progress is finished and
 * committed first) or a failure. */
int rf_stage_loop_run(rf_stage_loop *l);
/* The run check now (rf_stage_loop_step does it every check_interval_s):
 * the number of runs failed, or a negative rf_err when PostgreSQL fails
 * (Kafka trouble only postpones a run's verdict). */
int rf_stage_loop_check_runs(rf_stage_loop *l);

/* identify() for DocumentBatch and TokenBatch messages, which share fields
 * 1 (run_id) and 2 (seq): reads just those two, bounds-checked; a run id
 * that is not UTF-8 text (or holds a NUL) makes the message not a batch. */
int rf_stage_identify_batch(void *user, const rf_kafka_msg *m, rf_stage_batch_id *id);

#endif
