#include "runtime/ready.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "runtime/store/store.h"

#define PROBE_TIMEOUT_S 2

struct rf_ready {
    rf_rpc_server *server;
    char *health;
    double interval_s;
    char *pg;                    /* NULL: not probed */
    rf_kafka_producer *producer; /* NULL: not probed */
    char *hb_service;            /* NULL: no heartbeat */
    char instance[128];          /* host:pid */
    double started_at;           /* unix seconds */
    rf_store *hb_store;          /* the heartbeat's connection, NULL while closed */
    int hb_failing;              /* the last heartbeat failed (logged once) */
    pthread_t thread;
    int started, stop, ok;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

int rf_ready_new(rf_rpc_server *server, const char *health, double interval_s, rf_ready **out) {
    *out = NULL;
    if (interval_s <= 0) return rf_fail(RF_ERR_INVALID, "ready: interval must be > 0");
    rf_ready *r = calloc(1, sizeof *r);
    if (!r || !(r->health = strdup(health))) {
        free(r);
        return RF_ERR_NOMEM;
    }
    r->server = server;
    r->interval_s = interval_s;
    r->ok = -1; /* not probed yet */
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    *out = r;
    return RF_OK;
}

int rf_ready_add_pg(rf_ready *r, const char *conninfo) {
    free(r->pg);
    return (r->pg = strdup(conninfo)) ? RF_OK : RF_ERR_NOMEM;
}

int rf_ready_heartbeat(rf_ready *r, const char *service) {
    if (!r->pg) return rf_fail(RF_ERR_INVALID, "ready: a heartbeat needs PostgreSQL (add_pg)");
    free(r->hb_service);
    if (!(r->hb_service = strdup(service))) return RF_ERR_NOMEM;
    char host[64] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown");
    snprintf(r->instance, sizeof r->instance, "%s:%ld", host, (long)getpid());
    r->started_at = (double)time(NULL);
    return RF_OK;
}

/* Writes the heartbeat; PostgreSQL answered the probe just now. */
static void beat(rf_ready *r, int ok, const char *down, const char *why) {
    char reason[320] = "";
    if (!ok) snprintf(reason, sizeof reason, "%s unreachable: %s", down, why);
    int rc = RF_OK;
    if (!r->hb_store) {
        rf_store_opts so = {.conninfo = r->pg, .attempts = 1};
        rc = rf_store_open(&so, &r->hb_store);
    }
    if (rc == RF_OK)
        rc = rf_store_heartbeat(r->hb_store, r->hb_service, r->instance, r->started_at, ok, reason);
    if (rc < 0) {
        if (!r->hb_failing)
            rf_warn("ready", "%s heartbeat not recorded: %s", r->hb_service, rf_errmsg());
        rf_store_close(r->hb_store);
        r->hb_store = NULL;
    } else if (r->hb_failing) {
        rf_info("ready", "%s heartbeat recorded again", r->hb_service);
    }
    r->hb_failing = rc < 0;
}

int rf_ready_add_kafka(rf_ready *r, rf_kafka_producer *p) {
    r->producer = p;
    return RF_OK;
}

/* The first dependency that does not answer, with the reason; NULL if all do. */
static const char *probe(rf_ready *r, char *why, size_t n) {
    if (r->pg) {
        /* connect_timeout after the expanded string overrides any in it. */
        const char *keys[] = {"dbname", "connect_timeout", NULL};
        const char *vals[] = {r->pg, "2", NULL};
        PGPing p = PQpingParams(keys, vals, 1);
        if (p != PQPING_OK) {
            snprintf(why, n, "%s",
                     p == PQPING_REJECT        ? "the server refuses connections"
                     : p == PQPING_NO_RESPONSE ? "no response"
                                               : "bad connection parameters");
            return "PostgreSQL";
        }
    }
    if (r->producer && rf_kafka_producer_ping(r->producer, PROBE_TIMEOUT_S) < 0) {
        snprintf(why, n, "%s", rf_errmsg());
        return "Kafka";
    }
    return NULL;
}

static void *run(void *arg) {
    rf_ready *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        pthread_mutex_unlock(&r->mu);
        char why[256] = "";
        const char *down = probe(r, why, sizeof why);
        if (r->hb_service && !(down && !strcmp(down, "PostgreSQL")))
            beat(r, down == NULL, down, why);
        pthread_mutex_lock(&r->mu);
        if (r->stop) break;
        int ok = down == NULL;
        if (ok != r->ok) {
            rf_rpc_server_set_health(r->server, r->health, ok);
            if (ok && r->ok == 0)
                rf_info("ready", "%s SERVING: its dependencies answer again", r->health);
            else if (!ok)
                rf_warn("ready", "%s NOT_SERVING: %s unreachable: %s", r->health, down, why);
            r->ok = ok;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + r->interval_s;
        until.tv_sec = (time_t)t;
        until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
        while (!r->stop && pthread_cond_timedwait(&r->cv, &r->mu, &until) == 0) {
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int rf_ready_start(rf_ready *r) {
    if (r->started) return rf_fail(RF_ERR_INVALID, "ready: already started");
    if (pthread_create(&r->thread, NULL, run, r) != 0)
        return rf_fail(RF_ERR_INTERNAL, "ready: cannot start the probe thread");
    r->started = 1;
    return RF_OK;
}

int rf_ready_ok(rf_ready *r) {
    pthread_mutex_lock(&r->mu);
    int ok = r->ok == 1;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void rf_ready_free(rf_ready *r) {
    if (!r) return;
    if (r->started) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    rf_store_close(r->hb_store);
    free(r->hb_service);
    free(r->pg);
    free(r->health);
    free(r);
}
