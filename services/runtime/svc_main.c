#include "runtime/svc_main.h"

#include <stdio.h>

#include "common/error.h"
#include "common/log.h"

int rf_svc_main(const rf_svc_def *d, int argc, char **argv) {
    char prog[128];
    snprintf(prog, sizeof prog, "refinery-%s", d->name);
    rf_log_init_from_env();
    int rc = rf_svc_parse(prog, d->summary, d->opts, d->nopts, argc, argv);
    if (rc == 1) return 0; /* --help */
    if (rc == RF_OK && d->check) rc = d->check(d->cfg);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", prog, rf_errmsg());
        return 2;
    }
    if (rf_svc_signals_init() < 0) return 1;
    return d->run(d->cfg) == RF_OK ? 0 : 1;
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
