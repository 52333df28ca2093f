/* The run's flow through the stages: its spec, sealing its input, listing
 * runs, and whether a stage has caught up with a sealed run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "runtime/store/internal.h"

int rf_store_run_spec(rf_store *s, const char *run_id, char **spec) {
    const char *p[] = {run_id};
    PGresult *r;
    int rc = rf_store_exec(s, "SELECT spec FROM runs WHERE id = $1", 1, p, &r);
    if (rc < 0) return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return rf_fail(RF_ERR_NOT_FOUND, "store: no run '%s'", run_id);
    }
    *spec = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return *spec ? RF_OK : RF_ERR_NOMEM;
}

int rf_store_run_seal(rf_store *s, const char *run_id) {
    const char *p[] = {run_id};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "UPDATE runs SET sealed_at = coalesce(sealed_at, now()),"
                           " updated_at = now() WHERE id = $1",
                           1, p, &r);
    if (rc < 0) return rc;
    int n = atoi(PQcmdTuples(r));
    PQclear(r);
    return n == 1 ? RF_OK : rf_fail(RF_ERR_NOT_FOUND, "store: no run '%s'", run_id);
}

int rf_store_run_list(rf_store *s, size_t cap, rf_store_run *out, size_t *n) {
    char limit[32];
    snprintf(limit, sizeof limit, "%zu", cap);
    const char *p[] = {limit};
    PGresult *r;
    int rc = rf_store_exec(
        s, "SELECT " RF_STORE_RUN_COLUMNS " FROM runs ORDER BY created_at DESC, id LIMIT $1", 1, p,
        &r);
    if (rc < 0) return rc;
    *n = (size_t)PQntuples(r);
    for (size_t i = 0; i < *n; i++)
        store_run_from_row(r, (int)i, &out[i]);
    PQclear(r);
    return RF_OK;
}

int rf_store_stage_complete(rf_store *s, const char *run_id, const char *const *chain, size_t n,
                            bool *complete) {
    rf_store_run run;
    int rc = rf_store_run_get(s, run_id, &run);
    if (rc < 0) return rc;
    *complete = run.sealed;
    for (size_t i = 0; *complete && i + 1 < n; i++) {
        const char *p[] = {run_id, chain[i], chain[i + 1]};
        PGresult *r;
        rc = rf_store_exec(s,
                           "SELECT count(*) FROM stage_progress u"
                           " WHERE u.run_id = $1 AND u.stage = $2 AND u.docs_out > 0"
                           " AND NOT EXISTS (SELECT 1 FROM stage_progress d"
                           "  WHERE d.run_id = $1 AND d.stage = $3 AND d.batch_seq = u.batch_seq)",
                           3, p, &r);
        if (rc < 0) return rc;
        *complete = strtoll(PQgetvalue(r, 0, 0), NULL, 10) == 0;
        PQclear(r);
    }
    return RF_OK;
}
