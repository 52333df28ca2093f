/* Internal to services/runtime/store. */
#ifndef RF_STORE_INTERNAL_H
#define RF_STORE_INTERNAL_H

#include "runtime/store/store.h"

struct rf_store {
    PGconn *conn;
    char *conninfo;
    int attempts;
    double backoff_s, backoff_max_s;
    int64_t reconnects;
};

/* One try on the current connection, no reconnect (inside transactions). */
int store_exec_once(rf_store *s, const char *sql, int n, const char *const *params, PGresult **res);
/* The columns store_run_from_row reads, in its order. */
#define RF_STORE_RUN_COLUMNS                                                                       \
    "id, state, coalesce(error, ''), extract(epoch FROM created_at),"                              \
    " extract(epoch FROM updated_at), sealed_at IS NOT NULL"
void store_run_from_row(const PGresult *r, int row, rf_store_run *out);

/* Applies missing migrations (store/migrations.h) under the advisory lock. */
int store_migrate(rf_store *s);

#endif
