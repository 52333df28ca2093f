/* The stage service loop against a real PostgreSQL (scripts/test-env/pg.sh,
 * or $REFINERY_PG) and an in-process mock Kafka cluster: a toy stage fails in
 * the middle of a poll (a crash before the commit), is restarted on a new
 * consumer, and in the end every batch is counted exactly once in
 * stage_progress and reaches the output topic, replays and an upstream
 * duplicate included; a message that is not a batch is counted and skipped. */
#include <ctype.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/sys.h"
#include "runtime/kafka/kafka.h"
#include "runtime/kafka/mock.h"
#include "refinery.pb-c.h"
#include "runtime/store/store.h"
#include "runtime/stage_loop.h"
#include "runtime/svc.h"

#include "../support/pg.h"

static test_pg pg_server;

static int group_setup(void **state) {
    return test_pg_start(&pg_server, "loop");
}

static int group_teardown(void **state) {
    test_pg_stop(&pg_server);
    return 0;
}

/* The toy stage: upper-cases texts; documents whose index is a multiple of 5
 * are rejected. Fails once, after producing, on batch fail_seq. With a
 * store, its after_record hook checks that each batch's row is recorded when
 * it is called, counts the calls per seq and fails once on after_fail_seq. */
typedef struct toy {
    rf_kafka_producer *producer;
    const char *out_topic;
    uint64_t fail_seq;
    int failed_once;
    rf_store *store;
    uint64_t after_fail_seq;
    int after_failed_once;
    int after_calls[20];
    int after_unrecorded;
} toy;

static int toy_after_record(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id) {
    toy *ty = user;
    bool has = false;
    assert_int_equal(rf_store_progress_has(ty->store, id->run_id, "upper", id->seq, &has), 0);
    ty->after_unrecorded += !has;
    if (id->seq < 20) ty->after_calls[id->seq]++;
    if (id->seq == ty->after_fail_seq && !ty->after_failed_once) {
        ty->after_failed_once = 1;
        return rf_fail(RF_ERR_IO, "simulated failure after recording batch %llu",
                       (unsigned long long)id->seq);
    }
    return RF_OK;
}

static int toy_process(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                       rf_kafka_tracker *t, rf_store_counts *c) {
    toy *ty = user;
    Refinery__V1__DocumentBatch *in = refinery__v1__document_batch__unpack(NULL, m->len, m->value);
    if (!in) return rf_fail(RF_ERR_PARSE, "not a DocumentBatch");
    Refinery__V1__DocumentBatch out = REFINERY__V1__DOCUMENT_BATCH__INIT;
    out.run_id = in->run_id;
    out.seq = in->seq; /* outputs keep the input's identity */
    Refinery__V1__Document **kept = calloc(in->n_docs + 1, sizeof *kept);
    for (size_t i = 0; i < in->n_docs; i++) {
        c->in++;
        if (i % 5 == 0) {
            c->rejected++;
            continue;
        }
        for (char *p = in->docs[i]->text; *p; p++)
            *p = (char)toupper((unsigned char)*p);
        kept[out.n_docs++] = in->docs[i];
        c->out++;
    }
    out.docs = kept;
    size_t len = refinery__v1__document_batch__get_packed_size(&out);
    uint8_t *buf = malloc(len);
    refinery__v1__document_batch__pack(&out, buf);
    int rc = rf_kafka_produce_tracked(ty->producer, t, ty->out_topic, id->run_id,
                                      strlen(id->run_id), buf, len);
    free(buf);
    free(kept);
    refinery__v1__document_batch__free_unpacked(in, NULL);
    if (rc < 0) return rc;
    if (id->seq == ty->fail_seq && !ty->failed_once) {
        ty->failed_once = 1;
        return rf_fail(RF_ERR_INTERNAL, "simulated crash on batch %llu",
                       (unsigned long long)id->seq);
    }
    return RF_OK;
}

