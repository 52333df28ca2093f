/* refinery-evaluator: the evaluator service. Kafka tokens.eval (TokenBatch)
 * -> per-run intake files under --state, per-batch rows in PostgreSQL (stage
 * evaluator); Kafka `checkpoints` (CheckpointAnnounce) -> the checkpoint
 * evaluated on the run's eval split once it is complete, metrics in
 * eval_results, the run succeeded after its final checkpoint; gRPC
 * refinery.v1.Evaluator/Classify and /Generate (--models), plus grpc.health.v1. Without --kafka
 * only the gRPC side runs. SIGTERM: finish and commit the poll in progress, stop waiting for
 * incomplete runs (their announcement is not committed), let running calls finish (up to --grace
 * seconds), exit 0. See services/README.md and evaluator_service.h. */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "common/log.h"
#include "runtime/kafka/kafka.h"
#include "runtime/rpc/rpc.h"
#include "runtime/store/store.h"
#include "evaluator/server/evaluator_service.h"
#include "runtime/ready.h"
#include "runtime/stage_loop.h"
#include "runtime/svc.h"
#include "runtime/svc_main.h"

#define HEALTH "refinery.v1.Evaluator"

typedef struct config {
    rf_svc_grpc grpc;
    rf_svc_kafka kafka;
    const char *pg, *state, *group, *checkpoint_group, *topic_eval, *topic_checkpoints, *models;
    int64_t max_messages, max_len, batch_size, max_texts, cache, threads, max_new_tokens, lm_cache;
    double ready_interval_s;
} config;

typedef struct checkpoint_thread {
    rf_evaluator_service *svc;
    rf_kafka_consumer *consumer;
    rf_store *store;
    int rc;
} checkpoint_thread;

static void *checkpoints_main(void *arg) {
    checkpoint_thread *ct = arg;
    ct->rc = rf_evaluator_checkpoint_loop(ct->svc, ct->consumer, ct->store);
    if (ct->rc) rf_error("evaluator", "checkpoint consumer stopped: %s", rf_errmsg());
    rf_svc_request_stop();
    return NULL;
}

/* The options of the checkpoint consumer: the user's, and a poll interval
 * long enough to wait for a run's intake or evaluate a large split between
 * two polls without being dropped from the group. */
static const char **checkpoint_props(const rf_kafka_opts *ko) {
    size_t n = 0;
    while (ko->extra && ko->extra[n])
        n++;
    const char **p = calloc(n + 3, sizeof *p);
    if (!p) return NULL;
    for (size_t i = 0; i < n; i++)
        p[i] = ko->extra[i];
    p[n] = "max.poll.interval.ms";
    p[n + 1] = "86400000";
    return p;
}

/* Both consumers, until a termination signal (or a failure). */
static int consume(const config *c, const rf_kafka_opts *ko, rf_evaluator_service *svc,
                   rf_stats *stats) {
    rf_store *store = NULL;
    rf_store_opts sto = {.conninfo = c->pg};
    rf_stage_loop l = {.stage = "evaluator",
                       .max_messages = (size_t)c->max_messages,
                       .identify = rf_stage_identify_batch,
                       .process = rf_evaluator_service_intake,
                       .user = svc,
                       .stats = stats,
                       .upstream = "tokenizer"};
    checkpoint_thread ct = {.svc = svc};
    rf_kafka_opts cko = *ko;
    const char **props = checkpoint_props(ko);
    cko.extra = props;
    pthread_t th;
    bool started = false;
    int rc = props ? RF_OK : RF_ERR_NOMEM;
    if (!rc) rc = rf_store_open(&sto, &store);
    l.store = store;
    if (!rc) rc = rf_store_open(&sto, &ct.store);
    const char *topics[] = {c->topic_eval, c->topic_checkpoints};
    if (!rc) rc = rf_svc_kafka_topics(&c->kafka, ko, topics, 2);
    if (!rc) rc = rf_kafka_consumer_new(ko, c->group, &c->topic_eval, 1, &l.consumer);
    if (!rc)
        rc = rf_kafka_consumer_new(&cko, c->checkpoint_group, &c->topic_checkpoints, 1,
                                   &ct.consumer);
    if (!rc && pthread_create(&th, NULL, checkpoints_main, &ct) != 0)
        rc = rf_fail(RF_ERR_INTERNAL, "cannot start the checkpoint thread");
    started = rc == RF_OK;
    if (!rc) {
        rf_info("evaluator", "%s -> intake in %s; %s -> eval_results; Kafka at %s", c->topic_eval,
                c->state, c->topic_checkpoints, c->kafka.bootstrap);
        rc = rf_stage_loop_run(&l);
        if (rc) rf_error("evaluator", "intake consumer stopped: %s", rf_errmsg());
        rf_svc_request_stop();
    }
    if (started) {
        pthread_join(th, NULL);
        if (!rc) rc = ct.rc;
    }
    if (rc && !started) rf_error("evaluator", "cannot consume: %s", rf_errmsg());
    rf_kafka_consumer_free(ct.consumer);
    rf_kafka_consumer_free(l.consumer);
    rf_store_close(ct.store);
    rf_store_close(store);
    free(props);
    return rc;
}

