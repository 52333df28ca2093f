/* refinery.v1.Control in-process against a real PostgreSQL (started with
 * scripts/test-env/pg.sh in a temporary directory, or $REFINERY_PG): the run
 * lifecycle, RunStatus assembled from the store, spec errors naming key and
 * line, status codes, Watch streaming changes until the run ends; and
 * Ingest.Push (with the mock Kafka cluster) moving a pending run to running
 * and refusing sealed or ended runs. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "runtime/kafka/kafka.h"
#include "runtime/kafka/mock.h"
#include "refinery.pb-c.h"
#include "runtime/rpc/client.h"
#include "runtime/rpc/rpc.h"
#include "runtime/store/store.h"
#include "control/control_service.h"
#include "ingest/server/ingest_service.h"

#include "../support/pg.h"

#define CONTROL "/refinery.v1.Control/"

static test_pg pg_server;

static int group_setup(void **state) {
    return test_pg_start(&pg_server, "control");
}

static int group_teardown(void **state) {
    test_pg_stop(&pg_server);
    return 0;
}

typedef struct fixture {
    rf_store *control_store, *ingest_store, *db; /* db: the test's own writes */
    rf_kafka_mock *mock;
    rf_kafka_producer *producer;
    rf_control_service *control;
    rf_ingest_service *ingest;
    rf_rpc_server *server;
    rf_rpc_client *client;
} fixture;

static rf_store *open_store(void) {
    rf_store_opts o = {.conninfo = pg_server.conninfo, .attempts = 20, .backoff_s = 0.05};
    rf_store *s = NULL;
    return rf_store_open(&o, &s) < 0 ? NULL : s;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    if (!(f->control_store = open_store()) || !(f->ingest_store = open_store()) ||
        !(f->db = open_store()))
        return -1;
    if (rf_kafka_mock_new(1, &f->mock) < 0 || rf_kafka_mock_topic(f->mock, "docs.clean", 1) < 0 ||
        rf_kafka_mock_topic(f->mock, "docs.rejected", 1) < 0)
        return -1;
    rf_kafka_opts ko = {.bootstrap = rf_kafka_mock_bootstrap(f->mock), .delivery_timeout_s = 5};
    if (rf_kafka_producer_new(&ko, &f->producer) < 0) return -1;
    rf_ingest_service_opts io;
    rf_ingest_service_opts_default(&io);
    io.producer = f->producer;
    io.store = f->ingest_store;
    rf_control_service_opts co = {.store = f->control_store, .max_watches = 1, .poll_s = 0.05};
    rf_rpc_server_opts ro = {.listen = "127.0.0.1:0", .workers = 4};
    if (rf_control_service_new(&co, &f->control) < 0 ||
        rf_ingest_service_new(&io, &f->ingest) < 0 || rf_rpc_server_new(&ro, &f->server) < 0 ||
        rf_control_service_register(f->control, f->server) < 0 ||
        rf_ingest_service_register(f->ingest, f->server) < 0 || rf_rpc_server_start(f->server) < 0)
        return -1;
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", rf_rpc_server_port(f->server));
    return rf_rpc_client_new(target, NULL, 0, &f->client);
}

static int teardown(void **state) {
    fixture *f = *state;
    rf_rpc_client_free(f->client);
    if (f->control) rf_control_service_shutdown(f->control);
    rf_rpc_server_free(f->server);
    rf_control_service_free(f->control);
    rf_ingest_service_free(f->ingest);
    rf_kafka_producer_free(f->producer);
    rf_kafka_mock_free(f->mock);
    rf_store_close(f->control_store);
    rf_store_close(f->ingest_store);
    rf_store_close(f->db);
    free(f);
    return 0;
}

/* A run id unique to this process and moment. */
static const char *fresh_id(const char *name, char *buf, size_t size) {
    snprintf(buf, size, "%s-%d-%.0f", name, (int)getpid(), rf_now() * 1e6);
    return buf;
}

static const char *good_spec = "run:\n"
                               "  name: t\n"
                               "ingest:\n"
                               "  preset: sst2\n"
                               "  inputs: [a.tsv]\n"
                               "dedup:\n"
                               "  threshold: 0.8\n"
                               "trainer:\n"
                               "  max_steps: 5\n";