static void produce_batch(rf_kafka_producer *p, const char *topic, const char *run, uint64_t seq) {
    Refinery__V1__Document docs[10], *ptrs[10];
    char texts[10][32], ids[10][32];
    for (int i = 0; i < 10; i++) {
        refinery__v1__document__init(&docs[i]);
        snprintf(ids[i], sizeof ids[i], "b%llu-d%d", (unsigned long long)seq, i);
        snprintf(texts[i], sizeof texts[i], "text %d of batch %llu", i, (unsigned long long)seq);
        docs[i].id = ids[i];
        docs[i].text = texts[i];
        ptrs[i] = &docs[i];
    }
    Refinery__V1__DocumentBatch b = REFINERY__V1__DOCUMENT_BATCH__INIT;
    b.run_id = (char *)run;
    b.seq = seq;
    b.docs = ptrs;
    b.n_docs = 10;
    uint8_t buf[4096];
    size_t len = refinery__v1__document_batch__pack(&b, buf);
    assert_int_equal(rf_kafka_produce(p, topic, run, strlen(run), buf, len), 0);
}

static rf_kafka_consumer *consumer(const char *bootstrap, const char *group, const char *topic) {
    /* A short session: a successor gets the partitions soon after a crash. */
    const char *const extra[] = {"session.timeout.ms", "6000", "heartbeat.interval.ms", "500",
                                 NULL};
    rf_kafka_opts o = {.bootstrap = bootstrap, .extra = extra};
    rf_kafka_consumer *c;
    if (rf_kafka_consumer_new(&o, group, &topic, 1, &c) < 0) fail_msg("%s", rf_errmsg());
    return c;
}

/* Steps until `want` batches were recorded and both the bad message and the
 * upstream duplicate were seen (or 30 s): returns the last step result. */
static int run_until(rf_stage_loop *l, rf_store *st, const char *run, int64_t want) {
    double end = rf_now() + 30;
    int rc = 0;
    rf_store_counts tot = {0};
    while (rf_now() < end) {
        rc = rf_stage_loop_step(l);
        if (rc < 0) return rc;
        assert_int_equal(rf_store_progress_total(st, run, l->stage, &tot), 0);
        if (tot.batches >= want && rf_stats_get(l->stats, "upper.bad_messages") > 0 &&
            rf_stats_get(l->stats, "upper.replayed") > 0)
            break;
    }
    return rc;
}

