/* The one main() of every service binary (refinery-ingest, -dedup, -tokenizer,
 * -trainer, -evaluator): log setup, options from flags and environment
 * (runtime/svc.h), the service's own checks, signals, then its run function.
 * Exit status: 0 after a clean stop (or --help), 1 when run failed, 2 for a
 * usage error (the message names the option).
 *
 * Every service also gets --metrics-listen (REFINERY_METRICS_LISTEN): the
 * address of its Prometheus endpoint GET /metrics (runtime/metrics_http.h),
 * by default 127.0.0.1:9101 (ingest and Control), 9102 (dedup), 9103
 * (tokenizer), 9104 (trainer), 9105 (evaluator); "0" turns it off. A busy
 * default port only logs a warning; a busy address that was asked for fails
 * the start (exit 1).
 *
 * The Kafka-to-Kafka stages also share how they open what the stage loop
 * needs (rf_svc_stage_env): a producer, a PostgreSQL store and a consumer of
 * one input topic, and how they close them, in reverse order. */
#ifndef RF_RUNTIME_SVC_MAIN_H
#define RF_RUNTIME_SVC_MAIN_H

#include <stddef.h>

#include "runtime/kafka/kafka.h"
#include "runtime/stage_loop.h"
#include "runtime/store/store.h"
#include "runtime/svc.h"

typedef struct rf_svc_def {
    const char *name;    /* "dedup": log component; the binary is refinery-<name> */
    const char *summary; /* one line for --help */
    const rf_opt *opts;
    size_t nopts;
    /* After parsing: required options and ranges. Returns 0 or RF_ERR_INVALID
     * with rf_fail's message (printed, exit 2). Optional. */
    int (*check)(void *cfg);
    /* The service itself, with signals blocked (runtime/svc.h); returns when
     * stopped. 0: clean stop (exit 0), else exit 1. */
    int (*run)(void *cfg);
    void *cfg;
} rf_svc_def;

int rf_svc_main(const rf_svc_def *def, int argc, char **argv);

/* What a stage loop needs from the outside world. */
typedef struct rf_svc_stage_env {
    char client_id[64]; /* "refinery-<name>": ko.client_id points here */
    rf_kafka_opts ko;
    rf_kafka_producer *producer;
    rf_store *store;
    rf_kafka_consumer *consumer;
    rf_stats *stats;
    const rf_svc_kafka *kafka; /* borrowed from rf_svc_stage_env_open */
} rf_svc_stage_env;

/* Opens the stats, the Kafka options of k (client id refinery-<name>), a
 * producer and a store on conninfo pg. Everything opened is closed by
 * rf_svc_stage_env_close, also after a failure here. */
int rf_svc_stage_env_open(rf_svc_stage_env *e, const char *name, rf_svc_kafka *k, const char *pg);
/* Subscribes the consumer: group, one input topic, which is created first
 * when missing (rf_svc_kafka_topics: --topic-partitions, --create-topics). */
int rf_svc_stage_env_consume(rf_svc_stage_env *e, const char *group, const char *topic);
/* Fills the loop's consumer, producer, store and stats from e. */
void rf_svc_stage_env_wire(const rf_svc_stage_env *e, rf_stage_loop *l);
/* Frees the consumer, producer, store and stats (in that order); safe on a
 * partly opened or zeroed env. */
void rf_svc_stage_env_close(rf_svc_stage_env *e);

/* The gRPC side of a service: a server with g's options, whose methods
 * reg(user, server) adds, started, its `health` service marked SERVING, and
 * its port written to g's port file. On failure *out is still set when a
 * server was made (rf_svc_grpc_close frees it). */
int rf_svc_grpc_open(const rf_svc_grpc *g, int (*reg)(void *user, rf_rpc_server *s), void *user,
                     const char *health, rf_rpc_server **out);
/* For a service with no gRPC methods of its own (dedup, trainer): a server
 * with g's options serving only grpc.health.v1, with `health` NOT_SERVING
 * until the service marks itself ready with
 * rf_rpc_server_set_health(*out, health, 1). Opened first, so that a busy
 * port fails the start before any dependency is waited for. */
int rf_svc_health_open(const rf_svc_grpc *g, const char *health, rf_rpc_server **out);
/* Marks `health` NOT_SERVING, gives running calls g's grace period, merges
 * the server's counters into stats (may be NULL) and frees it. NULL is a
 * no-op. */
void rf_svc_grpc_close(const rf_svc_grpc *g, rf_rpc_server *s, const char *health, rf_stats *stats);

#endif
