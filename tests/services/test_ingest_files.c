/* Ingest.Load and the file loaders in-process, against a real PostgreSQL
 * (tests/support/pg.h) and the mock Kafka cluster: Load's replies and
 * refusals; a resume from a recorded prefix produces exactly the batches
 * after it; a run locked by another process is left to it; a cancel stops a
 * load unsealed. */
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
#include "ingest/server/ingest_files.h"

#include "../support/pg.h"

#define RECORDS 100 /* in docs.jsonl: every 10th (i % 10 == 3) is not JSON */
#define BATCH   10

static test_pg pg_server;
static char root[] = "/tmp/rf-ingest-files-XXXXXX";

static int group_setup(void **state) {
    if (!mkdtemp(root)) return -1;
    char path[256];
    snprintf(path, sizeof path, "%s/docs.jsonl", root);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int i = 0; i < RECORDS; i++) {
        if (i % 10 == 3)
            fprintf(f, "{\"text\": \"cut %d\n", i);
        else
            fprintf(f, "{\"text\": \"review %d: the product works as it should\", \"label\": %d}\n",
                    i, i % 2);
    }
    snprintf(path, sizeof path, "%s/out", root);
    if (fclose(f) || symlink("/etc", path)) return -1;
    return test_pg_start(&pg_server, "ingest-files");
}

static int group_teardown(void **state) {
    test_pg_stop(&pg_server);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    return system(cmd);
}

typedef struct fixture {
    rf_store *db;
    rf_kafka_mock *mock;
    rf_kafka_producer *producer;
    rf_ingest_files *files;
    rf_rpc_server *server;
    rf_rpc_client *client;
} fixture;

static rf_store *open_store(void) {
    rf_store_opts o = {.conninfo = pg_server.conninfo, .attempts = 20, .backoff_s = 0.05};
    rf_store *s = NULL;
    return rf_store_open(&o, &s) < 0 ? NULL : s;
}

/* The service with input root `dir` (NULL: none), at most `rate` records/s. */
static void start(fixture *f, const char *dir, double rate) {
    rf_ingest_files_opts o = {.producer = f->producer,
                              .pg = pg_server.conninfo,
                              .input_root = dir,
                              .topic_clean = "docs.clean",
                              .topic_rejected = "docs.rejected",
                              .batch_docs = BATCH,
                              .delivery_timeout_s = 5,
                              .cancel_poll_s = 0.05,
                              .max_rate = rate};
    rf_rpc_server_opts ro = {.listen = "127.0.0.1:0", .workers = 2};
    assert_int_equal(rf_ingest_files_new(&o, &f->files), 0);
    assert_int_equal(rf_rpc_server_new(&ro, &f->server), 0);
    assert_int_equal(rf_ingest_files_register(f->files, f->server), 0);
    assert_int_equal(rf_rpc_server_start(f->server), 0);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", rf_rpc_server_port(f->server));
    assert_int_equal(rf_rpc_client_new(target, NULL, 0, &f->client), 0);
}

static void stop(fixture *f) {
    rf_rpc_client_free(f->client);
    rf_rpc_server_free(f->server);
    rf_ingest_files_free(f->files);
    f->client = NULL;
    f->server = NULL;
    f->files = NULL;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    if (!(f->db = open_store())) return -1;
    if (rf_kafka_mock_new(1, &f->mock) < 0 || rf_kafka_mock_topic(f->mock, "docs.clean", 1) < 0 ||
        rf_kafka_mock_topic(f->mock, "docs.rejected", 1) < 0)
        return -1;
    rf_kafka_opts ko = {.bootstrap = rf_kafka_mock_bootstrap(f->mock), .delivery_timeout_s = 5};
    return rf_kafka_producer_new(&ko, &f->producer);
}

static int teardown(void **state) {
    fixture *f = *state;
    stop(f);
    rf_kafka_producer_free(f->producer);
    rf_kafka_mock_free(f->mock);
    rf_store_close(f->db);
    free(f);
    return 0;
}

static const char *fresh_id(const char *name, char *buf, size_t size) {
    snprintf(buf, size, "%s-%d-%.0f", name, (int)getpid(), rf_now() * 1e6);
    return buf;
}

/* A pending run whose spec reads `input`. */
static void create_run(fixture *f, const char *run, const char *input) {
    char spec[512];
    snprintf(spec, sizeof spec,
             "run:\n  name: t\ningest:\n  inputs: [%s]\n  label_field: label\n"
             "  quality_filter: false\n",
             input);
    bool created = false;
    assert_int_equal(rf_store_run_create(f->db, run, spec, &created), 0);
    assert_true(created);
}