/* Control/<method> with req; *status gets the outcome. Returns the response. */
static Refinery__V1__RunStatus *call_status(fixture *f, const char *method,
                                            const ProtobufCMessage *req, rf_rpc_status *status) {
    char path[64];
    snprintf(path, sizeof path, CONTROL "%s", method);
    ProtobufCMessage *resp = NULL;
    rf_rpc_unary(f->client, path, req, &refinery__v1__run_status__descriptor, &resp, 10, status);
    return (Refinery__V1__RunStatus *)resp;
}

static Refinery__V1__RunStatus *submit(fixture *f, const char *spec, const char *id,
                                       rf_rpc_status *status) {
    Refinery__V1__SubmitRequest r = REFINERY__V1__SUBMIT_REQUEST__INIT;
    r.spec_yaml = (char *)spec;
    r.run_id = (char *)(id ? id : "");
    return call_status(f, "Submit", &r.base, status);
}

static Refinery__V1__RunStatus *on_run(fixture *f, const char *method, const char *id,
                                       rf_rpc_status *status) {
    Refinery__V1__RunRef r = REFINERY__V1__RUN_REF__INIT;
    r.run_id = (char *)id;
    return call_status(f, method, &r.base, status);
}

static void free_status(Refinery__V1__RunStatus *s) {
    if (s) protobuf_c_message_free_unpacked(&s->base, NULL);
}

static const Refinery__V1__StageCounts *stage(const Refinery__V1__RunStatus *s, const char *name) {
    for (size_t i = 0; i < s->n_stages; i++)
        if (!strcmp(s->stages[i]->stage, name)) return s->stages[i];
    fail_msg("no stage %s in the status", name);
    return NULL;
}

static void test_submit_get(void **state) {
    fixture *f = *state;
    char id[96];
    fresh_id("submit", id, sizeof id);
    rf_rpc_status st;
    Refinery__V1__RunStatus *s = submit(f, good_spec, id, &st);
    assert_int_equal(st.code, GRPC_STATUS_OK);
    assert_non_null(s);
    assert_string_equal(s->run_id, id);
    assert_string_equal(s->state, "pending");
    assert_false(s->sealed);
    assert_int_equal(s->n_stages, 5);
    const char *names[] = {"ingest", "dedup", "tokenizer", "trainer", "evaluator"};
    for (size_t i = 0; i < 5; i++) {
        assert_string_equal(s->stages[i]->stage, names[i]);
        assert_int_equal(s->stages[i]->batches, 0);
        assert_false(s->stages[i]->complete);
    }
    assert_int_equal(s->checkpoint_step, -1);
    assert_int_equal(s->eval_step, -1);
    assert_int_equal(s->n_eval, 0);
    assert_true(s->created_at > 1.7e9);
    free_status(s);

    /* The spec is stored as sent. */
    char *spec = NULL;
    assert_int_equal(rf_store_run_spec(f->db, id, &spec), 0);
    assert_string_equal(spec, good_spec);
    free(spec);

    s = on_run(f, "Get", id, &st);
    assert_int_equal(st.code, GRPC_STATUS_OK);
    assert_string_equal(s->run_id, id);
    free_status(s);

    s = submit(f, good_spec, id, &st);
    assert_null(s);
    assert_int_equal(st.code, GRPC_STATUS_ALREADY_EXISTS);

    /* No id: one is generated, and it names a real run. */
    s = submit(f, good_spec, NULL, &st);
    assert_int_equal(st.code, GRPC_STATUS_OK);
    assert_memory_equal(s->run_id, "run-", 4);
    rf_store_run run;
    assert_int_equal(rf_store_run_get(f->db, s->run_id, &run), 0);
    free_status(s);
}

