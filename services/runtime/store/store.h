/* PostgreSQL metadata store (libpq).
 *
 * rf_store_open connects (retrying with exponential backoff while the server
 * is not up yet: RF_ERR_IO after the last attempt), then applies the embedded migrations that are
 * missing, in one transaction under a transaction-level advisory lock, so that several services
 * starting at once migrate exactly once. What no retry can fix fails at once with RF_ERR_INVALID
 * and the reason: a connection string libpq cannot parse, a database that does not exist (SQLSTATE
 * 3D000), an authentication failure (28P01, 28000). connect_timeout in the connection string (or
 * PGCONNECT_TIMEOUT) bounds each attempt.
 *
 * Every statement with values is sent with PQexecParams (no SQL is built from
 * data). When the connection drops, the next statement reconnects with
 * backoff and is retried once: every write here is idempotent (keyed inserts
 * with ON CONFLICT DO NOTHING, or absolute updates), so a retry after an
 * unknown outcome cannot count anything twice.
 *
 * A store handle is used by one thread at a time. */
#ifndef RF_STORE_H
#define RF_STORE_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rf_store rf_store;

typedef struct rf_store_opts {
    const char *conninfo; /* libpq connection string or URI */
    int attempts;         /* connection attempts before giving up; 0 means 10 */
    double backoff_s;     /* first wait between attempts, doubled each time; 0 means 0.1 */
    double backoff_max_s; /* cap of the wait; 0 means 5 */
} rf_store_opts;

int rf_store_open(const rf_store_opts *opts, rf_store **out);
void rf_store_close(rf_store *s);

/* Schema version after open (the highest applied migration). */
int rf_store_schema_version(rf_store *s, int *version);
/* Times the handle had to reconnect (for tests and logs). */
int64_t rf_store_reconnects(const rf_store *s);

/* Runs sql with text parameters $1..$n (NULL = SQL NULL). *res (may be NULL
 * when not wanted) is the result, to PQclear. Fails with RF_ERR_IO naming the
 * server's message on a failed statement. */
int rf_store_exec(rf_store *s, const char *sql, int n, const char *const *params, PGresult **res);

/* --- runs --- */

typedef enum rf_run_state {
    RF_RUN_PENDING,
    RF_RUN_RUNNING,
    RF_RUN_SUCCEEDED,
    RF_RUN_FAILED,
    RF_RUN_CANCELLED,
} rf_run_state;

const char *rf_run_state_name(rf_run_state st);

typedef struct rf_store_run {
    char id[128];
    rf_run_state state;
    char error[512];
    bool sealed;       /* no more input will come (rf_store_run_seal) */
    double created_at; /* unix seconds */
    double updated_at;
} rf_store_run;

/* Creates a run; *created = false when the id already existed (untouched). */
int rf_store_run_create(rf_store *s, const char *run_id, const char *spec, bool *created);
int rf_store_run_set_state(rf_store *s, const char *run_id, rf_run_state st, const char *error);
/* RF_ERR_NOT_FOUND for an unknown id. */
int rf_store_run_get(rf_store *s, const char *run_id, rf_store_run *out);
/* The spec the run was created with, malloc'd (the caller frees it). */
int rf_store_run_spec(rf_store *s, const char *run_id, char **spec);
/* Marks the run's input complete (idempotent) and records its batch count:
 * the ingest batches with documents recorded so far (stage_progress, stage
 * "ingest", docs_out > 0), which every later stage must deliver (the first
 * seal's count stays). RF_ERR_NOT_FOUND for an unknown id. */
int rf_store_run_seal(rf_store *s, const char *run_id);
/* Up to cap runs, newest first, into out; *n is how many. */
int rf_store_run_list(rf_store *s, size_t cap, rf_store_run *out, size_t *n);

/* --- stage progress, one row per batch --- */

typedef struct rf_store_counts {
    int64_t in, out, rejected, duplicate;
    int64_t batches;
} rf_store_counts;

/* Records a batch's counts once: *recorded = false when (run, stage, seq) was
 * already recorded (a replay), and nothing changes. */
int rf_store_progress_add(rf_store *s, const char *run_id, const char *stage, uint64_t batch_seq,
                          const rf_store_counts *c, bool *recorded);
/* Whether (run, stage, seq) is recorded: a consumer skips a batch it already
 * finished before a crash cost it the offset commit. */
int rf_store_progress_has(rf_store *s, const char *run_id, const char *stage, uint64_t batch_seq,
                          bool *has);
/* Sums over the recorded batches of a stage. */
int rf_store_progress_total(rf_store *s, const char *run_id, const char *stage,
                            rf_store_counts *out);

/* Whether stage `chain[n-1]` has everything of the run: the run is sealed
 * and, for each link chain[i] -> chain[i+1], every batch chain[i] recorded
 * with docs_out > 0 is recorded by chain[i+1] too. Stages keep their input
 * batch's seq and produce an output batch (possibly empty) for every input
 * batch with documents, so this is "caught up with a sealed input", e.g.
 * {"ingest", "dedup", "tokenizer", "trainer"}. */
int rf_store_stage_complete(rf_store *s, const char *run_id, const char *const *chain, size_t n,
                            bool *complete);

/* --- loss detection (flow.c, migration 004_loss) --- */

