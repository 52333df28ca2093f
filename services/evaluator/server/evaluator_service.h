/* The evaluator service's work:
 *
 * - intake (rf_stage_loop.process on tokens.eval, stage "evaluator"): each
 *   TokenBatch is appended durably to its run's intake file
 *   STATE/<run dir>/eval.intake (runtime/intake.h) before the loop records its
 *   progress row and commits. Counts: in = out = sequences; a message that is
 *   not a TokenBatch is recorded as one rejected and logged.
 * - checkpoints (rf_evaluator_checkpoint_loop on topic `checkpoints`): for
 *   each CheckpointAnnounce, once the run's eval intake is complete
 *   (rf_store_stage_complete over ingest, dedup, tokenizer, evaluator), the
 *   announced folder is evaluated on the run's eval sequences (in (seq,
 *   position) order; max_len and batch_size from the spec's `evaluator:`
 *   section when it has them, as `refinery run` reads them, else the
 *   service's) and every metric goes to eval_results: accuracy, loss,
 *   macro_precision, macro_recall, macro_f1, precision.<c>, recall.<c>,
 *   f1.<c>, support.<c> for every class c, and n (labelled sequences), written
 *   last: its presence means "done", so a replayed announcement changes
 *   nothing. An empty eval split records n = 0 only (and says so in the log).
 *   The final announcement sets the run succeeded. Cancelled, failed and
 *   unknown runs are skipped; a folder or intake that cannot be evaluated
 *   fails the run with the reason. The offset is committed after that.
 * - gRPC refinery.v1.Evaluator/Classify: the run's named (or latest)
 *   checkpoint, loaded through a small cache, labels and softmax
 *   probabilities per text. INVALID_ARGUMENT: no run id, more than max_texts
 *   texts, a text that is not UTF-8. NOT_FOUND: unknown run, or no checkpoint
 *   at the named step. FAILED_PRECONDITION: the run has no checkpoint yet.
 *   INTERNAL: the folder does not load or run (the message says why).
 *   UNAVAILABLE: PostgreSQL is unreachable.
 * - gRPC refinery.v1.Evaluator/Generate (server streaming): a causal LM
 *   (evaluator/lm.h) named relative to models_dir, loaded through a small
 *   cache, continues the prompt (evaluator/generate.h); one GeneratedToken
 *   per new token, sent as it is produced. INVALID_ARGUMENT: no model, a
 *   model path that is absolute or has a ".." component, a prompt that is not
 *   UTF-8 or has no token or is longer than the model's positions, bad
 *   sampling settings, max_new_tokens above the service's cap.
 *   FAILED_PRECONDITION: the service has no models directory; chat asked of
 *   a model without a ChatML template. NOT_FOUND: no such model under the
 *   directory. INTERNAL: the model does not load (the message says why).
 *   A client that goes away stops the generation. Needs no PostgreSQL. */
#ifndef RF_SVC_EVALUATOR_SERVICE_H
#define RF_SVC_EVALUATOR_SERVICE_H

#include <stdint.h>

#include "runtime/kafka/kafka.h"
#include "runtime/rpc/rpc.h"
#include "runtime/store/store.h"
#include "runtime/stage_loop.h"

typedef struct rf_evaluator_service_opts {
    const char *state_dir; /* intake files (required for intake and checkpoints) */
    const char *pg;        /* Classify's own PostgreSQL connection */
    int max_len;    /* sequence length cap (Classify; evaluation when the spec has none); 0: 128 */
    int batch_size; /* sequences per forward pass (idem); 0 means 32 */
    int max_texts;  /* Classify: texts per request; 0 means 256 */
    int cache;      /* Classify: checkpoint folders kept loaded; 0 means 2 */
    double poll_s;  /* checkpoints: seconds between completeness checks; 0 means 0.5 */
    const char *models_dir; /* Generate: the models it may load (NULL: Generate is refused) */
    int max_new_tokens;     /* Generate: cap on a request's max_new_tokens; 0 means 512 */
    int lm_cache;           /* Generate: models kept loaded; 0 means 1 */
} rf_evaluator_service_opts;

typedef struct rf_evaluator_service rf_evaluator_service;

int rf_evaluator_service_new(const rf_evaluator_service_opts *o, rf_evaluator_service **out);
void rf_evaluator_service_free(rf_evaluator_service *s);
/* Counters: evaluator.checkpoints.{evaluated,skipped,failed,bad}, ... */
rf_stats *rf_evaluator_service_stats(rf_evaluator_service *s);

/* rf_stage_loop.process for tokens.eval (one thread). */
int rf_evaluator_service_intake(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                                rf_kafka_tracker *t, rf_store_counts *counts);

/* Handles one announcement on store (waiting for the run's eval intake to be
 * complete): RF_OK when done with it (evaluated, skipped or the run failed),
 * so its offset may be committed; RF_ERR_CANCELED when the service is
 * stopping; another error (PostgreSQL) when it should be retried. */
int rf_evaluator_service_checkpoint(rf_evaluator_service *s, rf_store *store, const uint8_t *msg,
                                    size_t len);

/* Consumes announcements from c until rf_svc_stopping(), retrying one whose
 * handling failed, committing each after it is handled. */
int rf_evaluator_checkpoint_loop(rf_evaluator_service *s, rf_kafka_consumer *c, rf_store *store);

/* Adds /refinery.v1.Evaluator/Classify and /Generate to server. */
int rf_evaluator_service_register(rf_evaluator_service *s, rf_rpc_server *server);

#endif