static void expect_invalid(fixture *f, const char *spec, const char *id, const char *needle) {
    rf_rpc_status st;
    Refinery__V1__RunStatus *s = submit(f, spec, id, &st);
    assert_null(s);
    assert_int_equal(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    if (!strstr(st.message, needle)) fail_msg("'%s' does not contain '%s'", st.message, needle);
}

static void test_bad_specs(void **state) {
    fixture *f = *state;
    char id[96];
    fresh_id("bad", id, sizeof id);
    expect_invalid(f, "ingest:\n  preset: sst2\n  threads: many\n", id, "spec:3: ingest.threads");
    expect_invalid(f, "ingest:\n  presets: sst2\n", id, "spec:2: unknown key 'ingest.presets'");
    expect_invalid(f, "tokeniser:\n  max_length: 64\n", id, "did you mean 'tokenizer'");
    expect_invalid(f, "dedup:\n  treshold: 0.8\n", id, "unknown key 'dedup.treshold'");
    expect_invalid(f, "trainer:\n  model: m\n  lr: fast\n", id, "spec:3: trainer.lr");
    expect_invalid(f, "ingest:\n  preset: nosuch\n", id, "nosuch");
    expect_invalid(f, "run:\n  threads: 0\n", id, "run.threads");
    expect_invalid(f, "ingest: [a, b]\n", id, "ingest: expected a mapping");
    expect_invalid(f, "ingest:\n  preset: [\n", id, "YAML error");
    expect_invalid(f, "ingest:\n  preset: sft\n", id,
                   "conversations (preset sft, chat:) run embedded only");
    expect_invalid(f, good_spec, "../etc", "run_id '../etc'");
    expect_invalid(f, good_spec, "a b", "run_id");
    /* Nothing was created by the failed submissions. */
    rf_store_run run;
    assert_int_equal(rf_store_run_get(f->db, id, &run), RF_ERR_NOT_FOUND);
    /* trainer.model may be left to the trainer service's default. */
    rf_rpc_status st;
    Refinery__V1__RunStatus *s = submit(f, "trainer:\n  max_steps: 3\n", id, &st);
    assert_int_equal(st.code, GRPC_STATUS_OK);
    free_status(s);
}

static void test_unknown_and_empty_ids(void **state) {
    fixture *f = *state;
    const char *methods[] = {"Get", "Seal", "Cancel"};
    rf_rpc_status st;
    for (size_t i = 0; i < 3; i++) {
        assert_null(on_run(f, methods[i], "no-such-run", &st));
        assert_int_equal(st.code, GRPC_STATUS_NOT_FOUND);
        assert_non_null(strstr(st.message, "no-such-run"));
        assert_null(on_run(f, methods[i], "", &st));
        assert_int_equal(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    }
    Refinery__V1__RunRef r = REFINERY__V1__RUN_REF__INIT;
    r.run_id = "no-such-run";
    rf_rpc_stream *ws;
    assert_int_equal(rf_rpc_stream_open(f->client, CONTROL "Watch", 10, &ws), 0);
    assert_int_equal(rf_rpc_stream_send(ws, &r.base), 0);
    rf_rpc_stream_close_send(ws);
    ProtobufCMessage *m = NULL;
    assert_true(rf_rpc_stream_recv(ws, &refinery__v1__run_status__descriptor, &m) <= 0);
    assert_int_not_equal(rf_rpc_stream_finish(ws, &st), 0);
    assert_int_equal(st.code, GRPC_STATUS_NOT_FOUND);
}

static void progress(rf_store *s, const char *id, const char *stage, uint64_t seq, int64_t in,
                     int64_t out, int64_t rej, int64_t dup) {
    rf_store_counts c = {.in = in, .out = out, .rejected = rej, .duplicate = dup};
    assert_int_equal(rf_store_progress_add(s, id, stage, seq, &c, NULL), 0);
}

static void test_status_from_store(void **state) {
    fixture *f = *state;
    char id[96];
    fresh_id("status", id, sizeof id);
    rf_rpc_status st;
    free_status(submit(f, good_spec, id, &st));
    assert_int_equal(st.code, GRPC_STATUS_OK);
    progress(f->db, id, "ingest", 1, 100, 90, 10, 0);
    progress(f->db, id, "ingest", 2, 50, 45, 5, 0);
    progress(f->db, id, "dedup", 1, 90, 80, 0, 10);
    Refinery__V1__RunStatus *s = on_run(f, "Seal", id, &st);
    assert_int_equal(st.code, GRPC_STATUS_OK);
    assert_true(s->sealed);
    const Refinery__V1__StageCounts *c = stage(s, "ingest");
    assert_int_equal(c->batches, 2);
    assert_int_equal(c->docs_in, 150);
    assert_int_equal(c->docs_out, 135);
    assert_int_equal(c->rejected, 15);
    assert_true(c->complete); /* sealed: nothing upstream of ingest */
    c = stage(s, "dedup");
    assert_int_equal(c->batches, 1);
    assert_int_equal(c->duplicate, 10);
    assert_false(c->complete); /* ingest batch 2 is not through dedup yet */
    assert_false(stage(s, "tokenizer")->complete);
    free_status(s);

    progress(f->db, id, "dedup", 2, 45, 0, 0, 45); /* all duplicates: nothing to pass on */
    progress(f->db, id, "tokenizer", 1, 80, 80, 0, 0);
    progress(f->db, id, "trainer", 1, 70, 70, 0, 0);
    progress(f->db, id, "evaluator", 1, 10, 10, 0, 0);
    assert_int_equal(rf_store_checkpoint_add(f->db, id, 10, "/ckpt/10", 0.75), 0);
    assert_int_equal(rf_store_checkpoint_add(f->db, id, 20, "/ckpt/20", 0.5), 0);
    assert_int_equal(rf_store_eval_add(f->db, id, 10, "macro_f1", 0.6), 0);
    assert_int_equal(rf_store_eval_add(f->db, id, 10, "accuracy", 0.7), 0);
    s = on_run(f, "Get", id, &st);
    assert_int_equal(st.code, GRPC_STATUS_OK);
    const char *names[] = {"ingest", "dedup", "tokenizer", "trainer", "evaluator"};
    for (size_t i = 0; i < 5; i++)
        if (!stage(s, names[i])->complete) fail_msg("%s not complete", names[i]);
    assert_int_equal(stage(s, "dedup")->duplicate, 55);
    assert_int_equal(stage(s, "trainer")->docs_out, 70);
    assert_int_equal(s->checkpoint_step, 20);
    assert_true(s->train_loss == 0.5);
    assert_int_equal(s->eval_step, 10); /* step 20 is not evaluated yet */
    assert_int_equal(s->n_eval, 2);
    assert_string_equal(s->eval[0]->name, "accuracy");
    assert_true(s->eval[0]->value == 0.7);
    assert_string_equal(s->eval[1]->name, "macro_f1");
    free_status(s);

    assert_int_equal(rf_store_eval_add(f->db, id, 20, "accuracy", 0.8), 0);
    s = on_run(f, "Get", id, &st);
    assert_int_equal(s->eval_step, 20);
    assert_int_equal(s->n_eval, 1);
    assert_true(s->eval[0]->value == 0.8);
    free_status(s);
}

/* Runs sql with $1 = id on the test's own connection. */
static void exec_id(fixture *f, const char *sql, const char *id) {
    const char *p[] = {id};
    if (rf_store_exec(f->db, sql, 1, p, NULL) < 0) fail_msg("%s: %s", sql, rf_errmsg());
}

/* A stage_progress row of run id recorded `ago` seconds ago. */
static void progress_at(fixture *f, const char *id, const char *stage, int seq, int out, int ago) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "INSERT INTO stage_progress VALUES ($1, '%s', %d, %d, %d, 0, 0,"
             " now() - interval '%d seconds')",
             stage, seq, out, out, ago);
    exec_id(f, sql, id);
}