/* Batches that stage `upstream` delivered with documents and `stage` has not
 * recorded, for one run still pending or running. A stage keeps its input
 * batch's seq and produces one batch per input batch with documents (see
 * rf_store_stage_complete), so these are what the stage still owes. */
typedef struct rf_store_missing {
    char run_id[128];
    int64_t missing;         /* batches not recorded by the stage */
    int64_t expected;        /* batches upstream recorded with documents */
    int64_t sealed_batches;  /* the run's batch count at its seal; -1 when not sealed */
    uint64_t first, last;    /* the lowest and highest missing seq */
    uint64_t seq_lo, seq_hi; /* the lowest and highest expected seq */
} rf_store_missing;

/* Up to cap runs (oldest first) with missing batches into out; *n is how many. */
int rf_store_missing_batches(rf_store *s, const char *upstream, const char *stage, size_t cap,
                             rf_store_missing *out, size_t *n);
/* Records that stage found offsets [from, to) of topic [partition] deleted
 * before it consumed them (idempotent). */
int rf_store_gap_add(rf_store *s, const char *stage, const char *topic, int32_t partition,
                     int64_t from, int64_t to);
/* The latest gap stage recorded on topic [partition]: RF_ERR_NOT_FOUND when none. */
int rf_store_gap_last(rf_store *s, const char *stage, const char *topic, int32_t partition,
                      int64_t *from, int64_t *to);
/* Ends a pending or running run as failed with reason. *failed = false when
 * it had already ended (nothing changes); RF_ERR_NOT_FOUND for an unknown id. */
int rf_store_run_fail(rf_store *s, const char *run_id, const char *reason, bool *failed);

/* --- trainer and evaluator --- */

int rf_store_checkpoint_add(rf_store *s, const char *run_id, int64_t step, const char *path,
                            double train_loss);
/* The checkpoint with the highest step: RF_ERR_NOT_FOUND when there is none. */
int rf_store_checkpoint_latest(rf_store *s, const char *run_id, int64_t *step, char *path,
                               size_t path_size);
int rf_store_metric_add(rf_store *s, const char *run_id, int64_t step, const char *name,
                        double value);
int rf_store_eval_add(rf_store *s, const char *run_id, int64_t checkpoint_step, const char *metric,
                      double value);
/* RF_ERR_NOT_FOUND when that result is not recorded. */
int rf_store_eval_get(rf_store *s, const char *run_id, int64_t checkpoint_step, const char *metric,
                      double *value);

/* --- run status and control (status.c) --- */

/* Moves a pending run to running; *started (may be NULL) says whether this
 * call did it. Other states are left alone. */
int rf_store_run_start(rf_store *s, const char *run_id, bool *started);
/* Ends a pending or running run as cancelled. *cancelled = false when it had
 * already ended (nothing changes); RF_ERR_NOT_FOUND for an unknown id. */
int rf_store_run_cancel(rf_store *s, const char *run_id, bool *cancelled);
/* Whether the state is final (succeeded, failed, cancelled). */
bool rf_run_state_ended(rf_run_state st);
/* rf_store_progress_total for stages[0..n) in one statement: out[i] for
 * stages[i] (zeroes for a stage without rows). */
int rf_store_progress_totals(rf_store *s, const char *run_id, const char *const *stages, size_t n,
                             rf_store_counts *out);
/* The checkpoint with the highest step and its training loss (0 when not
 * recorded): RF_ERR_NOT_FOUND when there is none. */
int rf_store_checkpoint_last(rf_store *s, const char *run_id, int64_t *step, double *train_loss);

typedef struct rf_store_metric {
    char name[64];
    double value;
} rf_store_metric;

/* Evaluation results of the highest checkpoint step that has any, sorted by
 * metric name: *out is malloc'd (the caller frees it), *n its length.
 * RF_ERR_NOT_FOUND when no checkpoint of the run is evaluated. */
int rf_store_eval_latest(rf_store *s, const char *run_id, int64_t *step, rf_store_metric **out,
                         size_t *n);

/* --- liveness (heartbeat.c) --- */

/* Records that instance (host:pid) of service (ingest, dedup, ...) is alive
 * now (the database's clock), whether its dependencies answered and why not
 * (reason may be NULL); started_at is its start, unix seconds. Rows of the
 * service not renewed for a day are deleted. */
int rf_store_heartbeat(rf_store *s, const char *service, const char *instance, double started_at,
                       bool ready, const char *reason);

/* What Control reads to tell a stage that is down or stalled in a run from
 * one that is working or waiting. Times are unix seconds on the database's
 * clock; 0: none. */
typedef struct rf_store_liveness {
    double now;           /* the database's clock */
    double progress_at;   /* the stage's last progress in the run: its newest stage_progress
                             row, or for the trainer its newest checkpoint, for the evaluator
                             its newest eval result, whichever is newest */
    double heartbeat_at;  /* the service's newest heartbeat (any instance) */
    bool ready;           /* what that heartbeat said */
    char reason[256];     /* and why not ready */
    int64_t backlog;      /* batches with documents upstream recorded and this stage has not */
    double backlog_since; /* when upstream recorded the oldest of them */
} rf_store_liveness;

/* For stage in run_id; upstream is the stage it consumes from (NULL or ""
 * for ingest: no backlog). */
int rf_store_liveness_get(rf_store *s, const char *run_id, const char *stage, const char *upstream,
                          rf_store_liveness *out);

#endif