static int register_methods(void *svc, rf_rpc_server *server) {
    return rf_evaluator_service_register(svc, server);
}

/* Readiness: NOT_SERVING while PostgreSQL (or Kafka, with --kafka: probed
 * through a producer of its own, the consumers having no metadata call that
 * bounds its wait) does not answer; the evaluator heartbeat (liveness). */
static int start_ready(const config *c, const rf_kafka_opts *ko, rf_rpc_server *server,
                       rf_kafka_producer **probe, rf_ready **out) {
    int rc = rf_ready_new(server, HEALTH, c->ready_interval_s, out);
    if (!rc) rc = rf_ready_add_pg(*out, c->pg);
    if (!rc && c->kafka.bootstrap) rc = rf_kafka_producer_new(ko, probe);
    if (!rc && *probe) rc = rf_ready_add_kafka(*out, *probe);
    if (!rc) rc = rf_ready_heartbeat(*out, "evaluator");
    if (!rc) rc = rf_ready_start(*out);
    return rc;
}

static int serve(void *cfg) {
    config *c = cfg;
    rf_kafka_opts ko;
    rf_evaluator_service *svc = NULL;
    rf_rpc_server *server = NULL;
    rf_kafka_producer *probe = NULL;
    rf_ready *ready = NULL;
    rf_stats *stats = rf_stats_new();
    rf_evaluator_service_opts so = {.state_dir = c->state,
                                    .pg = c->pg,
                                    .max_len = (int)c->max_len,
                                    .batch_size = (int)c->batch_size,
                                    .max_texts = (int)c->max_texts,
                                    .cache = (int)c->cache,
                                    .models_dir = c->models,
                                    .max_new_tokens = (int)c->max_new_tokens,
                                    .lm_cache = (int)c->lm_cache};
    if (c->threads > 0) omp_set_num_threads((int)c->threads);
    int rc = stats ? RF_OK : RF_ERR_NOMEM;
    if (!rc && c->kafka.bootstrap) rc = rf_svc_kafka_opts(&c->kafka, "refinery-evaluator", &ko);
    if (!rc) rc = rf_evaluator_service_new(&so, &svc);
    if (!rc) rc = rf_svc_grpc_open(&c->grpc, register_methods, svc, HEALTH, &server);
    if (!rc) rc = start_ready(c, &ko, server, &probe, &ready);
    if (rc) {
        rf_error("evaluator", "cannot start: %s", rf_errmsg());
    } else {
        rf_info("evaluator", "serving Evaluator.Classify and Generate (models: %s) on port %d",
                c->models ? c->models : "none", rf_rpc_server_port(server));
        if (c->kafka.bootstrap)
            rc = consume(c, &ko, svc, stats);
        else
            rf_svc_wait_signal(-1);
        rf_info("evaluator", "stopping (calls get up to %.0fs)", c->grpc.grace_s);
        rf_ready_free(ready); /* before NOT_SERVING, which a probe would undo */
        ready = NULL;
        rf_svc_grpc_close(&c->grpc, server, HEALTH, stats);
        server = NULL;
        rf_stats_merge(stats, rf_evaluator_service_stats(svc));
        rf_svc_log_stats("evaluator", stats);
    }
    rf_ready_free(ready);
    rf_svc_grpc_close(&c->grpc, server, HEALTH, NULL);
    rf_kafka_producer_free(probe);
    rf_evaluator_service_free(svc);
    rf_stats_free(stats);
    rf_svc_kafka_free(&c->kafka);
    return rc;
}