/* Liveness from heartbeats and progress rows written here (default
 * thresholds: down after 15 s, stalled after 120 s), each state once. */
static void test_liveness(void **state) {
    fixture *f = *state;
    char id[96];
    fresh_id("live", id, sizeof id);
    rf_rpc_status st;
    free_status(submit(f, good_spec, id, &st));
    assert_int_equal(st.code, GRPC_STATUS_OK);
    exec_id(f, "DELETE FROM heartbeats WHERE $1 <> ''", id);
    exec_id(f,
            "INSERT INTO heartbeats (service, instance, started_at, beat_at, ready, reason) VALUES"
            " ('ingest', 'h:1', now(), now(), true, ''),"
            " ('dedup', 'h:2', now(), now() - interval '60 seconds', true, ''),"
            " ('dedup', 'h:9', now(), now() - interval '90 seconds', true, ''),"
            " ('tokenizer', 'h:3', now(), now(), false, 'Kafka unreachable: all brokers down'),"
            " ('trainer', 'h:4', now(), now(), true, ''),"
            " ('evaluator', 'h:5', now(), now(), true, '')"
            " ON CONFLICT DO NOTHING RETURNING $1",
            id);
    progress_at(f, id, "ingest", 1, 10, 300);
    progress_at(f, id, "ingest", 2, 10, 300);
    progress_at(f, id, "dedup", 1, 5, 250);
    progress_at(f, id, "tokenizer", 1, 5, 200);
    progress_at(f, id, "tokenizer", 3, 5, 2);
    progress_at(f, id, "evaluator", 1, 1, 5);

    double now = (double)time(NULL); /* the database is local: the same clock */
    Refinery__V1__RunStatus *s = on_run(f, "Get", id, &st);
    assert_int_equal(st.code, GRPC_STATUS_OK);
    const Refinery__V1__StageCounts *c = stage(s, "ingest");
    assert_string_equal(c->liveness, "waiting"); /* not sealed, nothing upstream */
    assert_true(fabs(c->last_progress_at - (now - 300)) < 5);
    c = stage(s, "dedup"); /* the newest of its two instances beat 60 s ago */
    assert_string_equal(c->liveness, "down");
    assert_true(fabs(c->last_heartbeat_at - (now - 60)) < 5);
    if (!strstr(c->liveness_reason, "no heartbeat of refinery-dedup for 6") ||
        !strstr(c->liveness_reason, "(down after 15 s)"))
        fail_msg("dedup: %s", c->liveness_reason);
    c = stage(s, "tokenizer");
    assert_string_equal(c->liveness, "unready");
    assert_string_equal(c->liveness_reason, "Kafka unreachable: all brokers down");
    assert_true(c->last_heartbeat_at == 0); /* set only when down */
    c = stage(s, "trainer"); /* tokenizer batches 1 (200 s ago) and 3 wait, none recorded */
    assert_string_equal(c->liveness, "stalled");
    assert_true(c->last_progress_at == 0);
    if (!strstr(c->liveness_reason, "2 batch(es) wait for it and it made no progress for 20") ||
        !strstr(c->liveness_reason, "(stalled after 120 s)"))
        fail_msg("trainer: %s", c->liveness_reason);
    c = stage(s, "evaluator"); /* batch 3 arrived 2 s ago */
    assert_string_equal(c->liveness, "working");
    assert_string_equal(c->liveness_reason, "");
    free_status(s);

    /* A heartbeat of dedup now; then an ended run flags nothing. */
    exec_id(f, "UPDATE heartbeats SET beat_at = now() WHERE service = 'dedup' AND $1 <> ''", id);
    s = on_run(f, "Get", id, &st);
    /* Up; ingest batch 2 (300 s old) waits and its last progress is 250 s old. */
    assert_string_equal(stage(s, "dedup")->liveness, "stalled");
    if (!strstr(stage(s, "dedup")->liveness_reason, "1 batch(es) wait for it and it made no "
                                                    "progress for 25"))
        fail_msg("dedup: %s", stage(s, "dedup")->liveness_reason);
    free_status(s);
    free_status(on_run(f, "Cancel", id, &st));
    s = on_run(f, "Get", id, &st);
    for (size_t i = 0; i < s->n_stages; i++)
        assert_string_equal(s->stages[i]->liveness, "ended");
    free_status(s);
    exec_id(f, "DELETE FROM heartbeats WHERE $1 <> ''", id);
}

