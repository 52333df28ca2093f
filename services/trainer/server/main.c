/* refinery-trainer: the trainer service. Kafka tokens.train (TokenBatch) ->
 * per-run intake files in --state, per-batch counts in PostgreSQL (stage
 * "trainer"); a run whose intake is complete is trained in a background
 * thread with the hyper-parameters of its spec, each checkpoint exported to
 * --checkpoints, recorded in PostgreSQL and announced on `checkpoints`.
 * gRPC: grpc.health.v1 only (refinery.v1.Trainer SERVING once its Kafka and
 * PostgreSQL are open; Check and Watch).
 * SIGTERM: finish and commit the poll in progress, stop the training at a
 * saved state (it resumes on the next start), exit 0. See
 * services/README.md and trainer_service.h.
 * As a group (started by mpirun -np N, see group.h): rank 0 is the service
 * above; ranks 1..N-1 open no Kafka, PostgreSQL or port and train with it. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "comm/comm.h"
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
#include "trainer/server/group.h"
#include "trainer/server/trainer_service.h"

#define HEALTH "refinery.v1.Trainer"

typedef struct config {
    rf_svc_grpc grpc;
    rf_svc_kafka kafka;
    const char *pg, *state, *checkpoints, *model, *group, *topic_in, *topic_checkpoints;
    int64_t threads, max_messages;
    double cancel_poll_s, ready_interval_s;
} config;

/* Ranks 1..N-1 of a group: rank 0's commands until it says stop. */
static int follow(config *c, rf_comm *comm) {
    rf_tgroup_follower_opts fo = {
        .state_dir = c->state, .model = c->model, .threads = (int)c->threads};
    int rc = rf_mkdir_p(c->state);
    if (rc) rf_fail_ctx(rc, "--state %s", c->state);
    if (!rc) rc = rf_tgroup_follow(comm, &fo);
    if (rc)
        rf_error("trainer", "group: rank %d stops on error: %s", rf_comm_rank(comm), rf_errmsg());
    /* after a failure the others may be stuck in a collective: exit without
     * finalizing (comm.h), which ends the group under mpirun */
    if (!rc || rf_comm_broken(comm)) rf_comm_destroy(comm);
    rf_svc_kafka_free(&c->kafka);
    return rc;
}

static int run(void *cfg) {
    config *c = cfg;
    rf_comm *comm = NULL;
    if (rf_comm_init_from_env(NULL, &comm)) {
        rf_error("trainer", "cannot start the trainer group: %s", rf_errmsg());
        rf_svc_kafka_free(&c->kafka);
        return RF_ERR_INVALID;
    }
    int world = rf_comm_world(comm), rank = rf_comm_rank(comm);
    if (world > 1)
        rf_info("trainer", "group: rank %d of %d (pid %d, %s backend)", rank, world, (int)getpid(),
                rf_comm_backend_name(comm));
    if (rank > 0) return follow(c, comm);
    rf_svc_stage_env env = {0};
    rf_trainer_service *svc = NULL;
    rf_stage_loop l = {.stage = "trainer",
                       .max_messages = (size_t)c->max_messages,
                       .delivery_timeout_s = c->kafka.delivery_timeout_s,
                       .identify = rf_stage_identify_batch,
                       .process = rf_trainer_service_process,
                       .upstream = "tokenizer"};
    rf_rpc_server *server = NULL;
    rf_ready *ready = NULL;
    int rc = rf_svc_health_open(&c->grpc, HEALTH, &server);
    if (!rc) rc = rf_svc_stage_env_open(&env, "trainer", &c->kafka, c->pg);
    rf_trainer_service_opts so = {.state_dir = c->state,
                                  .checkpoints_dir = c->checkpoints,
                                  .model = c->model,
                                  .threads = (int)c->threads,
                                  .pg = c->pg,
                                  .store = env.store,
                                  .producer = env.producer,
                                  .topic_checkpoints = c->topic_checkpoints,
                                  .delivery_timeout_s = c->kafka.delivery_timeout_s,
                                  .cancel_poll_s = c->cancel_poll_s,
                                  .stats = env.stats,
                                  .comm = world > 1 ? comm : NULL};
    if (!rc && !(rc = rf_trainer_service_new(&so, &svc))) l.user = svc;
    const char *topics[] = {c->topic_in, c->topic_checkpoints};
    if (!rc) rc = rf_svc_kafka_topics(&c->kafka, &env.ko, topics, 2);
    if (!rc) rc = rf_svc_stage_env_consume(&env, c->group, c->topic_in);
    /* Readiness: NOT_SERVING while PostgreSQL or Kafka does not answer. */
    if (!rc) rc = rf_ready_new(server, HEALTH, c->ready_interval_s, &ready);
    if (!rc) rc = rf_ready_add_pg(ready, c->pg);
    if (!rc) rc = rf_ready_add_kafka(ready, env.producer);
    if (!rc) rc = rf_ready_heartbeat(ready, "trainer"); /* liveness: Control reads it */
    rf_svc_stage_env_wire(&env, &l);
    if (rc) {
        rf_error("trainer", "cannot start: %s", rf_errmsg());
    } else {
        rf_info("trainer", "%s -> %s, state %s, checkpoints %s at %s, health on port %d",
                c->topic_in, c->topic_checkpoints, c->state, c->checkpoints, c->kafka.bootstrap,
                rf_rpc_server_port(server));
        rf_rpc_server_set_health(server, HEALTH, 1);
        rc = rf_ready_start(ready);
        /* The stage loop's steps, with the training scheduler between polls. */
        while (!rc && !rf_svc_stopping()) {
            rc = rf_stage_loop_step(&l);
            if (rc >= 0) rc = rf_trainer_service_tick(svc);
        }
        if (rc < 0) rf_error("trainer", "stopped on error: %s", rf_errmsg());
    }
    rf_ready_free(ready);
    rf_svc_grpc_close(&c->grpc, server, HEALTH, NULL);
    bool group_ok = rf_trainer_service_group_ok(svc);
    rf_trainer_service_free(svc); /* stops a training at a saved state */
    /* the followers return on STOP; after a failed training of the group
     * they may be inside a collective: exit without finalizing instead */
    if (world > 1 && group_ok && !rf_comm_broken(comm) && rf_tgroup_stop(comm)) group_ok = false;
    if (group_ok || rf_comm_broken(comm)) rf_comm_destroy(comm);
    if (world > 1 && !group_ok && !rc) rc = RF_ERR_IO;
    if (env.stats) rf_svc_log_stats("trainer", env.stats);
    rf_svc_stage_env_close(&env);
    rf_svc_kafka_free(&c->kafka);
    return rc;
}

