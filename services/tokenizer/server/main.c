/* refinery-tokenizer: the tokenizer service. Kafka docs.unique
 * (DocumentBatch) -> tokens.train / tokens.eval (TokenBatch, split by cluster
 * hash as the embedded stage splits), per-batch counts in PostgreSQL; and
 * gRPC refinery.v1.Tokenizer/Tokenize for ad-hoc requests, plus
 * grpc.health.v1. Without --kafka only the gRPC side runs. SIGTERM: finish
 * and commit the poll in progress, let running calls finish (up to --grace
 * seconds), exit 0. See services/README.md and tokenizer_service.h. */
#include <stdio.h>
#include <stdlib.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "runtime/kafka/kafka.h"
#include "runtime/ready.h"
#include "runtime/rpc/rpc.h"
#include "runtime/store/store.h"
#include "runtime/stage_loop.h"
#include "runtime/svc.h"
#include "runtime/svc_main.h"
#include "tokenizer/server/tokenizer_service.h"

#define HEALTH "refinery.v1.Tokenizer"

typedef struct config {
    rf_svc_grpc grpc;
    rf_svc_kafka kafka;
    const char *pg, *tokenizer, *group;
    const char *topic_in, *topic_train, *topic_eval;
    int64_t max_messages, seed;
    double eval_fraction, ready_interval_s;
    bool no_special;
} config;

/* The consume side, until a termination signal (or a failure). */
static int consume(const config *c, const rf_kafka_opts *ko, rf_tokenizer_service *svc,
                   rf_kafka_producer *producer, rf_stats *stats) {
    rf_store *store = NULL;
    rf_store_opts sto = {.conninfo = c->pg};
    rf_stage_loop l = {.stage = "tokenizer",
                       .producer = producer,
                       .max_messages = (size_t)c->max_messages,
                       .delivery_timeout_s = c->kafka.delivery_timeout_s,
                       .identify = rf_stage_identify_batch,
                       .process = rf_tokenizer_service_process,
                       .user = svc,
                       .stats = stats,
                       .upstream = "dedup"};
    int rc = rf_store_open(&sto, &store);
    l.store = store;
    const char *topics[] = {c->topic_in, c->topic_train, c->topic_eval};
    if (!rc) rc = rf_svc_kafka_topics(&c->kafka, ko, topics, 3);
    if (!rc) rc = rf_kafka_consumer_new(ko, c->group, &c->topic_in, 1, &l.consumer);
    if (!rc) {
        rf_info("tokenizer", "%s -> %s / %s at %s", c->topic_in, c->topic_train, c->topic_eval,
                c->kafka.bootstrap);
        rc = rf_stage_loop_run(&l);
    }
    if (rc) rf_error("tokenizer", "consumer stopped: %s", rf_errmsg());
    rf_kafka_consumer_free(l.consumer);
    rf_store_close(store);
    return rc;
}

static int register_methods(void *svc, rf_rpc_server *server) {
    return rf_tokenizer_service_register(svc, server);
}

static int serve(void *cfg) {
    config *c = cfg;
    rf_kafka_opts ko;
    rf_kafka_producer *producer = NULL;
    rf_tokenizer_service *svc = NULL;
    rf_rpc_server *server = NULL;
    rf_ready *ready = NULL;
    rf_stats *stats = rf_stats_new();
    rf_tokenizer_service_opts so = {.tokenizer = c->tokenizer,
                                    .add_special = !c->no_special,
                                    .eval_fraction = c->eval_fraction,
                                    .seed = (uint64_t)c->seed,
                                    .topic_train = c->topic_train,
                                    .topic_eval = c->topic_eval,
                                    .stats = stats};
    int rc = stats ? RF_OK : RF_ERR_NOMEM;
    if (!rc && c->kafka.bootstrap) rc = rf_svc_kafka_opts(&c->kafka, "refinery-tokenizer", &ko);
    if (!rc && c->kafka.bootstrap && !(rc = rf_kafka_producer_new(&ko, &producer)))
        so.producer = producer;
    if (!rc) rc = rf_tokenizer_service_new(&so, &svc);
    if (!rc) rc = rf_svc_grpc_open(&c->grpc, register_methods, svc, HEALTH, &server);
    /* Readiness of the consume side: NOT_SERVING while PostgreSQL or Kafka
     * does not answer. */
    if (!rc && producer && !(rc = rf_ready_new(server, HEALTH, c->ready_interval_s, &ready)) &&
        !(rc = rf_ready_add_pg(ready, c->pg)) && !(rc = rf_ready_add_kafka(ready, producer)) &&
        !(rc = rf_ready_heartbeat(ready, "tokenizer")))
        rc = rf_ready_start(ready);
    if (rc) {
        rf_error("tokenizer", "cannot start: %s", rf_errmsg());
    } else {
        rf_info("tokenizer", "serving Tokenizer.Tokenize on port %d with %s",
                rf_rpc_server_port(server), c->tokenizer);
        if (producer)
            rc = consume(c, &ko, svc, producer, stats);
        else
            rf_svc_wait_signal(-1);
        rf_ready_free(ready);
        ready = NULL;
        rf_info("tokenizer", "stopping (calls get up to %.0fs)", c->grpc.grace_s);
        rf_svc_grpc_close(&c->grpc, server, HEALTH, stats);
        server = NULL;
        rf_svc_log_stats("tokenizer", stats);
    }
    rf_ready_free(ready);
    rf_svc_grpc_close(&c->grpc, server, HEALTH, NULL);
    rf_tokenizer_service_free(svc);
    rf_kafka_producer_free(producer);
    rf_stats_free(stats);
    rf_svc_kafka_free(&c->kafka);
    return rc;
}

