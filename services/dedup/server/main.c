/* refinery-dedup: the dedup service. Kafka docs.clean (DocumentBatch) ->
 * the dedup engine, whose index lives in --index and survives restarts ->
 * docs.unique (kept documents) and docs.duplicates (the others), per-batch
 * counts in PostgreSQL, input offsets committed once all that is durable.
 * gRPC: grpc.health.v1 only (refinery.v1.Dedup SERVING once its Kafka,
 * PostgreSQL and index are open; Check and Watch).
 * SIGTERM: finish and commit the poll in progress, exit 0. See
 * services/README.md and dedup_service.h. */
#include <stdio.h>
#include <stdlib.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/log.h"
#include "dedup/server/dedup_service.h"
#include "runtime/kafka/kafka.h"
#include "runtime/ready.h"
#include "runtime/rpc/rpc.h"
#include "runtime/store/store.h"
#include "runtime/stage_loop.h"
#include "runtime/svc.h"
#include "runtime/svc_main.h"

#define HEALTH "refinery.v1.Dedup"

typedef struct config {
    rf_svc_grpc grpc;
    rf_svc_kafka kafka;
    const char *pg, *index, *group;
    const char *topic_in, *topic_unique, *topic_dups;
    int64_t threads, max_messages;
    double ready_interval_s;
} config;

static int run(void *cfg) {
    config *c = cfg;
    rf_svc_stage_env env = {0};
    rf_dedup_service *svc = NULL;
    rf_dedup_service_opts so = {
        .index_dir = c->index, .topic_unique = c->topic_unique, .topic_dups = c->topic_dups};
    rf_dedup_opts_default(&so.engine);
    so.engine.threads = (int)c->threads;
    rf_stage_loop l = {.stage = "dedup",
                       .max_messages = (size_t)c->max_messages,
                       .delivery_timeout_s = c->kafka.delivery_timeout_s,
                       .identify = rf_stage_identify_batch,
                       .process = rf_dedup_service_process,
                       .prepare = rf_dedup_service_prepare,
                       .upstream = "ingest"};
    rf_rpc_server *server = NULL;
    rf_ready *ready = NULL;
    int rc = rf_svc_health_open(&c->grpc, HEALTH, &server);
    if (!rc) rc = rf_svc_stage_env_open(&env, "dedup", &c->kafka, c->pg);
    so.producer = env.producer;
    if (!rc && !(rc = rf_dedup_service_open(&so, &svc))) l.user = svc;
    const char *topics[] = {c->topic_in, c->topic_unique, c->topic_dups};
    if (!rc) rc = rf_svc_kafka_topics(&c->kafka, &env.ko, topics, 3);
    if (!rc) rc = rf_svc_stage_env_consume(&env, c->group, c->topic_in);
    /* Readiness: NOT_SERVING while PostgreSQL or Kafka does not answer. */
    if (!rc) rc = rf_ready_new(server, HEALTH, c->ready_interval_s, &ready);
    if (!rc) rc = rf_ready_add_pg(ready, c->pg);
    if (!rc) rc = rf_ready_add_kafka(ready, env.producer);
    if (!rc) rc = rf_ready_heartbeat(ready, "dedup"); /* liveness: Control reads it */
    rf_svc_stage_env_wire(&env, &l);
    if (rc) {
        rf_error("dedup", "cannot start: %s", rf_errmsg());
    } else {
        rf_info("dedup", "%s -> %s / %s at %s, index %s, health on port %d", c->topic_in,
                c->topic_unique, c->topic_dups, c->kafka.bootstrap, c->index,
                rf_rpc_server_port(server));
        rf_rpc_server_set_health(server, HEALTH, 1);
        rc = rf_ready_start(ready);
        if (!rc) rc = rf_stage_loop_run(&l);
        if (rc) rf_error("dedup", "stopped on error: %s", rf_errmsg());
        rf_dedup_service_report(svc, env.stats);
        rf_svc_log_stats("dedup", env.stats);
    }
    rf_ready_free(ready);
    rf_svc_grpc_close(&c->grpc, server, HEALTH, NULL);
    rf_dedup_service_close(svc);
    rf_svc_stage_env_close(&env);
    rf_svc_kafka_free(&c->kafka);
    return rc;
}

static int check(void *cfg) {
    config *c = cfg;
    if (!c->kafka.bootstrap || !c->pg || !c->index)
        return rf_fail(RF_ERR_INVALID,
                       "--kafka, --pg and --index (or their variables) are required");
    if (c->threads < 1 || c->threads > 256 || c->max_messages < 1 || c->max_messages > 100000 ||
        !(c->ready_interval_s > 0))
        return rf_fail(RF_ERR_INVALID, "a numeric option is out of range (see --help)");
    return rf_svc_grpc_check(&c->grpc);
}

int main(int argc, char **argv) {
    config c = {0};
    const rf_opt opts[] = {
        RF_SVC_GRPC_OPTS(&c.grpc, "127.0.0.1:7102"),
        RF_SVC_KAFKA_OPTS(&c.kafka, "Kafka bootstrap servers host:port,... (required)"),
        {"pg", "REFINERY_PG", RF_OPT_STR, &c.pg, NULL,
         "PostgreSQL connection string (required): per-batch progress, replay detection"},
        {"index", "REFINERY_DEDUP_INDEX", RF_OPT_STR, &c.index, NULL,
         "dedup index directory (required); a restart on it continues its decisions"},
        {"group", "REFINERY_DEDUP_GROUP", RF_OPT_STR, &c.group, "refinery-dedup",
         "Kafka consumer group"},
        {"topic-in", "REFINERY_TOPIC_CLEAN", RF_OPT_STR, &c.topic_in, "docs.clean",
         "input topic (DocumentBatch)"},
        {"topic-unique", "REFINERY_TOPIC_UNIQUE", RF_OPT_STR, &c.topic_unique, "docs.unique",
         "topic for kept documents (DocumentBatch, cluster set)"},
        {"topic-duplicates", "REFINERY_TOPIC_DUPLICATES", RF_OPT_STR, &c.topic_dups,
         "docs.duplicates", "topic for duplicate documents (DocumentBatch, cluster set)"},
        {"threads", "REFINERY_THREADS", RF_OPT_INT, &c.threads, "1",
         "threads hashing and signing a batch (decisions do not depend on it)"},
        {"max-messages", "REFINERY_MAX_MESSAGES", RF_OPT_INT, &c.max_messages, "16",
         "input batches per poll (committed together)"},
        {"ready-interval", "REFINERY_READY_INTERVAL", RF_OPT_REAL, &c.ready_interval_s, "3",
         "seconds between readiness probes of PostgreSQL and Kafka"},
    };
    const rf_svc_def def = {"dedup", "Dedup service: docs.clean -> docs.unique; gRPC health only.",
                            opts,    sizeof opts / sizeof opts[0],
                            check,   run,
                            &c};
    return rf_svc_main(&def, argc, argv);
}
