/* What the Control API reports and changes about a run: state transitions
 * that depend on the current state (start, cancel) as single conditional
 * updates, and the reads a RunStatus is assembled from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "runtime/store/internal.h"

static int64_t col_i64(const PGresult *r, int row, int col) {
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

bool rf_run_state_ended(rf_run_state st) {
    return st == RF_RUN_SUCCEEDED || st == RF_RUN_FAILED || st == RF_RUN_CANCELLED;
}

int rf_store_run_start(rf_store *s, const char *run_id, bool *started) {
    const char *p[] = {run_id};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "UPDATE runs SET state = 'running', updated_at = now()"
                           " WHERE id = $1 AND state = 'pending'",
                           1, p, &r);
    if (rc < 0) return rc;
    if (started) *started = atoi(PQcmdTuples(r)) == 1;
    PQclear(r);
    return RF_OK;
}

int rf_store_run_cancel(rf_store *s, const char *run_id, bool *cancelled) {
    const char *p[] = {run_id};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "UPDATE runs SET state = 'cancelled', updated_at = now()"
                           " WHERE id = $1 AND state IN ('pending', 'running')",
                           1, p, &r);
    if (rc < 0) return rc;
    *cancelled = atoi(PQcmdTuples(r)) == 1;
    PQclear(r);
    if (*cancelled) return RF_OK;
    rf_store_run run; /* not cancelled: unknown, or already ended */
    return rf_store_run_get(s, run_id, &run);
}

int rf_store_progress_totals(rf_store *s, const char *run_id, const char *const *stages, size_t n,
                             rf_store_counts *out) {
    const char *p[] = {run_id};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "SELECT stage, sum(docs_in), sum(docs_out), sum(rejected),"
                           " sum(duplicate), count(*) FROM stage_progress"
                           " WHERE run_id = $1 GROUP BY stage",
                           1, p, &r);
    if (rc < 0) return rc;
    memset(out, 0, n * sizeof *out);
    for (int row = 0; row < PQntuples(r); row++)
        for (size_t i = 0; i < n; i++) {
            if (strcmp(PQgetvalue(r, row, 0), stages[i]) != 0) continue;
            out[i] = (rf_store_counts){.in = col_i64(r, row, 1),
                                       .out = col_i64(r, row, 2),
                                       .rejected = col_i64(r, row, 3),
                                       .duplicate = col_i64(r, row, 4),
                                       .batches = col_i64(r, row, 5)};
        }
    PQclear(r);
    return RF_OK;
}

int rf_store_checkpoint_last(rf_store *s, const char *run_id, int64_t *step, double *train_loss) {
    const char *p[] = {run_id};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "SELECT step, coalesce(train_loss, 0) FROM checkpoints"
                           " WHERE run_id = $1 ORDER BY step DESC LIMIT 1",
                           1, p, &r);
    if (rc < 0) return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return rf_fail(RF_ERR_NOT_FOUND, "store: run '%s' has no checkpoint", run_id);
    }
    *step = col_i64(r, 0, 0);
    *train_loss = strtod(PQgetvalue(r, 0, 1), NULL);
    PQclear(r);
    return RF_OK;
}

int rf_store_eval_latest(rf_store *s, const char *run_id, int64_t *step, rf_store_metric **out,
                         size_t *n) {
    *out = NULL;
    *n = 0;
    const char *p[] = {run_id};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "SELECT checkpoint_step, metric, value FROM eval_results"
                           " WHERE run_id = $1 AND checkpoint_step ="
                           "  (SELECT max(checkpoint_step) FROM eval_results WHERE run_id = $1)"
                           " ORDER BY metric",
                           1, p, &r);
    if (rc < 0) return rc;
    int rows = PQntuples(r);
    if (rows == 0) {
        PQclear(r);
        return rf_fail(RF_ERR_NOT_FOUND, "store: run '%s' has no evaluated checkpoint", run_id);
    }
    rf_store_metric *m = calloc((size_t)rows, sizeof *m);
    if (!m) {
        PQclear(r);
        return RF_ERR_NOMEM;
    }
    *step = col_i64(r, 0, 0);
    for (int i = 0; i < rows; i++) {
        snprintf(m[i].name, sizeof m[i].name, "%s", PQgetvalue(r, i, 1));
        m[i].value = strtod(PQgetvalue(r, i, 2), NULL);
    }
    PQclear(r);
    *out = m;
    *n = (size_t)rows;
    return RF_OK;
}