static int check(void *cfg) {
    config *c = cfg;
    if (!c->kafka.bootstrap || !c->pg || !c->state || !c->checkpoints)
        return rf_fail(
            RF_ERR_INVALID,
            "--kafka, --pg, --state and --checkpoints (or their variables) are required");
    if (c->threads < 0 || c->threads > 256 || c->max_messages < 1 || c->max_messages > 100000 ||
        c->cancel_poll_s <= 0 || !(c->ready_interval_s > 0))
        return rf_fail(RF_ERR_INVALID, "a numeric option is out of range (see --help)");
    return rf_svc_grpc_check(&c->grpc);
}

int main(int argc, char **argv) {
    config c = {0};
    const rf_opt opts[] = {
        RF_SVC_GRPC_OPTS(&c.grpc, "127.0.0.1:7104"),
        RF_SVC_KAFKA_OPTS(&c.kafka, "Kafka bootstrap servers host:port,... (required)"),
        {"pg", "REFINERY_PG", RF_OPT_STR, &c.pg, NULL,
         "PostgreSQL connection string (required): runs, progress, checkpoints, metrics"},
        {"state", "REFINERY_TRAINER_STATE", RF_OPT_STR, &c.state, NULL,
         "directory of the intake files and training state (required); a restart on it "
         "resumes"},
        {"checkpoints", "REFINERY_CHECKPOINTS", RF_OPT_STR, &c.checkpoints, NULL,
         "directory of the exported checkpoints, <run>/step-<N>/ (required; shared with the "
         "evaluator)"},
        {"model", "REFINERY_MODEL", RF_OPT_STR, &c.model, NULL,
         "Hugging Face model folder for runs whose spec names no trainer.model"},
        {"threads", "REFINERY_THREADS", RF_OPT_INT, &c.threads, "0",
         "training threads; 0: the spec's trainer.threads, else 1"},
        {"group", "REFINERY_TRAINER_GROUP", RF_OPT_STR, &c.group, "refinery-trainer",
         "Kafka consumer group"},
        {"topic-in", "REFINERY_TOPIC_TRAIN", RF_OPT_STR, &c.topic_in, "tokens.train",
         "input topic (TokenBatch)"},
        {"topic-checkpoints", "REFINERY_TOPIC_CHECKPOINTS", RF_OPT_STR, &c.topic_checkpoints,
         "checkpoints", "topic for the checkpoint announcements (CheckpointAnnounce)"},
        {"max-messages", "REFINERY_MAX_MESSAGES", RF_OPT_INT, &c.max_messages, "16",
         "input batches per poll (committed together)"},
        {"cancel-poll", "REFINERY_CANCEL_POLL", RF_OPT_REAL, &c.cancel_poll_s, "2",
         "seconds between checks of the training run's state (cancel)"},
        {"ready-interval", "REFINERY_READY_INTERVAL", RF_OPT_REAL, &c.ready_interval_s, "3",
         "seconds between readiness probes of PostgreSQL and Kafka"},
    };
    const rf_svc_def def = {"trainer", "Trainer service: tokens.train -> training -> checkpoints.",
                            opts,      sizeof opts / sizeof opts[0],
                            check,     run,
                            &c};
    return rf_svc_main(&def, argc, argv);
}