static void test_crash_and_replay(void **state) {
    rf_kafka_mock *mock;
    assert_int_equal(rf_kafka_mock_new(3, &mock), 0);
    const char *bs = rf_kafka_mock_bootstrap(mock);
    assert_int_equal(rf_kafka_mock_topic(mock, "in", 3), 0);
    assert_int_equal(rf_kafka_mock_topic(mock, "out", 3), 0);
    rf_store_opts so = {.conninfo = pg_server.conninfo};
    rf_store *st;
    assert_int_equal(rf_store_open(&so, &st), 0);
    char run[64];
    snprintf(run, sizeof run, "loop-%d-%.0f", (int)getpid(), rf_now() * 1e6);
    assert_int_equal(rf_store_run_create(st, run, "{}", NULL), 0);

    rf_kafka_opts po = {.bootstrap = bs, .delivery_timeout_s = 10};
    rf_kafka_producer *p;
    assert_int_equal(rf_kafka_producer_new(&po, &p), 0);
    for (uint64_t seq = 0; seq < 20; seq++)
        produce_batch(p, "in", run, seq);
    produce_batch(p, "in", run, 5); /* an upstream replay */
    assert_int_equal(rf_kafka_produce(p, "in", "x", 1, "\xff\xff\xff", 3), 0); /* not a batch */
    assert_int_equal(rf_kafka_flush(p, 10), 0);

    toy ty = {.producer = p, .out_topic = "out", .fail_seq = 12, .store = st, .after_fail_seq = 7};
    rf_stats *stats = rf_stats_new();
    rf_stage_loop l = {.stage = "upper",
                       .producer = p,
                       .store = st,
                       .max_messages = 4,
                       .identify = rf_stage_identify_batch,
                       .process = toy_process,
                       .after_record = toy_after_record,
                       .user = &ty,
                       .stats = stats};
    l.consumer = consumer(bs, "upper", "in");
    /* after_record fails on 7 (its poll is recorded, not committed), then
     * process crashes on 12: each time the poll is delivered again. */
    assert_int_equal(run_until(&l, st, run, 20), RF_ERR_IO);
    rf_kafka_consumer_free(l.consumer);
    l.consumer = consumer(bs, "upper", "in");
    assert_int_equal(run_until(&l, st, run, 20), RF_ERR_INTERNAL);
    rf_kafka_consumer_free(l.consumer);
    l.consumer = consumer(bs, "upper", "in");
    assert_true(run_until(&l, st, run, 20) >= 0);
    rf_kafka_consumer_free(l.consumer);

    rf_store_counts tot;
    assert_int_equal(rf_store_progress_total(st, run, "upper", &tot), 0);
    assert_int_equal(tot.batches, 20);
    assert_int_equal(tot.in, 200);
    assert_int_equal(tot.out, 160);
    assert_int_equal(tot.rejected, 40);
    assert_int_equal(rf_stats_get(stats, "upper.bad_messages"), 1);
    /* Counted when their poll is committed: batch 7's poll failed after
     * recording and came back as replays, so it is never a processed batch;
     * the upstream copy of 5 is a replay too. */
    assert_true(rf_stats_get(stats, "upper.replayed") >= 2);
    assert_true(rf_stats_get(stats, "upper.batches") <= 19);
    /* after_record: for every batch, always after its row, and again for 7
     * when its poll came back as replays. */
    assert_int_equal(ty.after_unrecorded, 0);
    for (int seq = 0; seq < 20; seq++)
        assert_true(ty.after_calls[seq] >= 1);
    assert_true(ty.after_calls[7] >= 2);

    /* Every batch reached "out" (replays may repeat one, with the same seq). */
    int seen[20] = {0};
    rf_kafka_consumer *c = consumer(bs, "check", "out");
    double end = rf_now() + 20;
    int distinct = 0;
    while (distinct < 20 && rf_now() < end) {
        rf_kafka_batch b;
        assert_int_equal(rf_kafka_poll_batch(c, 50, 0.5, &b), 0);
        for (size_t i = 0; i < b.n; i++) {
            rf_stage_batch_id id;
            assert_int_equal(rf_stage_identify_batch(NULL, &b.msgs[i], &id), 0);
            assert_string_equal(id.run_id, run);
            assert_true(id.seq < 20);
            Refinery__V1__DocumentBatch *db =
                refinery__v1__document_batch__unpack(NULL, b.msgs[i].len, b.msgs[i].value);
            assert_int_equal(db->n_docs, 8);
            assert_non_null(strstr(db->docs[0]->text, "TEXT 1 OF BATCH"));
            refinery__v1__document_batch__free_unpacked(db, NULL);
            distinct += seen[id.seq]++ == 0;
        }
        rf_kafka_batch_release(&b);
    }
    assert_int_equal(distinct, 20);
    rf_kafka_consumer_free(c);
    rf_stats_free(stats);
    rf_kafka_producer_free(p);
    rf_store_close(st);
    rf_kafka_mock_free(mock);
}

/* Loss detection: a run with batches its upstream recorded and this stage
 * has not is left alone while its partition is not drained, and failed with
 * the reason once it is; a run that lost nothing, and a run that already
 * ended, are untouched. */
