/* refinery-ingest: the ingest service. Documents come in three ways:
 *   - gRPC Ingest.Push (client-streaming Documents);
 *   - with --pg and --input-root, Ingest.Load: a run's input files read on
 *     the server (ingest/server/ingest_files.h), unfinished loads resumed at start;
 *   - with --source-topic, raw records consumed from Kafka
 *     (ingest/server/ingest_kafka_source.h);
 * and go to Kafka topics docs.clean (DocumentBatch) and docs.rejected
 * (Reject). Also grpc.health.v1, and with PostgreSQL refinery.v1.Control
 * (runs: submit, seal, get, list, watch, cancel). SIGTERM: stop taking calls,
 * let running streams finish (up to --grace seconds), stop loads at a
 * recorded batch, finish and commit the source's poll, deliver what was
 * produced, exit 0.
 * --migrate-only: apply the PostgreSQL migrations (rf_store_open), log the
 * schema version and exit 0 (the chart's pre-install/pre-upgrade hook Job).
 * See services/README.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "ingest/ingest.h"
#include "runtime/kafka/kafka.h"
#include "runtime/store/store.h"
#include "runtime/rpc/rpc.h"
#include "control/control_service.h"
#include "ingest/server/ingest_files.h"
#include "ingest/server/ingest_kafka_source.h"
#include "ingest/server/ingest_service.h"
#include "runtime/ready.h"
#include "runtime/svc.h"
#include "runtime/svc_main.h"

typedef struct config {
    rf_svc_grpc grpc;
    rf_svc_kafka kafka;
    const char *topic_clean, *topic_rejected, *spec, *pg, *input_root, *source_topic, *source_group;
    int64_t batch_docs, max_in_flight, max_watches, source_max_messages;
    double load_rate, ready_interval_s, down_after_s, stall_after_s;
    bool migrate_only;
} config;

/* Settings from the `ingest:` section of a pipeline spec (the same keys as
 * the embedded runner's ingest stage): cleaning and filters for Push, all of
 * them (mapping too) for the Kafka source. *io points into *root. */
static int apply_spec(const char *path, rf_cfg **root, rf_ingest_opts *io,
                      rf_ingest_service_opts *so) {
    int rc = rf_cfg_load_file(path, root);
    if (rc == RF_OK) rc = rf_ingest_opts_from_cfg(rf_cfg_get(*root, "ingest"), io);
    if (rc == RF_OK) {
        so->clean = io->clean;
        so->quality_enabled = io->quality_enabled;
        so->quality = io->quality;
        so->language = io->language;
    }
    return rc;
}

static int start_source(config *c, const rf_kafka_opts *ko, rf_kafka_producer *producer,
                        const rf_ingest_opts *io, rf_ingest_source_thread **out) {
    if (!c->source_topic) return RF_OK;
    rf_ingest_source_thread_opts o = {
        .source = {.producer = producer,
                   .topic_clean = c->topic_clean,
                   .topic_rejected = c->topic_rejected,
                   .ingest = io},
        .kafka = ko,
        .topic = c->source_topic,
        .group = c->source_group,
        .conninfo = c->pg,
        .max_messages = (size_t)c->source_max_messages,
        .delivery_timeout_s = c->kafka.delivery_timeout_s,
    };
    int rc = rf_ingest_source_start(&o, out);
    if (rc == RF_OK) rf_info("ingest", "consuming %s (group %s)", c->source_topic, c->source_group);
    return rc;
}

/* --migrate-only: rf_store_open applies the embedded migrations that are missing
 * (under its advisory lock, so it is safe beside running services). */
static int migrate_only(const config *c) {
    rf_store_opts sto = {.conninfo = c->pg};
    rf_store *store = NULL;
    int version = 0;
    int rc = rf_store_open(&sto, &store);
    if (rc == RF_OK) rc = rf_store_schema_version(store, &version);
    if (rc == RF_OK)
        rf_info("ingest", "migrations applied: schema version %d", version);
    else
        rf_error("ingest", "migration failed: %s", rf_errmsg());
    rf_store_close(store);
    return rc;
}