static int check(void *cfg) {
    config *c = cfg;
    if (!c->pg) return rf_fail(RF_ERR_INVALID, "--pg / REFINERY_PG is required");
    if (c->kafka.bootstrap && !c->state)
        return rf_fail(RF_ERR_INVALID,
                       "--state / REFINERY_EVALUATOR_STATE is required with --kafka");
    int rc = rf_svc_grpc_check(&c->grpc);
    if (rc) return rc;
    if (c->max_messages < 1 || c->max_messages > 100000 || c->max_len < 2 || c->max_len > 65536 ||
        c->batch_size < 1 || c->batch_size > 4096 || c->max_texts < 1 || c->max_texts > 1000000 ||
        c->cache < 1 || c->cache > 64 || c->threads < 0 || c->threads > 1024 ||
        c->max_new_tokens < 1 || c->max_new_tokens > 1 << 20 || c->lm_cache < 1 ||
        c->lm_cache > 64 || !(c->ready_interval_s > 0))
        return rf_fail(RF_ERR_INVALID, "a numeric option is out of range (see --help)");
    return RF_OK;
}

int main(int argc, char **argv) {
    config c = {0};
    const rf_opt opts[] = {
        RF_SVC_GRPC_OPTS(&c.grpc, "127.0.0.1:7105"),
        RF_SVC_KAFKA_OPTS(&c.kafka, "Kafka bootstrap servers host:port,...; unset: gRPC only"),
        {"pg", "REFINERY_PG", RF_OPT_STR, &c.pg, NULL,
         "PostgreSQL connection string (required): runs, checkpoints, progress, results"},
        {"state", "REFINERY_EVALUATOR_STATE", RF_OPT_STR, &c.state, NULL,
         "directory of the eval intake files (required with --kafka)"},
        {"group", "REFINERY_EVALUATOR_GROUP", RF_OPT_STR, &c.group, "refinery-evaluator",
         "Kafka consumer group of the tokens.eval intake"},
        {"checkpoint-group", "REFINERY_EVALUATOR_CHECKPOINT_GROUP", RF_OPT_STR, &c.checkpoint_group,
         "refinery-evaluator-checkpoints", "Kafka consumer group of the checkpoint announcements"},
        {"topic-eval", "REFINERY_TOPIC_EVAL", RF_OPT_STR, &c.topic_eval, "tokens.eval",
         "input topic of the eval split (TokenBatch)"},
        {"topic-checkpoints", "REFINERY_TOPIC_CHECKPOINTS", RF_OPT_STR, &c.topic_checkpoints,
         "checkpoints", "topic of the trainer's CheckpointAnnounce messages"},
        {"max-messages", "REFINERY_MAX_MESSAGES", RF_OPT_INT, &c.max_messages, "16",
         "input batches per poll (committed together)"},
        {"max-len", "REFINERY_EVAL_MAX_LEN", RF_OPT_INT, &c.max_len, "128",
         "tokens per sequence for evaluation and Classify (capped by the model)"},
        {"batch-size", "REFINERY_EVAL_BATCH", RF_OPT_INT, &c.batch_size, "32",
         "sequences per forward pass"},
        {"max-texts", "REFINERY_CLASSIFY_MAX_TEXTS", RF_OPT_INT, &c.max_texts, "256",
         "Classify: texts per request (more: INVALID_ARGUMENT)"},
        {"cache", "REFINERY_CLASSIFY_CACHE", RF_OPT_INT, &c.cache, "2",
         "Classify: checkpoint folders kept loaded"},
        {"models", "REFINERY_EVALUATOR_MODELS", RF_OPT_STR, &c.models, NULL,
         "Generate: directory of the causal LMs it may load (folders or .gguf files); unset: "
         "Generate is refused"},
        {"max-new-tokens", "REFINERY_GENERATE_MAX_NEW_TOKENS", RF_OPT_INT, &c.max_new_tokens, "512",
         "Generate: most tokens one request may ask for"},
        {"lm-cache", "REFINERY_GENERATE_CACHE", RF_OPT_INT, &c.lm_cache, "1",
         "Generate: causal LMs kept loaded"},
        {"threads", "REFINERY_THREADS", RF_OPT_INT, &c.threads, "0",
         "CPU threads of a forward pass (0: all)"},
        {"ready-interval", "REFINERY_READY_INTERVAL", RF_OPT_REAL, &c.ready_interval_s, "3",
         "seconds between readiness probes of PostgreSQL and Kafka (and heartbeats)"},
    };
    const rf_svc_def def = {"evaluator",
                            "Evaluator service: tokens.eval intake, evaluation of announced "
                            "checkpoints into PostgreSQL, and gRPC Evaluator.Classify and "
                            "Evaluator.Generate.",
                            opts,
                            sizeof opts / sizeof opts[0],
                            check,
                            serve,
                            &c};
    return rf_svc_main(&def, argc, argv);
}