static void test_missing_batches(void **state) {
    rf_kafka_mock *mock;
    assert_int_equal(rf_kafka_mock_new(1, &mock), 0);
    const char *bs = rf_kafka_mock_bootstrap(mock);
    assert_int_equal(rf_kafka_mock_topic(mock, "lin", 1), 0);
    assert_int_equal(rf_kafka_mock_topic(mock, "lout", 1), 0);
    rf_store_opts so = {.conninfo = pg_server.conninfo};
    rf_store *st;
    assert_int_equal(rf_store_open(&so, &st), 0);
    char lost[64], whole[64], ended[64];
    snprintf(lost, sizeof lost, "lost-%d", (int)getpid());
    snprintf(whole, sizeof whole, "whole-%d", (int)getpid());
    snprintf(ended, sizeof ended, "ended-%d", (int)getpid());
    const char *runs[] = {lost, whole, ended};
    const int batches[] = {6, 2, 3};
    rf_store_counts c = {.in = 10, .out = 10};
    for (int r = 0; r < 3; r++) {
        assert_int_equal(rf_store_run_create(st, runs[r], "{}", NULL), 0);
        assert_int_equal(rf_store_run_start(st, runs[r], NULL), 0);
        for (int seq = 0; seq < batches[r]; seq++)
            assert_int_equal(rf_store_progress_add(st, runs[r], "up", (uint64_t)seq, &c, NULL), 0);
    }
    bool cancelled;
    assert_int_equal(rf_store_run_cancel(st, ended, &cancelled), 0);

    rf_kafka_opts po = {.bootstrap = bs, .delivery_timeout_s = 10};
    rf_kafka_producer *p;
    assert_int_equal(rf_kafka_producer_new(&po, &p), 0);
    for (uint64_t seq = 0; seq < 6; seq++)
        if (seq != 2) produce_batch(p, "lin", lost, seq); /* batch 2 never reaches Kafka */
    for (uint64_t seq = 0; seq < 2; seq++)
        produce_batch(p, "lin", whole, seq);
    assert_int_equal(rf_kafka_flush(p, 10), 0);

    toy ty = {.producer = p, .out_topic = "lout", .fail_seq = 99, .after_fail_seq = 99};
    rf_stats *stats = rf_stats_new();
    rf_stage_loop l = {.stage = "lossy",
                       .producer = p,
                       .store = st,
                       .identify = rf_stage_identify_batch,
                       .process = toy_process,
                       .user = &ty,
                       .stats = stats,
                       .counters = "upper",
                       .upstream = "up",
                       .check_interval_s = 3600};
    l.consumer = consumer(bs, "lossy", "lin");
    /* Nothing consumed yet: not drained, nobody failed. */
    assert_int_equal(rf_stage_loop_check_runs(&l), 0);
    rf_store_run run;
    assert_int_equal(rf_store_run_get(st, lost, &run), 0);
    assert_int_equal(run.state, RF_RUN_RUNNING);
    rf_store_counts tot = {0};
    double end = rf_now() + 30;
    while (tot.batches < 5 && rf_now() < end) {
        assert_true(rf_stage_loop_step(&l) >= 0);
        assert_int_equal(rf_store_progress_total(st, lost, "lossy", &tot), 0);
    }
    assert_int_equal(tot.batches, 5);
    end = rf_now() + 30;
    int failed = 0;
    while (failed == 0 && rf_now() < end) { /* the whole run's batches may still be coming */
        assert_true(rf_stage_loop_step(&l) >= 0);
        failed = rf_stage_loop_check_runs(&l);
        assert_true(failed >= 0);
    }
    assert_int_equal(failed, 1);
    assert_int_equal(rf_store_run_get(st, lost, &run), 0);
    assert_int_equal(run.state, RF_RUN_FAILED);
    assert_non_null(strstr(run.error, "input lost: lossy never received 1 of the 6 batches"));
    assert_non_null(strstr(run.error, "seq 2..2 missing, of 0..5"));
    assert_non_null(strstr(run.error, "on lin [0]"));
    assert_non_null(strstr(run.error, "none deleted")); /* nothing deleted: no retention claim */
    assert_null(strstr(run.error, "retention"));
    assert_int_equal(rf_stats_get(stats, "upper.runs_input_lost"), 1);
    assert_int_equal(rf_store_run_get(st, whole, &run), 0);
    assert_int_equal(run.state, RF_RUN_RUNNING);
    assert_int_equal(rf_store_run_get(st, ended, &run), 0);
    assert_int_equal(run.state, RF_RUN_CANCELLED);
    assert_int_equal(rf_stage_loop_check_runs(&l), 0); /* once */

    /* A gap on record is named in the reason, with the retention claim. */
    char again[64];
    snprintf(again, sizeof again, "again-%d", (int)getpid());
    assert_int_equal(rf_store_run_create(st, again, "{}", NULL), 0);
    assert_int_equal(rf_store_progress_add(st, again, "up", 7, &c, NULL), 0);
    assert_int_equal(rf_store_gap_add(st, "lossy", "lin", 0, 3, 9), 0);
    assert_int_equal(rf_store_gap_add(st, "lossy", "lin", 0, 3, 10), 0); /* widened */
    assert_int_equal(rf_stage_loop_check_runs(&l), 1);
    assert_int_equal(rf_store_run_get(st, again, &run), 0);
    assert_int_equal(run.state, RF_RUN_FAILED);
    assert_non_null(strstr(run.error, "offsets 3..9 were deleted before lossy consumed them"));
    assert_non_null(strstr(run.error, "probable retention"));

    rf_kafka_consumer_free(l.consumer);
    rf_stats_free(stats);
    rf_kafka_producer_free(p);
    rf_store_close(st);
    rf_kafka_mock_free(mock);
}