static void test_cancel(void **state) {
    fixture *f = *state;
    char id[96], done[96];
    fresh_id("cancel", id, sizeof id);
    fresh_id("done", done, sizeof done);
    rf_rpc_status st;
    free_status(submit(f, good_spec, id, &st));
    free_status(submit(f, good_spec, done, &st));
    Refinery__V1__RunStatus *s = on_run(f, "Cancel", id, &st);
    assert_int_equal(st.code, GRPC_STATUS_OK);
    assert_string_equal(s->state, "cancelled");
    free_status(s);
    assert_null(on_run(f, "Cancel", id, &st));
    assert_int_equal(st.code, GRPC_STATUS_FAILED_PRECONDITION);
    assert_int_equal(rf_store_run_set_state(f->db, done, RF_RUN_SUCCEEDED, NULL), 0);
    assert_null(on_run(f, "Cancel", done, &st));
    assert_int_equal(st.code, GRPC_STATUS_FAILED_PRECONDITION);
    rf_store_run run;
    assert_int_equal(rf_store_run_get(f->db, done, &run), 0);
    assert_int_equal(run.state, RF_RUN_SUCCEEDED);
}

static void test_list(void **state) {
    fixture *f = *state;
    char ids[3][96];
    rf_rpc_status st;
    for (int i = 0; i < 3; i++) {
        fresh_id("list", ids[i], sizeof ids[i]);
        free_status(submit(f, good_spec, ids[i], &st));
        assert_int_equal(st.code, GRPC_STATUS_OK);
        usleep(2000); /* distinct created_at */
    }
    Refinery__V1__ListRunsRequest r = REFINERY__V1__LIST_RUNS_REQUEST__INIT;
    r.limit = 2;
    ProtobufCMessage *m = NULL;
    assert_int_equal(rf_rpc_unary(f->client, CONTROL "List", &r.base,
                                  &refinery__v1__run_list__descriptor, &m, 10, &st),
                     0);
    Refinery__V1__RunList *l = (Refinery__V1__RunList *)m;
    assert_int_equal(l->n_runs, 2);
    assert_string_equal(l->runs[0]->run_id, ids[2]); /* newest first */
    assert_string_equal(l->runs[1]->run_id, ids[1]);
    assert_int_equal(l->runs[0]->n_stages, 5);
    protobuf_c_message_free_unpacked(m, NULL);
}