/* Readiness: refinery.v1.Ingest NOT_SERVING while Kafka (or PostgreSQL, with
 * --pg) does not answer, refinery.v1.Control while PostgreSQL does not; with
 * --pg the first also writes the ingest heartbeat (liveness). */
static int start_ready(const config *c, rf_rpc_server *server, rf_kafka_producer *producer,
                       bool control, rf_ready **ingest, rf_ready **ctl) {
    int rc = rf_ready_new(server, "refinery.v1.Ingest", c->ready_interval_s, ingest);
    if (!rc) rc = rf_ready_add_kafka(*ingest, producer);
    if (!rc && c->pg) rc = rf_ready_add_pg(*ingest, c->pg);
    if (!rc && c->pg) rc = rf_ready_heartbeat(*ingest, "ingest");
    if (!rc) rc = rf_ready_start(*ingest);
    if (!rc && control) rc = rf_ready_new(server, "refinery.v1.Control", c->ready_interval_s, ctl);
    if (!rc && control) rc = rf_ready_add_pg(*ctl, c->pg);
    if (!rc && control) rc = rf_ready_start(*ctl);
    return rc;
}

static int serve(void *cfg) {
    config *c = cfg;
    if (c->migrate_only) {
        int rc = migrate_only(c);
        rf_svc_kafka_free(&c->kafka);
        return rc;
    }
    rf_kafka_opts ko;
    rf_kafka_producer *producer = NULL;
    rf_store *store = NULL, *control_store = NULL;
    rf_ingest_service *svc = NULL;
    rf_ingest_files *files = NULL;
    rf_control_service *control = NULL;
    rf_rpc_server *server = NULL;
    rf_ingest_source_thread *source = NULL;
    rf_ready *ready = NULL, *ready_control = NULL;
    rf_cfg *spec = NULL;
    rf_ingest_opts io;
    rf_ingest_opts_default(&io);
    rf_ingest_service_opts so;
    rf_ingest_service_opts_default(&so);
    so.topic_clean = c->topic_clean;
    so.topic_rejected = c->topic_rejected;
    so.batch_docs = (size_t)c->batch_docs;
    so.delivery_timeout_s = c->kafka.delivery_timeout_s;
    rf_rpc_server_opts ro = rf_svc_grpc_server_opts(&c->grpc);
    int rc = c->spec ? apply_spec(c->spec, &spec, &io, &so) : RF_OK;
    if (rc == RF_OK && (rc = rf_svc_kafka_opts(&c->kafka, "refinery-ingest", &ko)) == RF_OK)
        ko.max_in_flight = (int)c->max_in_flight;
    if (rc == RF_OK && (rc = rf_kafka_producer_new(&ko, &producer)) == RF_OK)
        so.producer = producer;
    if (rc == RF_OK && c->pg) {
        rf_store_opts sto = {.conninfo = c->pg};
        if ((rc = rf_store_open(&sto, &store)) == RF_OK) so.store = store;
        /* Control has its own connection: Watch polls do not queue behind pushes. */
        rf_control_service_opts co = {.max_watches = (int)c->max_watches,
                                      .down_after_s = c->down_after_s,
                                      .stall_after_s = c->stall_after_s};
        if (rc == RF_OK && (rc = rf_store_open(&sto, &control_store)) == RF_OK)
            co.store = control_store;
        if (rc == RF_OK) rc = rf_control_service_new(&co, &control);
    }
    /* After PostgreSQL, whose unfixable errors end the start at once. */
    const char *topics[] = {c->topic_clean, c->topic_rejected, c->source_topic};
    if (rc == RF_OK) rc = rf_svc_kafka_topics(&c->kafka, &ko, topics, 3);
    rf_ingest_files_opts fo = {.producer = producer,
                               .pg = c->pg,
                               .input_root = c->input_root,
                               .topic_clean = c->topic_clean,
                               .topic_rejected = c->topic_rejected,
                               .batch_docs = (size_t)c->batch_docs,
                               .delivery_timeout_s = c->kafka.delivery_timeout_s,
                               .max_rate = c->load_rate};
    size_t resumed = 0;
    if (rc < 0 || (rc = rf_ingest_service_new(&so, &svc)) < 0 ||
        (rc = rf_ingest_files_new(&fo, &files)) < 0 || (rc = rf_rpc_server_new(&ro, &server)) < 0 ||
        (rc = rf_ingest_service_register(svc, server)) < 0 ||
        (rc = rf_ingest_files_register(files, server)) < 0 ||
        (control && (rc = rf_control_service_register(control, server)) < 0) ||
        (rc = start_source(c, &ko, producer, &io, &source)) < 0 ||
        (rc = rf_rpc_server_start(server)) < 0 ||
        (rc = rf_ingest_files_resume(files, &resumed)) < 0 ||
        (rc = start_ready(c, server, producer, control != NULL, &ready, &ready_control)) < 0 ||
        (rc = rf_svc_grpc_write_port(&c->grpc, server)) < 0) {
        rf_error("ingest", "cannot start: %s", rf_errmsg());
    } else {
        rf_info("ingest", "serving Ingest.Push%s%s on port %d -> %s / %s at %s",
                c->input_root && c->pg ? " and Load" : "", control ? " and Control" : "",
                rf_rpc_server_port(server), c->topic_clean, c->topic_rejected, c->kafka.bootstrap);
        if (resumed) rf_info("ingest", "resumed loading %zu run(s)", resumed);
        int sig = rf_svc_wait_signal(-1);
        rf_info("ingest", "signal %d: draining (up to %.0fs)", sig, c->grpc.grace_s);
        rf_ready_free(ready); /* before NOT_SERVING, which a probe would undo */
        rf_ready_free(ready_control);
        ready = ready_control = NULL;
        rf_rpc_server_set_health(server, "refinery.v1.Ingest", 0);
        if (control) {
            rf_rpc_server_set_health(server, "refinery.v1.Control", 0);
            rf_control_service_shutdown(control);
        }
        rf_rpc_server_stop(server, c->grpc.grace_s);
        rf_ingest_files_stop(files);
        rf_stats_merge(rf_ingest_service_stats(svc), rf_ingest_files_stats(files));
        if (rf_ingest_source_join(source, rf_ingest_service_stats(svc)) < 0 && rc == RF_OK)
            rc = RF_ERR_IO; /* it stopped the service */
        source = NULL;
        if (control)
            rf_stats_merge(rf_ingest_service_stats(svc), rf_control_service_stats(control));
        rf_stats_merge(rf_ingest_service_stats(svc), rf_rpc_server_stats(server));
        rf_svc_log_stats("ingest", rf_ingest_service_stats(svc));
    }
    rf_ready_free(ready); /* when the start failed after it */
    rf_ready_free(ready_control);
    rf_svc_request_stop();
    rf_ingest_source_join(source, NULL); /* when the start failed after it */
    rf_rpc_server_free(server);
    rf_ingest_files_free(files);
    rf_ingest_service_free(svc);
    rf_control_service_free(control);
    if (producer && rf_kafka_flush(producer, c->kafka.delivery_timeout_s) < 0) {
        rf_error("ingest", "%s", rf_errmsg());
        if (rc == RF_OK) rc = RF_ERR_IO;
    }
    rf_kafka_producer_free(producer);
    rf_store_close(store);
    rf_store_close(control_store);
    rf_ingest_opts_free(&io);
    rf_cfg_free(spec);
    rf_svc_kafka_free(&c->kafka);
    return rc;
}