static void test_identify(void **state) {
    Refinery__V1__TokenBatch tb = REFINERY__V1__TOKEN_BATCH__INIT;
    tb.run_id = "r9";
    tb.seq = 1234567890123ull;
    tb.eval = 1;
    uint8_t buf[64];
    size_t len = refinery__v1__token_batch__pack(&tb, buf);
    rf_kafka_msg m = {.value = buf, .len = len};
    rf_stage_batch_id id;
    assert_int_equal(rf_stage_identify_batch(NULL, &m, &id), 0);
    assert_string_equal(id.run_id, "r9");
    assert_int_equal(id.seq, 1234567890123ull);
    /* Every truncation either fails cleanly or ends at a field boundary. */
    for (size_t cut = 0; cut < len; cut++) {
        m.len = cut;
        if (rf_stage_identify_batch(NULL, &m, &id) == 0) assert_string_equal(id.run_id, "r9");
    }
    /* A run id that is not UTF-8 text is not a batch (it would break the SQL). */
    const char *bad[] = {"r\xff", "r\0x"};
    for (size_t k = 0; k < 2; k++) {
        uint8_t raw[] = {0x0a, 2, (uint8_t)bad[k][0], (uint8_t)bad[k][1], 0x10, 7};
        m = (rf_kafka_msg){.value = raw, .len = sizeof raw};
        assert_int_equal(rf_stage_identify_batch(NULL, &m, &id), RF_ERR_PARSE);
    }
}

static void test_stop_flag(void **state) {
    /* A SIGTERM pending on a loop that nobody waits for still stops it. */
    assert_int_equal(rf_svc_signals_init(), 0);
    assert_false(rf_svc_stopping());
    raise(SIGTERM);
    assert_true(rf_svc_stopping());
    rf_stage_loop l = {.stage = "never"}; /* run returns before touching anything */
    assert_int_equal(rf_stage_loop_run(&l), 0);
}

/* --- process modes for tests/services/stage_kill.test.sh --- */

static int tool_fail(const char *what) {
    fprintf(stderr, "test_stage_loop: %s: %s\n", what, rf_errmsg());
    return 1;
}

/* --run PG RUN: applies the schema and creates the run. */
static int tool_run(const char *pg, const char *run) {
    rf_store_opts so = {.conninfo = pg};
    rf_store *st;
    if (rf_store_open(&so, &st) < 0) return tool_fail("store");
    int rc = rf_store_run_create(st, run, "{}", NULL);
    rf_store_close(st);
    return rc < 0 ? tool_fail("run") : 0;
}

/* --produce BOOTSTRAP RUN N: N input batches of 10 documents to "in". */
static int tool_produce(const char *bs, const char *run, int n) {
    rf_kafka_opts po = {.bootstrap = bs};
    rf_kafka_producer *p;
    if (rf_kafka_producer_new(&po, &p) < 0) return tool_fail("producer");
    for (int seq = 0; seq < n; seq++) {
        Refinery__V1__Document docs[10], *ptrs[10];
        char texts[10][48], ids[10][32];
        for (int i = 0; i < 10; i++) {
            refinery__v1__document__init(&docs[i]);
            snprintf(ids[i], sizeof ids[i], "b%d-d%d", seq, i);
            snprintf(texts[i], sizeof texts[i], "text %d of batch %d", i, seq);
            docs[i].id = ids[i];
            docs[i].text = texts[i];
            ptrs[i] = &docs[i];
        }
        Refinery__V1__DocumentBatch b = REFINERY__V1__DOCUMENT_BATCH__INIT;
        b.run_id = (char *)run;
        b.seq = (uint64_t)seq;
        b.docs = ptrs;
        b.n_docs = 10;
        uint8_t buf[4096];
        size_t len = refinery__v1__document_batch__pack(&b, buf);
        if (rf_kafka_produce(p, "in", run, strlen(run), buf, len) < 0) return tool_fail("produce");
    }
    int rc = rf_kafka_flush(p, 30);
    rf_kafka_producer_free(p);
    return rc < 0 ? tool_fail("flush") : 0;
}

