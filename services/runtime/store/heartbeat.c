/* Liveness: service heartbeats, and what Control reads to flag a stage that
 * is down (no recent heartbeat) or stalled (work waiting, no progress). Every
 * time is the database's clock, so hosts whose clocks differ agree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "runtime/store/internal.h"

int rf_store_heartbeat(rf_store *s, const char *service, const char *instance, double started_at,
                       bool ready, const char *reason) {
    char started[32];
    snprintf(started, sizeof started, "%.3f", started_at);
    const char *p[] = {service, instance, started, ready ? "true" : "false", reason ? reason : ""};
    int rc = rf_store_exec(s,
                           "INSERT INTO heartbeats (service, instance, started_at, ready, reason)"
                           " VALUES ($1, $2, to_timestamp($3::double precision), $4, $5)"
                           " ON CONFLICT (service, instance) DO UPDATE SET beat_at = now(),"
                           " started_at = EXCLUDED.started_at, ready = EXCLUDED.ready,"
                           " reason = EXCLUDED.reason",
                           5, p, NULL);
    if (rc < 0) return rc;
    return rf_store_exec(s,
                         "DELETE FROM heartbeats WHERE service = $1"
                         " AND beat_at < now() - interval '1 day'",
                         1, p, NULL);
}

static double col_epoch(const PGresult *r, int col) {
    return PQgetisnull(r, 0, col) ? 0 : strtod(PQgetvalue(r, 0, col), NULL);
}

int rf_store_liveness_get(rf_store *s, const char *run_id, const char *stage, const char *upstream,
                          rf_store_liveness *out) {
    memset(out, 0, sizeof *out);
    const char *p[] = {run_id, stage, upstream ? upstream : ""};
    PGresult *r;
    int rc = rf_store_exec(
        s,
        "WITH b AS (SELECT count(*) AS n, extract(epoch FROM min(u.recorded_at)) AS oldest"
        "  FROM stage_progress u WHERE u.run_id = $1 AND u.stage = $3 AND u.docs_out > 0"
        "  AND NOT EXISTS (SELECT 1 FROM stage_progress d"
        "   WHERE d.run_id = $1 AND d.stage = $2 AND d.batch_seq = u.batch_seq)),"
        " h AS (SELECT extract(epoch FROM beat_at) AS at, ready, reason FROM heartbeats"
        "  WHERE service = $2 ORDER BY beat_at DESC LIMIT 1)"
        " SELECT extract(epoch FROM now()),"
        "  extract(epoch FROM greatest("
        "   (SELECT max(recorded_at) FROM stage_progress WHERE run_id = $1 AND stage = $2),"
        "   (SELECT max(created_at) FROM checkpoints WHERE run_id = $1 AND $2 = 'trainer'),"
        "   (SELECT max(created_at) FROM eval_results WHERE run_id = $1 AND $2 = 'evaluator'))),"
        "  b.n, b.oldest, h.at, h.ready, h.reason"
        " FROM b LEFT JOIN h ON true",
        3, p, &r);
    if (rc < 0) return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return rf_fail(RF_ERR_IO, "store: liveness query returned no row");
    }
    out->now = col_epoch(r, 0);
    out->progress_at = col_epoch(r, 1);
    out->backlog = PQgetisnull(r, 0, 2) ? 0 : strtoll(PQgetvalue(r, 0, 2), NULL, 10);
    out->backlog_since = col_epoch(r, 3);
    out->heartbeat_at = col_epoch(r, 4);
    out->ready = !PQgetisnull(r, 0, 5) && PQgetvalue(r, 0, 5)[0] == 't';
    if (!PQgetisnull(r, 0, 6)) snprintf(out->reason, sizeof out->reason, "%s", PQgetvalue(r, 0, 6));
    PQclear(r);
    return RF_OK;
}
