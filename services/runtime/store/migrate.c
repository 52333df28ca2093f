/* Schema migrations: all missing ones in one transaction, serialized across
 * processes by a transaction-level advisory lock (released at COMMIT or
 * ROLLBACK, also if the process dies). */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "common/log.h"
#include "runtime/store/internal.h"
#include "runtime/store/migrations.h"

/* Any constant unique to Refinery among the database's advisory lock users. */
#define MIGRATION_LOCK "7301842716524181"

static int apply_missing(rf_store *s, int *applied) {
    const char *lock[] = {MIGRATION_LOCK};
    int rc = store_exec_once(s, "SELECT pg_advisory_xact_lock($1::bigint)", 1, lock, NULL);
    if (rc < 0) return rc;
    rc = store_exec_once(s,
                         "CREATE TABLE IF NOT EXISTS schema_migrations ("
                         " version integer PRIMARY KEY, name text NOT NULL,"
                         " applied_at timestamptz NOT NULL DEFAULT now())",
                         0, NULL, NULL);
    for (int i = 0; i < rf_store_nmigrations && rc == RF_OK; i++) {
        const rf_store_migration *m = &rf_store_migrations[i];
        char version[16];
        snprintf(version, sizeof version, "%d", m->version);
        const char *p[] = {version, m->name};
        PGresult *r;
        rc = store_exec_once(s, "SELECT 1 FROM schema_migrations WHERE version = $1", 1, p, &r);
        if (rc < 0) break;
        int have = PQntuples(r) > 0;
        PQclear(r);
        if (have) continue;
        /* A migration is fixed SQL text of several statements, which only
         * the simple query protocol runs; it carries no values. */
        r = PQexec(s->conn, m->sql);
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
            rc = rf_fail(RF_ERR_IO, "store: migration %s failed: %s", m->name,
                         PQresultErrorMessage(r));
            PQclear(r);
            break;
        }
        PQclear(r);
        rc = store_exec_once(s, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", 2,
                             p, NULL);
        if (rc == RF_OK) {
            (*applied)++;
            rf_info("store", "applied migration %s", m->name);
        }
    }
    return rc;
}

int store_migrate(rf_store *s) {
    int rc = store_exec_once(s, "BEGIN", 0, NULL, NULL);
    if (rc < 0) return rc;
    int applied = 0;
    rc = apply_missing(s, &applied);
    if (rc == RF_OK) return store_exec_once(s, "COMMIT", 0, NULL, NULL);
    char why[512];
    snprintf(why, sizeof why, "%s", rf_errmsg());
    store_exec_once(s, "ROLLBACK", 0, NULL, NULL);
    return rf_fail(rc, "%s", why);
}

int rf_store_schema_version(rf_store *s, int *version) {
    PGresult *r;
    int rc =
        rf_store_exec(s, "SELECT coalesce(max(version), 0) FROM schema_migrations", 0, NULL, &r);
    if (rc < 0) return rc;
    *version = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return RF_OK;
}