static int check(void *cfg) {
    config *c = cfg;
    if (c->migrate_only)
        return c->pg ? RF_OK : rf_fail(RF_ERR_INVALID, "--migrate-only needs --pg / REFINERY_PG");
    if (!c->kafka.bootstrap)
        return rf_fail(RF_ERR_INVALID, "--kafka / KAFKA_BOOTSTRAP is required");
    int rc = rf_svc_grpc_check(&c->grpc);
    if (rc) return rc;
    if (c->batch_docs < 1 || c->load_rate < 0 || c->max_in_flight < 1 || c->max_watches < 0 ||
        c->source_max_messages < 1 || c->source_max_messages > 100000 ||
        c->max_watches >= c->grpc.workers || !(c->ready_interval_s > 0) || !(c->down_after_s > 0) ||
        !(c->stall_after_s > 0))
        return rf_fail(RF_ERR_INVALID, "a numeric option is out of range (see --help)");
    if (c->max_watches == 0) c->max_watches = c->grpc.workers > 1 ? c->grpc.workers / 2 : 1;
    return RF_OK;
}

int main(int argc, char **argv) {
    config c = {0};
    const rf_opt opts[] = {
        RF_SVC_GRPC_OPTS(&c.grpc, "127.0.0.1:7101"),
        RF_SVC_KAFKA_OPTS(&c.kafka, "Kafka bootstrap servers host:port,... (required)"),
        {"topic-clean", "REFINERY_TOPIC_CLEAN", RF_OPT_STR, &c.topic_clean, "docs.clean",
         "topic for kept documents (DocumentBatch)"},
        {"topic-rejected", "REFINERY_TOPIC_REJECTED", RF_OPT_STR, &c.topic_rejected,
         "docs.rejected", "topic for rejected documents (Reject)"},
        {"pg", "REFINERY_PG", RF_OPT_STR, &c.pg, NULL,
         "PostgreSQL: runs must exist, progress is recorded, Control is served"},
        {"input-root", "REFINERY_INPUT_ROOT", RF_OPT_STR, &c.input_root, NULL,
         "directory Ingest.Load reads run inputs from (spec paths are relative to it); "
         "unset: Load is refused"},
        {"load-rate", "REFINERY_LOAD_RATE", RF_OPT_REAL, &c.load_rate, "0",
         "records per second each Load reads at most (0: no limit)"},
        {"spec", "REFINERY_SPEC", RF_OPT_STR, &c.spec, NULL,
         "pipeline spec whose ingest: section is used for runs whose own spec has none"},
        {"source-topic", "REFINERY_TOPIC_RAW", RF_OPT_STR, &c.source_topic, NULL,
         "also consume raw records from this topic (key = run id, value = JSON Lines, "
         "empty value = end of the run's input)"},
        {"source-group", "REFINERY_SOURCE_GROUP", RF_OPT_STR, &c.source_group, "refinery-ingest",
         "Kafka consumer group of --source-topic"},
        {"source-max-messages", "REFINERY_SOURCE_MAX_MESSAGES", RF_OPT_INT, &c.source_max_messages,
         "16", "--source-topic messages per poll (committed together)"},
        {"max-watches", "REFINERY_MAX_WATCHES", RF_OPT_INT, &c.max_watches, "0",
         "concurrent Control.Watch calls (each holds a worker); 0 = half the workers"},
        {"ready-interval", "REFINERY_READY_INTERVAL", RF_OPT_REAL, &c.ready_interval_s, "3",
         "seconds between readiness probes of Kafka and PostgreSQL (and heartbeats)"},
        {"down-after", "REFINERY_DOWN_AFTER", RF_OPT_REAL, &c.down_after_s, "15",
         "Control: a stage whose service wrote no heartbeat for this many seconds is down"},
        {"stall-after", "REFINERY_STALL_AFTER", RF_OPT_REAL, &c.stall_after_s, "120",
         "Control: a stage with input waiting and no progress for this many seconds is stalled"},
        {"batch-docs", "REFINERY_BATCH_DOCS", RF_OPT_INT, &c.batch_docs, "256",
         "kept documents per DocumentBatch"},
        {"migrate-only", NULL, RF_OPT_BOOL, &c.migrate_only, "false",
         "apply the PostgreSQL migrations (--pg), print the schema version, exit (no Kafka)"},
        {"max-in-flight", "REFINERY_KAFKA_MAX_IN_FLIGHT", RF_OPT_INT, &c.max_in_flight, "10000",
         "Kafka messages awaiting delivery before producing blocks"},
    };
    const rf_svc_def def = {
        "ingest", "Ingest service: Ingest.Push, Ingest.Load and a Kafka source -> docs.clean.",
        opts,     sizeof opts / sizeof opts[0],
        check,    serve,
        &c};
    return rf_svc_main(&def, argc, argv);
}
