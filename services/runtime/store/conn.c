/* Connection with retry and exponential backoff; statements with one retry
 * after a lost connection. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/log.h"
#include "common/obs.h"
#include "runtime/store/internal.h"

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* libpq messages end with a newline; keep the first line. */
static const char *first_line(const char *msg, char *buf, size_t size) {
    size_t n = strcspn(msg, "\n");
    if (n >= size) n = size - 1;
    memcpy(buf, msg, n);
    buf[n] = 0;
    return buf;
}

static void ignore_notice(void *arg, const char *msg) {}

/* PQconnectdb, but with verbose errors while connecting, so that a refusal
 * by the server carries its SQLSTATE ("FATAL:  3D000: database ..."); the
 * connection's later errors are in the default form again. timeout_s > 0
 * bounds the whole attempt (libpq's connect_timeout, which this replaces). */
static PGconn *connect_verbose(const char *conninfo, int timeout_s) {
    PGconn *c = PQconnectStart(conninfo);
    if (!c) return NULL;
    PQsetErrorVerbosity(c, PQERRORS_VERBOSE);
    double deadline = timeout_s > 0 ? (double)time(NULL) + timeout_s : 0;
    PostgresPollingStatusType st = PGRES_POLLING_WRITING;
    while (PQstatus(c) != CONNECTION_BAD && st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
        struct pollfd p = {.fd = PQsocket(c),
                           .events = st == PGRES_POLLING_READING ? POLLIN : POLLOUT};
        int ms = -1;
        if (deadline > 0) {
            double left = deadline - (double)time(NULL);
            if (left <= 0) break;
            ms = (int)(left * 1000);
        }
        if (poll(&p, 1, ms) == 0) break; /* timed out */
        st = PQconnectPoll(c);
    }
    if (PQstatus(c) == CONNECTION_OK) PQsetErrorVerbosity(c, PQERRORS_DEFAULT);
    return c;
}

/* A refusal no retry can fix: the database does not exist (3D000), or
 * authentication failed (28P01 password, 28000 e.g. no such role). */
static int permanent_refusal(const char *msg) {
    static const char *const codes[] = {"3D000", "28P01", "28000"};
    for (const char *p = strstr(msg, "FATAL:"); p; p = strstr(p + 1, "FATAL:")) {
        const char *q = p + 6;
        while (*q == ' ')
            q++;
        for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
            if (strncmp(q, codes[i], 5) == 0 && q[5] == ':') return 1;
    }
    return 0;
}

/* Checks the connection string before any attempt: one libpq cannot parse
 * is an error no retry fixes. Returns connect_timeout (0: none) in *timeout. */
static int check_conninfo(const char *conninfo, int *timeout) {
    char *err = NULL;
    PQconninfoOption *o = PQconninfoParse(conninfo, &err);
    *timeout = 0;
    if (!o) {
        char line[256];
        first_line(err ? err : "out of memory", line, sizeof line);
        PQfreemem(err);
        /* libpq quotes a bad URI whole; it may hold a password. */
        char *quoted = strstr(line, conninfo);
        if (quoted)
            snprintf(quoted, sizeof line - (size_t)(quoted - line), "%s",
                     quoted > line && quoted[-1] == '"' ? "(the string)\"" : "(the string)");
        return rf_fail(RF_ERR_INVALID, "store: invalid PostgreSQL connection string: %s", line);
    }
    for (PQconninfoOption *p = o; p->keyword; p++)
        if (strcmp(p->keyword, "connect_timeout") == 0 && p->val) *timeout = atoi(p->val);
    PQconninfoFree(o);
    if (*timeout == 0) {
        const char *env = getenv("PGCONNECT_TIMEOUT");
        if (env) *timeout = atoi(env);
    }
    /* libpq treats 1 as 2 seconds. */
    if (*timeout == 1) *timeout = 2;
    return RF_OK;
}