static Refinery__V1__LoadReply *load(fixture *f, const char *run, rf_rpc_status *st) {
    Refinery__V1__LoadRequest req = REFINERY__V1__LOAD_REQUEST__INIT;
    req.run_id = (char *)run;
    ProtobufCMessage *m = NULL;
    rf_rpc_unary(f->client, "/refinery.v1.Ingest/Load", &req.base,
                 &refinery__v1__load_reply__descriptor, &m, 10, st);
    return (Refinery__V1__LoadReply *)m;
}

static void expect_refused(fixture *f, const char *run, grpc_status_code code, const char *text) {
    rf_rpc_status st;
    Refinery__V1__LoadReply *r = load(f, run, &st);
    assert_null(r);
    if (st.code != code || !strstr(st.message, text))
        fail_msg("Load(%s): %s '%s', expected %s '%s'", run, rf_rpc_status_name(st.code),
                 st.message, rf_rpc_status_name(code), text);
}

static bool sealed(fixture *f, const char *run) {
    rf_store_run r;
    assert_int_equal(rf_store_run_get(f->db, run, &r), 0);
    return r.sealed;
}

static void wait_sealed(fixture *f, const char *run) {
    for (double end = rf_now() + 30; !sealed(f, run); nanosleep(&(struct timespec){0, 20000000}, 0))
        if (rf_now() > end) fail_msg("run %s not sealed after 30 s", run);
}

static rf_store_counts ingest_totals(fixture *f, const char *run) {
    rf_store_counts c;
    assert_int_equal(rf_store_progress_total(f->db, run, "ingest", &c), 0);
    return c;
}

/* How many DocumentBatch messages of run each seq has in docs.clean. */
static void count_seqs(fixture *f, const char *run, int *per_seq, size_t n) {
    memset(per_seq, 0, n * sizeof *per_seq);
    const char *topic = "docs.clean";
    char group[64];
    rf_kafka_opts o = {.bootstrap = rf_kafka_mock_bootstrap(f->mock)};
    rf_kafka_consumer *c;
    assert_int_equal(
        rf_kafka_consumer_new(&o, fresh_id("check", group, sizeof group), &topic, 1, &c), 0);
    bool any = false;
    int idle = 0; /* empty polls since the last message */
    for (double end = rf_now() + 30; rf_now() < end && !(any && idle >= 2);) {
        rf_kafka_batch b;
        assert_int_equal(rf_kafka_poll_batch(c, 100, 0.5, &b), 0);
        any |= b.n > 0;
        idle = b.n ? 0 : idle + 1;
        for (size_t i = 0; i < b.n; i++) {
            Refinery__V1__DocumentBatch *d =
                refinery__v1__document_batch__unpack(NULL, b.msgs[i].len, b.msgs[i].value);
            assert_non_null(d);
            if (!strcmp(d->run_id, run) && d->seq < n) per_seq[d->seq]++;
            protobuf_c_message_free_unpacked(&d->base, NULL);
        }
        rf_kafka_batch_release(&b);
    }
    rf_kafka_consumer_free(c);
}

static void test_load_replies_and_refusals(void **state) {
    fixture *f = *state;
    char run[96], bad[96];
    create_run(f, fresh_id("load", run, sizeof run), "docs.jsonl");

    start(f, NULL, 0); /* no input root */
    expect_refused(f, run, GRPC_STATUS_FAILED_PRECONDITION, "no --input-root");
    stop(f);

    start(f, root, 400); /* ~0.25 s per load: a second Load comes while it runs */
    expect_refused(f, "no-such-run", GRPC_STATUS_NOT_FOUND, "unknown run 'no-such-run'");
    expect_refused(f, "", GRPC_STATUS_INVALID_ARGUMENT, "run_id is empty");
    create_run(f, fresh_id("abs", bad, sizeof bad), "/etc/passwd");
    expect_refused(f, bad, GRPC_STATUS_INVALID_ARGUMENT, "'/etc/passwd' is absolute");
    create_run(f, fresh_id("link", bad, sizeof bad), "out/passwd");
    expect_refused(f, bad, GRPC_STATUS_INVALID_ARGUMENT, "'out/passwd' leads out");
    create_run(f, fresh_id("dots", bad, sizeof bad), "./x/../../docs.jsonl");
    expect_refused(f, bad, GRPC_STATUS_INVALID_ARGUMENT, "leads out of the input root");
    create_run(f, fresh_id("missing", bad, sizeof bad), "nope.jsonl");
    expect_refused(f, bad, GRPC_STATUS_NOT_FOUND, "'nope.jsonl' not found");

    rf_rpc_status st;
    Refinery__V1__LoadReply *r = load(f, run, &st);
    assert_non_null(r);
    assert_true(r->started);
    assert_int_equal(r->inputs, 1);
    assert_int_equal(r->batch_docs, BATCH);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    r = load(f, run, &st); /* the same run again: already loading here */
    assert_non_null(r);
    assert_false(r->started);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    wait_sealed(f, run);
    rf_store_counts c = ingest_totals(f, run);
    assert_int_equal(c.batches, RECORDS / BATCH);
    assert_int_equal(c.in, RECORDS);
    assert_int_equal(c.out, RECORDS - RECORDS / 10);
    assert_int_equal(c.rejected, RECORDS / 10);
    expect_refused(f, run, GRPC_STATUS_FAILED_PRECONDITION, "sealed");
}