static int check(void *cfg) {
    config *c = cfg;
    if (!c->tokenizer)
        return rf_fail(RF_ERR_INVALID, "--tokenizer / REFINERY_TOKENIZER is required");
    if (c->kafka.bootstrap && !c->pg)
        return rf_fail(RF_ERR_INVALID, "--pg / REFINERY_PG is required with --kafka");
    int rc = rf_svc_grpc_check(&c->grpc);
    if (rc) return rc;
    if (c->max_messages < 1 || c->max_messages > 100000 || c->eval_fraction < 0 ||
        c->eval_fraction > 1 || c->seed < 0 || c->kafka.delivery_timeout_s <= 0 ||
        !(c->ready_interval_s > 0))
        return rf_fail(RF_ERR_INVALID, "a numeric option is out of range (see --help)");
    return RF_OK;
}

int main(int argc, char **argv) {
    config c = {0};
    const rf_opt opts[] = {
        {"tokenizer", "REFINERY_TOKENIZER", RF_OPT_STR, &c.tokenizer, NULL,
         "tokenizer.json (or vocab.txt, vocab.json+merges.txt, a directory) (required)"},
        RF_SVC_GRPC_OPTS(&c.grpc, "127.0.0.1:7103"),
        RF_SVC_KAFKA_OPTS(&c.kafka, "Kafka bootstrap servers host:port,...; unset: gRPC only"),
        {"pg", "REFINERY_PG", RF_OPT_STR, &c.pg, NULL,
         "PostgreSQL connection string (required with --kafka): per-batch progress"},
        {"group", "REFINERY_TOKENIZER_GROUP", RF_OPT_STR, &c.group, "refinery-tokenizer",
         "Kafka consumer group"},
        {"topic-in", "REFINERY_TOPIC_UNIQUE", RF_OPT_STR, &c.topic_in, "docs.unique",
         "input topic (DocumentBatch)"},
        {"topic-train", "REFINERY_TOPIC_TRAIN", RF_OPT_STR, &c.topic_train, "tokens.train",
         "topic for the train split (TokenBatch)"},
        {"topic-eval", "REFINERY_TOPIC_EVAL", RF_OPT_STR, &c.topic_eval, "tokens.eval",
         "topic for the eval split (TokenBatch, eval set)"},
        {"eval-fraction", "REFINERY_EVAL_FRACTION", RF_OPT_REAL, &c.eval_fraction, "0.1",
         "share of clusters in the eval split (as the tokenizer stage's eval_fraction)"},
        {"seed", "REFINERY_SPLIT_SEED", RF_OPT_INT, &c.seed, "0", "split seed"},
        {"no-special-tokens", "REFINERY_NO_SPECIAL_TOKENS", RF_OPT_BOOL, &c.no_special, "false",
         "consume path: do not add special tokens (Tokenize has its own flag)"},
        {"max-messages", "REFINERY_MAX_MESSAGES", RF_OPT_INT, &c.max_messages, "16",
         "input batches per poll (committed together)"},
        {"ready-interval", "REFINERY_READY_INTERVAL", RF_OPT_REAL, &c.ready_interval_s, "3",
         "seconds between readiness probes of PostgreSQL and Kafka (with --kafka)"},
    };
    const rf_svc_def def = {"tokenizer",
                            "Tokenizer service: docs.unique -> tokens.train / tokens.eval, and "
                            "gRPC Tokenizer.Tokenize.",
                            opts,
                            sizeof opts / sizeof opts[0],
                            check,
                            serve,
                            &c};
    return rf_svc_main(&def, argc, argv);
}
