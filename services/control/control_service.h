/* refinery.v1.Control: runs submitted from a pipeline spec, served by
 * refinery-ingest next to Ingest.Push (services/README.md, "Control API").
 *
 *   Submit  checks the spec like `refinery run` (control/spec_check.h) and creates
 *           the run, state pending, spec stored. An empty run_id is generated
 *           ("run-<utc time>-<8 hex>"); ids are 1..127 of [A-Za-z0-9._-] and
 *           start with a letter or digit (they name directories downstream).
 *           Bad spec or id: INVALID_ARGUMENT naming the key and line; an
 *           existing id: ALREADY_EXISTS.
 *   Seal    no more input (idempotent).
 *   Get     the RunStatus; List: the newest runs (limit 0 = 50, at most 1000).
 *   Watch   a RunStatus at once and whenever it changes (PostgreSQL polled
 *           every poll_s), until the run ends, the client leaves or the
 *           service stops (UNAVAILABLE). At most max_watches at once
 *           (RESOURCE_EXHAUSTED beyond), so that watchers cannot take every
 *           worker from Ingest.Push.
 *   Cancel  pending or running -> cancelled; FAILED_PRECONDITION once ended.
 * Unknown run: NOT_FOUND; an empty run id: INVALID_ARGUMENT; the store
 * failing: UNAVAILABLE.
 *
 * A RunStatus holds the runs row, per-stage totals over stage_progress for
 * ingest, dedup, tokenizer, trainer and evaluator, each with `complete`
 * (rf_store_stage_complete over the stage's chain), the latest checkpoint
 * and its training loss, and every metric of the latest evaluated
 * checkpoint; and each stage's liveness: down (no heartbeat of its service
 * for down_after_s: runtime/ready.h writes them), unready (its dependencies
 * do not answer), stalled (batches wait for it upstream and it made no
 * progress for stall_after_s), working, waiting, complete; "ended" once the
 * run has ended. */
#ifndef RF_SVC_CONTROL_SERVICE_H
#define RF_SVC_CONTROL_SERVICE_H

#include "common/stats.h"
#include "runtime/rpc/rpc.h"
#include "runtime/store/store.h"

typedef struct rf_control_service_opts {
    rf_store *store; /* required; owned by the caller, used only by this service */
    int max_watches; /* concurrent Watch calls; <= 0 means 1 */
    double poll_s;   /* Watch polling period; <= 0 means 0.5 */
    /* Liveness of each stage in a RunStatus (refinery.proto, StageCounts):
     * down after this long without a heartbeat of its service (<= 0: 15 s),
     * stalled after this long with batches waiting and no progress (<= 0:
     * 120 s). */
    double down_after_s;
    double stall_after_s;
} rf_control_service_opts;

typedef struct rf_control_service rf_control_service;

int rf_control_service_new(const rf_control_service_opts *o, rf_control_service **out);
/* Adds the six methods to s and reports "refinery.v1.Control" as serving. */
int rf_control_service_register(rf_control_service *svc, rf_rpc_server *s);
/* Ends running Watch calls (UNAVAILABLE) and refuses new ones: call before
 * rf_rpc_server_stop so that a stop does not wait out its grace period. */
void rf_control_service_shutdown(rf_control_service *svc);
/* control.submitted, control.cancelled, control.sealed, control.watches. */
rf_stats *rf_control_service_stats(rf_control_service *svc);
void rf_control_service_free(rf_control_service *svc);

#endif
