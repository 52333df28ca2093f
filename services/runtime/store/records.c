/* Runs, per-batch stage progress, checkpoints, metrics, evaluation results:
 * all values travel as PQexecParams text parameters. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "runtime/store/internal.h"

typedef struct num {
    char s[32];
} num;

static num i64(int64_t v) {
    num n;
    snprintf(n.s, sizeof n.s, "%" PRId64, v);
    return n;
}

static num u64(uint64_t v) {
    num n;
    snprintf(n.s, sizeof n.s, "%" PRIu64, v);
    return n;
}

static num real(double v) {
    num n;
    snprintf(n.s, sizeof n.s, "%.17g", v);
    return n;
}

static int64_t get_i64(const PGresult *r, int row, int col) {
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static const char *const state_names[] = {"pending", "running", "succeeded", "failed", "cancelled"};

const char *rf_run_state_name(rf_run_state st) {
    return (unsigned)st < sizeof state_names / sizeof state_names[0] ? state_names[st] : "?";
}

void store_run_from_row(const PGresult *r, int row, rf_store_run *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", PQgetvalue(r, row, 0));
    const char *st = PQgetvalue(r, row, 1);
    for (size_t i = 0; i < sizeof state_names / sizeof state_names[0]; i++)
        if (!strcmp(st, state_names[i])) out->state = (rf_run_state)i;
    snprintf(out->error, sizeof out->error, "%s", PQgetvalue(r, row, 2));
    out->created_at = strtod(PQgetvalue(r, row, 3), NULL);
    out->updated_at = strtod(PQgetvalue(r, row, 4), NULL);
    out->sealed = !strcmp(PQgetvalue(r, row, 5), "t");
}

static int rows_affected(PGresult *r) {
    return atoi(PQcmdTuples(r));
}

int rf_store_run_create(rf_store *s, const char *run_id, const char *spec, bool *created) {
    const char *p[] = {run_id, spec};
    PGresult *r;
    int rc = rf_store_exec(
        s, "INSERT INTO runs (id, spec) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING", 2, p, &r);
    if (rc < 0) return rc;
    if (created) *created = rows_affected(r) == 1;
    PQclear(r);
    return RF_OK;
}

int rf_store_run_set_state(rf_store *s, const char *run_id, rf_run_state st, const char *error) {
    if ((unsigned)st >= sizeof state_names / sizeof state_names[0])
        return rf_fail(RF_ERR_INVALID, "store: bad run state %d", (int)st);
    const char *p[] = {run_id, state_names[st], error};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "UPDATE runs SET state = $2, error = $3, updated_at = now()"
                           " WHERE id = $1",
                           3, p, &r);
    if (rc < 0) return rc;
    int n = rows_affected(r);
    PQclear(r);
    return n == 1 ? RF_OK : rf_fail(RF_ERR_NOT_FOUND, "store: no run '%s'", run_id);
}

int rf_store_run_get(rf_store *s, const char *run_id, rf_store_run *out) {
    const char *p[] = {run_id};
    PGresult *r;
    int rc = rf_store_exec(s, "SELECT " RF_STORE_RUN_COLUMNS " FROM runs WHERE id = $1", 1, p, &r);
    if (rc < 0) return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return rf_fail(RF_ERR_NOT_FOUND, "store: no run '%s'", run_id);
    }
    store_run_from_row(r, 0, out);
    PQclear(r);
    return RF_OK;
}

int rf_store_progress_add(rf_store *s, const char *run_id, const char *stage, uint64_t batch_seq,
                          const rf_store_counts *c, bool *recorded) {
    if (batch_seq > INT64_MAX || c->in < 0 || c->out < 0 || c->rejected < 0 || c->duplicate < 0)
        return rf_fail(RF_ERR_RANGE, "store: %s batch %" PRIu64 ": counts out of range", stage,
                       batch_seq);
    num seq = u64(batch_seq), in = i64(c->in), out = i64(c->out), rej = i64(c->rejected),
        dup = i64(c->duplicate);
    const char *p[] = {run_id, stage, seq.s, in.s, out.s, rej.s, dup.s};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "INSERT INTO stage_progress"
                           " (run_id, stage, batch_seq, docs_in, docs_out, rejected, duplicate)"
                           " VALUES ($1, $2, $3, $4, $5, $6, $7)"
                           " ON CONFLICT (run_id, stage, batch_seq) DO NOTHING",
                           7, p, &r);
    if (rc < 0) return rc;
    if (recorded) *recorded = rows_affected(r) == 1;
    PQclear(r);
    return RF_OK;
}

int rf_store_progress_has(rf_store *s, const char *run_id, const char *stage, uint64_t batch_seq,
                          bool *has) {
    num seq = u64(batch_seq);
    const char *p[] = {run_id, stage, seq.s};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "SELECT 1 FROM stage_progress"
                           " WHERE run_id = $1 AND stage = $2 AND batch_seq = $3",
                           3, p, &r);
    if (rc < 0) return rc;
    *has = PQntuples(r) > 0;
    PQclear(r);
    return RF_OK;
}

int rf_store_progress_total(rf_store *s, const char *run_id, const char *stage,
                            rf_store_counts *out) {
    const char *p[] = {run_id, stage};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "SELECT sum(docs_in), sum(docs_out), sum(rejected), sum(duplicate),"
                           " count(*) FROM stage_progress WHERE run_id = $1 AND stage = $2",
                           2, p, &r);
    if (rc < 0) return rc;
    out->in = get_i64(r, 0, 0);
    out->out = get_i64(r, 0, 1);
    out->rejected = get_i64(r, 0, 2);
    out->duplicate = get_i64(r, 0, 3);
    out->batches = get_i64(r, 0, 4);
    PQclear(r);
    return RF_OK;
}

int rf_store_checkpoint_add(rf_store *s, const char *run_id, int64_t step, const char *path,
                            double train_loss) {
    num st = i64(step), loss = real(train_loss);
    const char *p[] = {run_id, st.s, path, loss.s};
    return rf_store_exec(s,
                         "INSERT INTO checkpoints (run_id, step, path, train_loss)"
                         " VALUES ($1, $2, $3, $4) ON CONFLICT (run_id, step) DO NOTHING",
                         4, p, NULL);
}

int rf_store_checkpoint_latest(rf_store *s, const char *run_id, int64_t *step, char *path,
                               size_t path_size) {
    const char *p[] = {run_id};
    PGresult *r;
    int rc = rf_store_exec(
        s, "SELECT step, path FROM checkpoints WHERE run_id = $1 ORDER BY step DESC LIMIT 1", 1, p,
        &r);
    if (rc < 0) return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return rf_fail(RF_ERR_NOT_FOUND, "store: run '%s' has no checkpoint", run_id);
    }
    *step = get_i64(r, 0, 0);
    if (path) snprintf(path, path_size, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    return RF_OK;
}

int rf_store_metric_add(rf_store *s, const char *run_id, int64_t step, const char *name,
                        double value) {
    num st = i64(step), v = real(value);
    const char *p[] = {run_id, st.s, name, v.s};
    return rf_store_exec(s,
                         "INSERT INTO training_metrics (run_id, step, name, value)"
                         " VALUES ($1, $2, $3, $4) ON CONFLICT (run_id, step, name) DO NOTHING",
                         4, p, NULL);
}

int rf_store_eval_add(rf_store *s, const char *run_id, int64_t checkpoint_step, const char *metric,
                      double value) {
    num st = i64(checkpoint_step), v = real(value);
    const char *p[] = {run_id, st.s, metric, v.s};
    return rf_store_exec(s,
                         "INSERT INTO eval_results (run_id, checkpoint_step, metric, value)"
                         " VALUES ($1, $2, $3, $4)"
                         " ON CONFLICT (run_id, checkpoint_step, metric) DO NOTHING",
                         4, p, NULL);
}

int rf_store_eval_get(rf_store *s, const char *run_id, int64_t checkpoint_step, const char *metric,
                      double *value) {
    num st = i64(checkpoint_step);
    const char *p[] = {run_id, st.s, metric};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "SELECT value FROM eval_results"
                           " WHERE run_id = $1 AND checkpoint_step = $2 AND metric = $3",
                           3, p, &r);
    if (rc < 0) return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return rf_fail(RF_ERR_NOT_FOUND, "store: no %s for run '%s' step %" PRId64, metric, run_id,
                       checkpoint_step);
    }
    *value = strtod(PQgetvalue(r, 0, 0), NULL);
    PQclear(r);
    return RF_OK;
}
