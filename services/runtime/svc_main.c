#include "runtime/svc_main.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/obs.h"
#include "runtime/metrics_http.h"

/* The default /metrics address of each service: its gRPC port + 2000. */
static const char *metrics_default(const char *name) {
    static const struct {
        const char *name, *listen;
    } defs[] = {{"ingest", "127.0.0.1:9101"},
                {"dedup", "127.0.0.1:9102"},
                {"tokenizer", "127.0.0.1:9103"},
                {"trainer", "127.0.0.1:9104"},
                {"evaluator", "127.0.0.1:9105"}};
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
        if (!strcmp(defs[i].name, name)) return defs[i].listen;
    return "0";
}

/* Starts /metrics unless listen is "0". A busy default port only warns (so
 * that two services of one kind, or parallel tests, can share a machine); an
 * address given by flag or environment must work. */
static int metrics_start(const char *listen, const char *def, rf_metrics_http **out) {
    *out = NULL;
    if (!listen || !strcmp(listen, "0") || !*listen) return RF_OK;
    int rc = rf_metrics_http_start(listen, rf_prom_default(), out);
    if (rc < 0 && listen == def) {
        rf_warn("metrics", "%s; /metrics is off (set --metrics-listen)", rf_errmsg());
        return RF_OK;
    }
    if (rc == RF_OK)
        rf_info("metrics", "serving /metrics on %.*s:%d", (int)(strrchr(listen, ':') - listen),
                listen, rf_metrics_http_port(*out));
    return rc;
}

int rf_svc_main(const rf_svc_def *d, int argc, char **argv) {
    char prog[128];
    snprintf(prog, sizeof prog, "refinery-%s", d->name);
    rf_log_init_from_env();
    /* Every service's table gets --metrics-listen at its end. */
    const char *def = metrics_default(d->name), *mlisten = NULL;
    rf_opt *opts = calloc(d->nopts + 1, sizeof *opts);
    if (!opts) return 1;
    memcpy(opts, d->opts, d->nopts * sizeof *opts);
    opts[d->nopts] = (rf_opt){"metrics-listen",
                              "REFINERY_METRICS_LISTEN",
                              RF_OPT_STR,
                              &mlisten,
                              def,
                              "HTTP address of GET /metrics (Prometheus); 0 turns it off"};
    int rc = rf_svc_parse(prog, d->summary, opts, d->nopts + 1, argc, argv);
    free(opts);
    if (rc == 1) return 0; /* --help */
    if (rc == RF_OK && d->check) rc = d->check(d->cfg);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", prog, rf_errmsg());
        return 2;
    }
    if (rf_svc_signals_init() < 0) return 1;
    /* After the signal mask: the server thread inherits it. */
    rf_obs_init(d->name);
    rf_metrics_http *mh = NULL;
    if (metrics_start(mlisten, def, &mh) < 0) {
        fprintf(stderr, "%s: %s\n", prog, rf_errmsg());
        return 1;
    }
    rc = d->run(d->cfg) == RF_OK ? 0 : 1;
    rf_metrics_http_stop(mh);
    return rc;
}

int rf_svc_stage_env_open(rf_svc_stage_env *e, const char *name, rf_svc_kafka *k, const char *pg) {
    /* In e, not on this stack: the consumer made later reads ko.client_id. */
    snprintf(e->client_id, sizeof e->client_id, "refinery-%s", name);
    e->kafka = k;
    if (!(e->stats = rf_stats_new())) return RF_ERR_NOMEM;
    int rc = rf_svc_kafka_opts(k, e->client_id, &e->ko);
    if (!rc) rc = rf_kafka_producer_new(&e->ko, &e->producer);
    if (!rc) {
        rf_store_opts sto = {.conninfo = pg};
        rc = rf_store_open(&sto, &e->store);
    }
    return rc;
}

int rf_svc_stage_env_consume(rf_svc_stage_env *e, const char *group, const char *topic) {
    int rc = rf_svc_kafka_topics(e->kafka, &e->ko, &topic, 1);
    return rc < 0 ? rc : rf_kafka_consumer_new(&e->ko, group, &topic, 1, &e->consumer);
}

void rf_svc_stage_env_wire(const rf_svc_stage_env *e, rf_stage_loop *l) {
    l->consumer = e->consumer;
    l->producer = e->producer;
    l->store = e->store;
    l->stats = e->stats;
}

void rf_svc_stage_env_close(rf_svc_stage_env *e) {
    rf_kafka_consumer_free(e->consumer);
    rf_kafka_producer_free(e->producer);
    rf_store_close(e->store);
    rf_stats_free(e->stats);
    *e = (rf_svc_stage_env){0};
}

int rf_svc_grpc_open(const rf_svc_grpc *g, int (*reg)(void *user, rf_rpc_server *s), void *user,
                     const char *health, rf_rpc_server **out) {
    rf_rpc_server_opts ro = rf_svc_grpc_server_opts(g);
    *out = NULL;
    int rc = rf_rpc_server_new(&ro, out);
    if (!rc) rc = reg(user, *out);
    if (!rc) rc = rf_rpc_server_start(*out);
    if (!rc) rc = rf_rpc_server_set_health(*out, health, 1);
    if (!rc) rc = rf_svc_grpc_write_port(g, *out);
    return rc;
}

int rf_svc_health_open(const rf_svc_grpc *g, const char *health, rf_rpc_server **out) {
    rf_rpc_server_opts ro = rf_svc_grpc_server_opts(g);
    *out = NULL;
    int rc = rf_rpc_server_new(&ro, out);
    if (!rc) rc = rf_rpc_server_set_health(*out, health, 0);
    if (!rc) rc = rf_rpc_server_start(*out);
    if (!rc) rc = rf_svc_grpc_write_port(g, *out);
    return rc;
}

void rf_svc_grpc_close(const rf_svc_grpc *g, rf_rpc_server *s, const char *health,
                       rf_stats *stats) {
    if (!s) return;
    rf_rpc_server_set_health(s, health, 0);
    rf_rpc_server_stop(s, g->grace_s);
    if (stats) rf_stats_merge(stats, rf_rpc_server_stats(s));
    rf_rpc_server_free(s);
}
