/* The trainer service's work (refinery-trainer):
 *
 * - intake (rf_stage_loop.process, stage "trainer"): each TokenBatch from
 *   tokens.train is appended durably to its run's intake file
 *   STATE/<run>/intake (runtime/intake.h) before the loop records its progress
 *   row. Counts: in = sequences, out = sequences kept (ids and a label >= 0),
 *   rejected = the rest (skipped when training).
 * - training (rf_trainer_service_tick, from the same thread between polls):
 *   a run that is running, sealed, not trained here yet, and whose intake is
 *   complete (rf_store_stage_complete over ingest, dedup, tokenizer,
 *   trainer) is trained in a background thread, one run at a time, so that
 *   intake keeps flowing. Hyper-parameters come from the run's spec
 *   (`trainer:` section, trainer/spec.h; `model` defaults to opts.model;
 *   train/eval/output/export are ignored: data comes from the intake, state
 *   and exports go to the directories below). The data is the intake in
 *   (seq, position) order, checked against the trainer's progress rows.
 * - checkpoints: at every scheduled checkpoint (spec checkpoint_every, and
 *   always the last step), before rf_train saves its state
 *   (STATE/<run>/train/checkpoint.bin): an HF folder exported to
 *   CHECKPOINTS/<run>/step-<N>/, rf_store_checkpoint_add, the metrics loss,
 *   lr and tokens_per_s (rf_store_metric_add), then a CheckpointAnnounce
 *   (final = true on the last step) produced to opts.topic_checkpoints and
 *   waited for. A crash anywhere in there resumes from the previous saved
 *   state and does the same checkpoint again, identically (determinism);
 *   the store ignores the repeated rows and the evaluator the repeated
 *   announcement. STATE/<run>/trained marks a run done.
 * - restart: runs killed mid-training are found by the same scan (running,
 *   complete intake, not marked trained) and resume from checkpoint.bin.
 * - cancel: the training run's state is polled every opts.cancel_poll_s; a
 *   run no longer running (cancelled) stops training (state kept).
 * - errors (bad spec, no data, model missing, a token id beyond the model's
 *   vocabulary, an export or store failure) set the run failed with the
 *   message in runs.error; the service goes on.
 *
 * - group (opts.comm of world size N > 1, group.h): this process is rank 0
 *   of N and does all of the above alone; each run is sent to ranks
 *   1..N-1, which train it with this one (a spec without parallel.dp gets
 *   N); between runs a heartbeat every second. A training that fails in a
 *   group makes rf_trainer_service_tick fail, so that the process exits and
 *   the whole group restarts.
 *
 * Single-threaded API (the stage loop's thread); the training thread uses
 * its own store connection and shares the (thread-safe) producer. */
#ifndef RF_SVC_TRAINER_SERVICE_H
#define RF_SVC_TRAINER_SERVICE_H

#include <stdbool.h>

#include "comm/comm.h"
#include "common/stats.h"
#include "runtime/kafka/kafka.h"
#include "runtime/store/store.h"
#include "runtime/stage_loop.h"

/* state_dir and checkpoints_dir are copied; the other strings must outlive
 * the service. */
typedef struct rf_trainer_service_opts {
    const char *state_dir;       /* intake files and training state (created) */
    const char *checkpoints_dir; /* exported HF folders (created) */
    const char *model;           /* default model folder when a spec names none; may be NULL */
    int threads;                 /* training threads; 0: the spec's, else 1 */
    const char *pg;              /* connection string of the training thread's store */
    rf_store *store;             /* the caller's (intake progress, scans, cancel polls) */
    rf_kafka_producer *producer; /* announcements */
    const char *topic_checkpoints;
    double delivery_timeout_s; /* announcement delivery; 0 means 30 */
    double cancel_poll_s;      /* between polls of the training run's state; 0 means 2 */
    rf_stats *stats;           /* optional: trainer.runs_trained, .runs_failed, ... */
    /* The trainer group (group.h) of which this process is rank 0; NULL or
     * world size 1: one process. The caller owns it; while a run trains, the
     * training thread uses it, else rf_trainer_service_tick (heartbeats). */
    rf_comm *comm;
} rf_trainer_service_opts;

typedef struct rf_trainer_service rf_trainer_service;

int rf_trainer_service_new(const rf_trainer_service_opts *o, rf_trainer_service **out);
/* Stops a training in progress (it saves its state and resumes on the next
 * start), waits for it, and frees. */
void rf_trainer_service_free(rf_trainer_service *s);

/* rf_stage_loop.process, user = the service. */
int rf_trainer_service_process(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                               rf_kafka_tracker *t, rf_store_counts *counts);

/* Between polls: reaps a finished training, polls the training run's state
 * for a cancel, and starts the next run whose intake is complete. Returns
 * < 0 only when the store cannot be queried. */
int rf_trainer_service_tick(rf_trainer_service *s);

/* The directory name of a run under STATE and CHECKPOINTS: the id itself
 * when made of [A-Za-z0-9._-] (not starting with '.', at most 128 bytes),
 * else "run-" and its 64-bit hash in hex. */
/* False once a training of the group failed (the group must restart: the
 * other ranks may be stuck in a collective, so do not send them STOP or
 * finalize the communicator; exit non-zero). */
bool rf_trainer_service_group_ok(const rf_trainer_service *s);

void rf_trainer_run_dirname(const char *run_id, char *out, size_t size);

#endif