/* The run as a load accepted before a restart: running, in `loads`. */
static void loads_row(fixture *f, const char *run) {
    assert_int_equal(rf_store_run_start(f->db, run, NULL), 0);
    const char *p[] = {run, root};
    assert_int_equal(
        rf_store_exec(f->db,
                      "INSERT INTO loads (run_id, input_root, batch_docs) VALUES ($1, $2, 10)", 2,
                      p, NULL),
        0);
}

/* A load recorded up to batch 3 resumes at 4 and produces only 4..9. */
static void test_resume_after_recorded_prefix(void **state) {
    fixture *f = *state;
    char run[96];
    create_run(f, fresh_id("resume", run, sizeof run), "docs.jsonl");
    loads_row(f, run);
    for (uint64_t seq = 0; seq < 4; seq++) { /* each batch: 9 kept, 1 not JSON */
        rf_store_counts c = {.in = BATCH, .out = BATCH - 1, .rejected = 1};
        assert_int_equal(rf_store_progress_add(f->db, run, "ingest", seq, &c, NULL), 0);
    }
    start(f, root, 0);
    size_t resumed = 0;
    assert_int_equal(rf_ingest_files_resume(f->files, &resumed), 0);
    assert_true(resumed >= 1); /* other tests' unfinished runs may resume too */
    wait_sealed(f, run);
    rf_store_counts c = ingest_totals(f, run);
    assert_int_equal(c.batches, RECORDS / BATCH);
    assert_int_equal(c.in, RECORDS);
    assert_int_equal(c.out, RECORDS - RECORDS / 10);
    int per_seq[RECORDS / BATCH];
    count_seqs(f, run, per_seq, RECORDS / BATCH);
    for (int s = 0; s < RECORDS / BATCH; s++)
        if (per_seq[s] != (s >= 4))
            fail_msg("batch %d produced %d times, expected %d", s, per_seq[s], s >= 4);
}

/* While another connection holds the run's lock, a resumed loader leaves the
 * run alone; once it is released, the next start loads it. */
static void test_run_locked_elsewhere(void **state) {
    fixture *f = *state;
    char run[96];
    create_run(f, fresh_id("locked", run, sizeof run), "docs.jsonl");
    loads_row(f, run);
    const char *p[] = {run};
    const char *lock = "SELECT pg_advisory_lock(1380338756, hashtext($1))"; /* "RFLD" */
    assert_int_equal(rf_store_exec(f->db, lock, 1, p, NULL), 0);
    start(f, root, 0);
    assert_int_equal(rf_ingest_files_resume(f->files, NULL), 0);
    sleep(1);
    stop(f); /* joins the loader */
    assert_false(sealed(f, run));
    assert_int_equal(ingest_totals(f, run).batches, 0);
    assert_int_equal(
        rf_store_exec(f->db, "SELECT pg_advisory_unlock(1380338756, hashtext($1))", 1, p, NULL), 0);
    start(f, root, 0);
    assert_int_equal(rf_ingest_files_resume(f->files, NULL), 0);
    wait_sealed(f, run);
    assert_int_equal(ingest_totals(f, run).in, RECORDS);
}

/* A cancelled run's loader stops between batches; the run stays unsealed. */
static void test_cancel_stops_the_load(void **state) {
    fixture *f = *state;
    char run[96];
    create_run(f, fresh_id("cancel", run, sizeof run), "docs.jsonl");
    start(f, root, 40); /* 100 records: 2.5 s */
    rf_rpc_status st;
    Refinery__V1__LoadReply *r = load(f, run, &st);
    assert_non_null(r);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    nanosleep(&(struct timespec){0, 300000000}, NULL);
    bool cancelled = false;
    assert_int_equal(rf_store_run_cancel(f->db, run, &cancelled), 0);
    assert_true(cancelled);
    /* The loader sees it by itself (stop() would end it anyway). */
    for (double end = rf_now() + 10;
         !rf_stats_get(rf_ingest_files_stats(f->files), "load.cancelled");
         nanosleep(&(struct timespec){0, 20000000}, NULL))
        if (rf_now() > end) fail_msg("the loader did not stop the cancelled run");
    stop(f);
    assert_false(sealed(f, run));
    rf_store_counts c = ingest_totals(f, run);
    assert_true(c.batches < RECORDS / BATCH);
    assert_int_equal(c.in, c.batches * BATCH); /* what was produced was recorded */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_replies_and_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_after_recorded_prefix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_locked_elsewhere, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_stops_the_load, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
