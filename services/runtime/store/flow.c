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
                           " sealed_batches = coalesce(sealed_batches, (SELECT count(*)"
                           "  FROM stage_progress p WHERE p.run_id = $1 AND p.stage = 'ingest'"
                           "  AND p.docs_out > 0)),"
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

int rf_store_missing_batches(rf_store *s, const char *upstream, const char *stage, size_t cap,
                             rf_store_missing *out, size_t *n) {
    char limit[32];
    snprintf(limit, sizeof limit, "%zu", cap);
    const char *p[] = {upstream, stage, limit};
    PGresult *r;
    *n = 0;
    int rc = rf_store_exec(
        s,
        "SELECT u.run_id, count(*) FILTER (WHERE d.batch_seq IS NULL), count(*),"
        " coalesce(min(r.sealed_batches), -1),"
        " min(u.batch_seq) FILTER (WHERE d.batch_seq IS NULL),"
        " max(u.batch_seq) FILTER (WHERE d.batch_seq IS NULL), min(u.batch_seq), max(u.batch_seq)"
        " FROM stage_progress u JOIN runs r ON r.id = u.run_id"
        " LEFT JOIN stage_progress d ON d.run_id = u.run_id AND d.stage = $2"
        "  AND d.batch_seq = u.batch_seq"
        " WHERE u.stage = $1 AND u.docs_out > 0 AND r.state IN ('pending', 'running')"
        " GROUP BY u.run_id HAVING count(*) FILTER (WHERE d.batch_seq IS NULL) > 0"
        " ORDER BY min(r.created_at), u.run_id LIMIT $3",
        3, p, &r);
    if (rc < 0) return rc;
    *n = (size_t)PQntuples(r);
    for (size_t i = 0; i < *n; i++) {
        rf_store_missing *m = &out[i];
        int row = (int)i;
        snprintf(m->run_id, sizeof m->run_id, "%s", PQgetvalue(r, row, 0));
        m->missing = strtoll(PQgetvalue(r, row, 1), NULL, 10);
        m->expected = strtoll(PQgetvalue(r, row, 2), NULL, 10);
        m->sealed_batches = strtoll(PQgetvalue(r, row, 3), NULL, 10);
        m->first = strtoull(PQgetvalue(r, row, 4), NULL, 10);
        m->last = strtoull(PQgetvalue(r, row, 5), NULL, 10);
        m->seq_lo = strtoull(PQgetvalue(r, row, 6), NULL, 10);
        m->seq_hi = strtoull(PQgetvalue(r, row, 7), NULL, 10);
    }
    PQclear(r);
    return RF_OK;
}

int rf_store_gap_add(rf_store *s, const char *stage, const char *topic, int32_t partition,
                     int64_t from, int64_t to) {
    char ps[16], fs[32], ts[32];
    snprintf(ps, sizeof ps, "%d", (int)partition);
    snprintf(fs, sizeof fs, "%lld", (long long)from);
    snprintf(ts, sizeof ts, "%lld", (long long)to);
    const char *p[] = {stage, topic, ps, fs, ts};
    return rf_store_exec(s,
                         "INSERT INTO input_gaps (stage, topic, partition, from_offset, to_offset)"
                         " VALUES ($1, $2, $3, $4, $5)"
                         " ON CONFLICT (stage, topic, partition, from_offset) DO UPDATE"
                         " SET to_offset = greatest(input_gaps.to_offset, excluded.to_offset)",
                         5, p, NULL);
}

int rf_store_gap_last(rf_store *s, const char *stage, const char *topic, int32_t partition,
                      int64_t *from, int64_t *to) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", (int)partition);
    const char *p[] = {stage, topic, ps};
    PGresult *r;
    int rc = rf_store_exec(s,
                           "SELECT from_offset, to_offset FROM input_gaps WHERE stage = $1"
                           " AND topic = $2 AND partition = $3"
                           " ORDER BY detected_at DESC, from_offset DESC LIMIT 1",
                           3, p, &r);
    if (rc < 0) return rc;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return RF_ERR_NOT_FOUND;
    }
    *from = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    *to = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    PQclear(r);
    return RF_OK;
}

int rf_store_run_fail(rf_store *s, const char *run_id, const char *reason, bool *failed) {
    const char *p[] = {run_id, reason};
    PGresult *r;
    *failed = false;
    int rc = rf_store_exec(s,
                           "WITH f AS (UPDATE runs SET state = 'failed', error = $2,"
                           " updated_at = now() WHERE id = $1"
                           " AND state IN ('pending', 'running') RETURNING id)"
                           " SELECT (SELECT count(*) FROM f), (SELECT count(*) FROM runs"
                           " WHERE id = $1)",
                           2, p, &r);
    if (rc < 0) return rc;
    *failed = strtoll(PQgetvalue(r, 0, 0), NULL, 10) == 1;
    bool exists = strtoll(PQgetvalue(r, 0, 1), NULL, 10) == 1;
    PQclear(r);
    return exists ? RF_OK : rf_fail(RF_ERR_NOT_FOUND, "store: no run '%s'", run_id);
}