/* Each batch takes ~20 ms in the service mode, so that a SIGKILL lands
 * mid-stream. */
static int slow_process(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                        rf_kafka_tracker *t, rf_store_counts *c) {
    usleep(20000);
    return toy_process(user, m, id, t, c);
}

/* --stage BOOTSTRAP PG: the toy stage as a service, until SIGTERM. */
static int tool_stage(const char *bs, const char *pg) {
    if (rf_svc_signals_init() < 0) return tool_fail("signals");
    rf_store_opts so = {.conninfo = pg};
    rf_store *st;
    if (rf_store_open(&so, &st) < 0) return tool_fail("store");
    rf_kafka_opts po = {.bootstrap = bs};
    rf_kafka_producer *p;
    if (rf_kafka_producer_new(&po, &p) < 0) return tool_fail("producer");
    toy ty = {.producer = p, .out_topic = "out", .fail_seq = UINT64_MAX};
    rf_stats *stats = rf_stats_new();
    const char *in = "in";
    rf_kafka_opts co = {.bootstrap = bs};
    rf_stage_loop l = {.stage = "upper",
                       .producer = p,
                       .store = st,
                       .max_messages = 8,
                       .identify = rf_stage_identify_batch,
                       .process = slow_process,
                       .user = &ty,
                       .stats = stats};
    if (rf_kafka_consumer_new(&co, "upper", &in, 1, &l.consumer) < 0) return tool_fail("consumer");
    int rc = rf_stage_loop_run(&l);
    rf_buf b = RF_BUF_INIT;
    rf_stats_to_json(stats, &b);
    printf("%s\n", b.data ? b.data : "{}");
    rf_buf_free(&b);
    rf_kafka_consumer_free(l.consumer);
    rf_stats_free(stats);
    rf_kafka_producer_free(p);
    rf_store_close(st);
    return rc < 0 ? 1 : 0;
}

/* --check BOOTSTRAP RUN N: "out" holds every batch 0..N-1 of RUN (repeats
 * allowed), each with 8 documents; prints how many messages were repeats. */
static int tool_check(const char *bs, const char *run, int n) {
    int *seen = calloc((size_t)n + 1, sizeof *seen), distinct = 0, repeats = 0, bad = 0;
    const char *out = "out";
    rf_kafka_opts co = {.bootstrap = bs};
    rf_kafka_consumer *c;
    if (!seen || rf_kafka_consumer_new(&co, "check", &out, 1, &c) < 0) return tool_fail("consumer");
    double end = rf_now() + 60;
    while (distinct < n && rf_now() < end && !bad) {
        rf_kafka_batch b;
        if (rf_kafka_poll_batch(c, 100, 0.5, &b) < 0) return tool_fail("poll");
        for (size_t i = 0; i < b.n && !bad; i++) {
            Refinery__V1__DocumentBatch *db =
                refinery__v1__document_batch__unpack(NULL, b.msgs[i].len, b.msgs[i].value);
            bad = !db || strcmp(db->run_id, run) != 0 || db->seq >= (uint64_t)n || db->n_docs != 8;
            if (!bad) {
                if (seen[db->seq]++)
                    repeats++;
                else
                    distinct++;
            }
            if (db) refinery__v1__document_batch__free_unpacked(db, NULL);
        }
        rf_kafka_batch_release(&b);
    }
    rf_kafka_consumer_free(c);
    free(seen);
    printf("distinct=%d repeats=%d\n", distinct, repeats);
    return !bad && distinct == n ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--run")) return tool_run(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "--produce"))
        return tool_produce(argv[2], argv[3], atoi(argv[4]));
    if (argc == 4 && !strcmp(argv[1], "--stage")) return tool_stage(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "--check"))
        return tool_check(argv[2], argv[3], atoi(argv[4]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identify), cmocka_unit_test(test_missing_batches),
        cmocka_unit_test(test_crash_and_replay),
        cmocka_unit_test(test_stop_flag), /* last: the stop flag is process-wide */
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