static int connect_with_backoff(rf_store *s) {
    double wait = s->backoff_s;
    char line[512] = "";
    int timeout;
    int rc = check_conninfo(s->conninfo, &timeout);
    if (rc < 0) return rc;
    for (int attempt = 1; attempt <= s->attempts; attempt++) {
        if (s->conn) PQfinish(s->conn);
        s->conn = connect_verbose(s->conninfo, timeout);
        if (!s->conn) return RF_ERR_NOMEM;
        if (PQstatus(s->conn) == CONNECTION_OK) {
            /* Notices (e.g. "relation already exists, skipping") are not ours to print. */
            PQsetNoticeProcessor(s->conn, ignore_notice, NULL);
            return RF_OK;
        }
        const char *msg = PQerrorMessage(s->conn);
        rf_obs_pg_error("connect");
        first_line(*msg ? msg : "connection timed out", line, sizeof line);
        if (permanent_refusal(msg)) {
            PQfinish(s->conn);
            s->conn = NULL;
            return rf_fail(RF_ERR_INVALID, "store: PostgreSQL refused the connection: %s", line);
        }
        if (attempt == s->attempts) break;
        rf_warn("store", "connect attempt %d/%d failed (%s); retrying in %.2fs", attempt,
                s->attempts, line, wait);
        sleep_s(wait);
        wait = wait * 2 > s->backoff_max_s ? s->backoff_max_s : wait * 2;
    }
    PQfinish(s->conn);
    s->conn = NULL;
    return rf_fail(RF_ERR_IO, "store: cannot connect after %d attempts: %s", s->attempts, line);
}

int store_exec_once(rf_store *s, const char *sql, int n, const char *const *params,
                    PGresult **res) {
    if (res) *res = NULL;
    if (!s->conn || PQstatus(s->conn) != CONNECTION_OK)
        return rf_fail(RF_ERR_IO, "store: not connected");
    PGresult *r = PQexecParams(s->conn, sql, n, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
        if (res)
            *res = r;
        else
            PQclear(r);
        return RF_OK;
    }
    char line[256];
    rf_obs_pg_error("query");
    const char *msg = r ? PQresultErrorMessage(r) : PQerrorMessage(s->conn);
    first_line(msg, line, sizeof line);
    PQclear(r);
    return rf_fail(RF_ERR_IO, "store: %s", line);
}

int rf_store_exec(rf_store *s, const char *sql, int n, const char *const *params, PGresult **res) {
    for (int retried = 0;; retried = 1) {
        if (!s->conn || PQstatus(s->conn) != CONNECTION_OK) {
            s->reconnects++;
            rf_warn("store", "connection lost; reconnecting");
            int rc = connect_with_backoff(s);
            if (rc < 0) return rc;
        }
        int rc = store_exec_once(s, sql, n, params, res);
        /* A failure that broke the connection is retried once on a new one;
         * a failure the server reported on a live connection is final. */
        if (rc == RF_OK || retried || PQstatus(s->conn) == CONNECTION_OK) return rc;
    }
}

int rf_store_open(const rf_store_opts *opts, rf_store **out) {
    *out = NULL;
    if (!opts->conninfo) return rf_fail(RF_ERR_INVALID, "store: no connection string");
    rf_store *s = calloc(1, sizeof *s);
    if (!s || !(s->conninfo = strdup(opts->conninfo))) {
        free(s);
        return RF_ERR_NOMEM;
    }
    s->attempts = opts->attempts > 0 ? opts->attempts : 10;
    s->backoff_s = opts->backoff_s > 0 ? opts->backoff_s : 0.1;
    s->backoff_max_s = opts->backoff_max_s > 0 ? opts->backoff_max_s : 5;
    int rc = connect_with_backoff(s);
    if (rc == RF_OK) rc = store_migrate(s);
    if (rc < 0) {
        rf_store_close(s);
        return rc;
    }
    *out = s;
    return RF_OK;
}

void rf_store_close(rf_store *s) {
    if (!s) return;
    if (s->conn) PQfinish(s->conn);
    free(s->conninfo);
    free(s);
}

int64_t rf_store_reconnects(const rf_store *s) {
    return s->reconnects;
}
