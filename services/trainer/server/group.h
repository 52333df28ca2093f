/* The trainer service as a group of N ranks (refinery-trainer under mpirun).
 *
 * Rank 0 is the service: it alone consumes tokens.train, writes PostgreSQL,
 * exports checkpoints, produces announcements and serves gRPC health. Ranks
 * 1..N-1 (followers) open no Kafka, PostgreSQL or gRPC; they run
 * rf_tgroup_follow and get everything from rank 0 through the comm layer:
 *
 *   header   broadcast from rank 0, 6 i64: kind, run id length, spec length,
 *            sequences, tokens, 0
 *   IDLE     (every ~1 s while rank 0 trains nothing) then an all-reduce
 *            (u8 MAX) of each rank's "stopping" flag: any rank stopping
 *            stops the group (rank 0 ends its loop and sends STOP)
 *   TRAIN    the run id and its spec text (u8 broadcast), the dataset (token
 *            ids, lengths, labels: i32 broadcasts), then an all-reduce (i32
 *            MAX) of each rank's preparation status: every rank parsed the
 *            spec and passed rf_trainer_check, or none trains (rank 0 fails
 *            the run). Then every rank calls rf_trainer_drive with the group.
 *   STOP     the followers return 0.
 *
 * The message order is the same on every rank, so the collectives match.
 * While rank 0 trains, its training thread owns the communicator (the
 * service's thread sends no heartbeat); rf_train's own collectives then
 * carry the group's liveness and its cancel flag (any rank cancelling stops
 * all at a saved state).
 *
 * A follower waits for the header by polling a nonblocking broadcast every
 * 20 ms (not the comm layer's spinning wait: an idle follower takes no CPU),
 * for at most the comm timeout (REFINERY_COMM_TIMEOUT, default 300 s), then
 * rf_comm_wait bounds it once more: a silent rank 0 ends a follower within
 * twice that timeout. Rank 0 notices a dead follower at its next heartbeat's
 * all-reduce (within the comm timeout); under mpirun, mpirun ends the whole
 * group as soon as one rank dies.
 *
 * Training state: every rank calls rf_train with out_dir STATE/<run>/train,
 * so --state must be the same directory for every rank (one machine, or a
 * shared volume): rank 0 writes the checkpoint there and every rank reads it
 * on resume. --model (the default model folder) must name the same model on
 * every rank. */
#ifndef RF_SVC_TRAINER_GROUP_H
#define RF_SVC_TRAINER_GROUP_H

#include <stdbool.h>

#include "comm/comm.h"
#include "common/config.h"
#include "trainer/dataset.h"
#include "trainer/spec.h"

/* The run's spec text parsed into *spec (strings live in *root, which the
 * caller frees with rf_cfg_free): trainer.model defaults to model (may be
 * NULL), and parallel.dp, when the spec does not give it, to world (the
 * group's size: a spec without `parallel` trains on the whole group). */
int rf_tgroup_parse_spec(const char *text, const char *run_id, const char *model, int world,
                         rf_cfg **root, rf_trainer_spec *spec);

/* Rank 0, with no training in progress: one heartbeat (IDLE). *any_stop is
 * set when some rank (stopping, rank 0's own flag included) wants the group
 * to stop. */
int rf_tgroup_heartbeat(rf_comm *c, bool stopping, bool *any_stop);

/* Rank 0, from the training thread: sends TRAIN with the run id, its spec
 * text and the dataset, then agrees on the preparation: local_rc is rank 0's
 * own (0 or an rf_err); *all_ok is set when every rank prepared. */
int rf_tgroup_send_job(rf_comm *c, const char *run_id, const char *spec, const rf_dataset *d,
                       int local_rc, bool *all_ok);

/* Rank 0: tells the followers to return. Only on a group that is not broken. */
int rf_tgroup_stop(rf_comm *c);

typedef struct rf_tgroup_follower_opts {
    const char *state_dir; /* the service's --state: the same directory as rank 0's */
    const char *model;     /* --model: default model folder */
    int threads;           /* --threads (0: the spec's, else 1) */
    double timeout_s;      /* longest wait for rank 0's next message; <= 0: comm timeout */
} rf_tgroup_follower_opts;

/* A follower (rank > 0): serves rank 0's commands until STOP (RF_OK), a
 * failure of the group, or a training error (both non-zero: the process
 * should exit non-zero, which ends the group; it is restarted and resumes from
 * the last checkpoint). */
int rf_tgroup_follow(rf_comm *c, const rf_tgroup_follower_opts *o);

#endif