/* Changes a run while it is watched: progress, then the end. */
typedef struct changer {
    const char *id;
    rf_store *db;
} changer;

static void *change_run(void *arg) {
    changer *c = arg;
    usleep(300 * 1000);
    rf_store_counts n = {.in = 5, .out = 5};
    rf_store_progress_add(c->db, c->id, "ingest", 1, &n, NULL);
    usleep(300 * 1000);
    rf_store_run_set_state(c->db, c->id, RF_RUN_SUCCEEDED, NULL);
    return NULL;
}

static void test_watch(void **state) {
    fixture *f = *state;
    char id[96];
    fresh_id("watch", id, sizeof id);
    rf_rpc_status st;
    free_status(submit(f, good_spec, id, &st));
    Refinery__V1__RunRef r = REFINERY__V1__RUN_REF__INIT;
    r.run_id = id;
    rf_rpc_stream *ws, *second;
    assert_int_equal(rf_rpc_stream_open(f->client, CONTROL "Watch", 20, &ws), 0);
    assert_int_equal(rf_rpc_stream_send(ws, &r.base), 0);
    rf_rpc_stream_close_send(ws);
    ProtobufCMessage *m = NULL;
    assert_int_equal(rf_rpc_stream_recv(ws, &refinery__v1__run_status__descriptor, &m), 1);
    assert_string_equal(((Refinery__V1__RunStatus *)m)->state, "pending");
    protobuf_c_message_free_unpacked(m, NULL);

    /* max_watches = 1: a second watcher is turned away. */
    assert_int_equal(rf_rpc_stream_open(f->client, CONTROL "Watch", 10, &second), 0);
    rf_rpc_stream_send(second, &r.base);
    rf_rpc_stream_close_send(second);
    assert_true(rf_rpc_stream_recv(second, &refinery__v1__run_status__descriptor, &m) <= 0);
    rf_rpc_stream_finish(second, &st);
    assert_int_equal(st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);

    changer c = {id, f->db};
    pthread_t th;
    pthread_create(&th, NULL, change_run, &c);
    int got = 0, saw_progress = 0;
    char last_state[32] = "";
    while (rf_rpc_stream_recv(ws, &refinery__v1__run_status__descriptor, &m) == 1) {
        Refinery__V1__RunStatus *s = (Refinery__V1__RunStatus *)m;
        got++;
        if (stage(s, "ingest")->docs_in == 5) saw_progress = 1;
        snprintf(last_state, sizeof last_state, "%s", s->state);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    pthread_join(th, NULL);
    assert_int_equal(rf_rpc_stream_finish(ws, &st), 0);
    assert_true(saw_progress);
    assert_string_equal(last_state, "succeeded");
    /* Only changes are sent: the progress row and the end (polls in between repeat nothing). */
    assert_int_equal(got, 2);
}

/* An ended run's Watch sends one status and ends; a service shutdown ends a
 * running watch with UNAVAILABLE. */
static void test_watch_ends(void **state) {
    fixture *f = *state;
    char id[96];
    fresh_id("watch-end", id, sizeof id);
    rf_rpc_status st;
    free_status(submit(f, good_spec, id, &st));
    Refinery__V1__RunRef r = REFINERY__V1__RUN_REF__INIT;
    r.run_id = id;
    rf_rpc_stream *ws;
    ProtobufCMessage *m = NULL;
    assert_int_equal(rf_rpc_stream_open(f->client, CONTROL "Watch", 20, &ws), 0);
    rf_rpc_stream_send(ws, &r.base);
    rf_rpc_stream_close_send(ws);
    assert_int_equal(rf_rpc_stream_recv(ws, &refinery__v1__run_status__descriptor, &m), 1);
    protobuf_c_message_free_unpacked(m, NULL);
    double t0 = rf_now();
    rf_control_service_shutdown(f->control);
    assert_true(rf_rpc_stream_recv(ws, &refinery__v1__run_status__descriptor, &m) <= 0);
    rf_rpc_stream_finish(ws, &st);
    assert_int_equal(st.code, GRPC_STATUS_UNAVAILABLE);
    assert_true(rf_now() - t0 < 5);
}

/* Pushes n documents of 10 words; *accepted (may be NULL) from the summary. */
static grpc_status_code push_counted(fixture *f, const char *id, int n, uint64_t *accepted) {
    const char *const md[] = {"refinery-run-id", id, NULL};
    rf_rpc_stream *ps;
    if (rf_rpc_stream_open_md(f->client, "/refinery.v1.Ingest/Push", 20, md, &ps) < 0)
        return GRPC_STATUS_UNKNOWN;
    for (int i = 0; i < n; i++) {
        char text[96];
        snprintf(text, sizeof text, "Document %d of the control test, long enough to keep.", i);
        Refinery__V1__Document d = REFINERY__V1__DOCUMENT__INIT;
        d.text = text;
        d.label = i % 2;
        if (rf_rpc_stream_send(ps, &d.base) < 0) break;
    }
    rf_rpc_stream_close_send(ps);
    ProtobufCMessage *m = NULL;
    if (rf_rpc_stream_recv(ps, &refinery__v1__push_summary__descriptor, &m) == 1) {
        if (accepted) *accepted = ((Refinery__V1__PushSummary *)m)->accepted;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    rf_rpc_status st;
    rf_rpc_stream_finish(ps, &st);
    return st.code;
}

static grpc_status_code push(fixture *f, const char *id, int n) {
    return push_counted(f, id, n, NULL);
}

static void test_push_lifecycle(void **state) {
    fixture *f = *state;
    char id[96], other[96];
    fresh_id("push", id, sizeof id);
    fresh_id("push-cancelled", other, sizeof other);
    rf_rpc_status st;
    free_status(submit(f, good_spec, id, &st));
    free_status(submit(f, good_spec, other, &st));
    assert_int_equal(push(f, id, 10), GRPC_STATUS_OK);
    Refinery__V1__RunStatus *s = on_run(f, "Get", id, &st);
    assert_string_equal(s->state, "running");
    assert_int_equal(stage(s, "ingest")->docs_in, 10);
    free_status(s);
    assert_int_equal(push(f, id, 3), GRPC_STATUS_OK); /* running takes more */
    free_status(on_run(f, "Seal", id, &st));
    assert_int_equal(push(f, id, 3), GRPC_STATUS_FAILED_PRECONDITION);
    s = on_run(f, "Get", id, &st);
    assert_int_equal(stage(s, "ingest")->docs_in, 13); /* the refused push left nothing */
    assert_string_equal(s->state, "running");
    free_status(s);
    free_status(on_run(f, "Cancel", other, &st));
    assert_int_equal(push(f, other, 3), GRPC_STATUS_FAILED_PRECONDITION);
    assert_int_equal(push(f, "no-such-run", 3), GRPC_STATUS_NOT_FOUND);
}

/* The run's spec sets the stream's filters: the same documents are kept
 * under the defaults and refused under quality.min_words: 20. */
static void test_push_uses_run_spec(void **state) {
    fixture *f = *state;
    char plain[96], strict[96];
    fresh_id("plain", plain, sizeof plain);
    fresh_id("strict", strict, sizeof strict);
    rf_rpc_status st;
    free_status(submit(f, good_spec, plain, &st));
    free_status(submit(f, "ingest:\n  quality:\n    min_words: 20\n", strict, &st));
    assert_int_equal(st.code, GRPC_STATUS_OK);
    uint64_t kept_plain = 99, kept_strict = 99;
    assert_int_equal(push_counted(f, plain, 6, &kept_plain), GRPC_STATUS_OK);
    assert_int_equal(push_counted(f, strict, 6, &kept_strict), GRPC_STATUS_OK);
    assert_int_equal(kept_plain, 6);
    assert_int_equal(kept_strict, 0);
    Refinery__V1__RunStatus *s = on_run(f, "Get", strict, &st);
    assert_int_equal(stage(s, "ingest")->rejected, 6);
    free_status(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_submit_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_specs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_and_empty_ids, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status_from_store, setup, teardown),
        cmocka_unit_test_setup_teardown(test_liveness, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watch_ends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_push_lifecycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_push_uses_run_spec, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
