/* services/runtime/kafka against librdkafka's mock cluster (3 brokers, started in
 * this process), or against $KAFKA_BOOTSTRAP when set: the broker-fault tests
 * then need $KAFKA_MOCK_CONTROL, the command FIFO of a refinery-kafka-mock
 * process (tests/services/kafka_mock.test.sh), and are skipped without it.
 * Round trip, a consumer restart resuming from the
 * committed offset without loss or duplicates, bounded in-flight, delivery
 * failure reported by flush, broker down/up mid-stream, the rejects topic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>

#include "common/error.h"
#include "common/sys.h"
#include "runtime/kafka/kafka.h"
#include "runtime/kafka/mock.h"
#include "refinery.pb-c.h"
#include "../support/skip.h"

static rf_kafka_mock *mock;
static const char *bootstrap;
static const char *control; /* FIFO of an external refinery-kafka-mock */

static int can_fault(void) {
    return mock || control;
}

/* Sends "down N" / "up N" / "topic NAME N" to the in-process or external mock. */
static int mock_cmd(const char *verb, const char *name, int n) {
    if (mock) {
        if (!strcmp(verb, "down")) return rf_kafka_mock_broker_down(mock, n);
        if (!strcmp(verb, "up")) return rf_kafka_mock_broker_up(mock, n);
        return rf_kafka_mock_topic(mock, name, n);
    }
    if (!control) return 0; /* a real cluster: topics are auto-created */
    FILE *f = fopen(control, "w");
    if (!f) return -1;
    if (name)
        fprintf(f, "%s %s %d\n", verb, name, n);
    else
        fprintf(f, "%s %d\n", verb, n);
    fclose(f);
    usleep(200000); /* the helper applies it within its 200 ms poll */
    return 0;
}

/* The brokers a test took down (bit b), brought back by its teardown even
 * when an assertion ends it early, so one failure does not leave the next
 * tests without a cluster. */
static unsigned down_mask;

static int broker_down(int b) {
    int rc = mock_cmd("down", NULL, b);
    if (!rc) down_mask |= 1u << b;
    return rc;
}
static int broker_up(int b) {
    int rc = mock_cmd("up", NULL, b);
    if (!rc) down_mask &= ~(1u << b);
    return rc;
}
static int brokers_back(void **state) {
    (void)state;
    for (int b = 1; b <= 3; b++)
        if (down_mask & 1u << b) (void)broker_up(b);
    return 0;
}

static int group_setup(void **state) {
    bootstrap = getenv("KAFKA_BOOTSTRAP");
    control = getenv("KAFKA_MOCK_CONTROL");
    if (bootstrap && *bootstrap) return 0;
    if (rf_kafka_mock_new(3, &mock) < 0) return -1;
    bootstrap = rf_kafka_mock_bootstrap(mock);
    return 0;
}

static int group_teardown(void **state) {
    rf_kafka_mock_free(mock);
    return 0;
}

/* Names unique to this run, so that a real cluster's old data does not count. */
static const char *unique(const char *base) {
    static char names[8][96];
    static int next;
    char *n = names[next++ % 8];
    snprintf(n, 96, "%s-%d-%lld", base, (int)getpid(), (long long)(rf_now() * 1e6));
    return n;
}

static void make_topic(const char *topic, int partitions) {
    assert_int_equal(mock_cmd("topic", topic, partitions), 0);
}

static rf_kafka_producer *producer_x(int max_in_flight, double timeout_s,
                                     const char *const *extra) {
    rf_kafka_opts o = {.bootstrap = bootstrap,
                       .max_in_flight = max_in_flight,
                       .delivery_timeout_s = timeout_s,
                       .extra = extra};
    rf_kafka_producer *p;
    if (rf_kafka_producer_new(&o, &p) < 0) fail_msg("producer: %s", rf_errmsg());
    return p;
}

static rf_kafka_producer *producer(int max_in_flight, double timeout_s) {
    return producer_x(max_in_flight, timeout_s, NULL);
}

static rf_kafka_consumer *consumer(const char *group, const char *topic) {
    const char *const extra[] = {"session.timeout.ms", "6000", "heartbeat.interval.ms", "500",
                                 NULL};
    rf_kafka_opts o = {.bootstrap = bootstrap, .extra = extra};
    rf_kafka_consumer *c;
    if (rf_kafka_consumer_new(&o, group, &topic, 1, &c) < 0) fail_msg("consumer: %s", rf_errmsg());
    return c;
}

static void produce_range(rf_kafka_producer *p, const char *topic, int from, int to) {
    for (int i = from; i < to; i++) {
        char v[32];
        int n = snprintf(v, sizeof v, "%d", i);
        if (rf_kafka_produce(p, topic, v, (size_t)n, v, (size_t)n) < 0)
            fail_msg("produce %d: %s", i, rf_errmsg());
    }
}

/* Consumes until `want` messages arrived in total (or 20 s passed), counting
 * each value in seen[]; commits after each batch when commit is set. Stops
 * after `limit` messages (a batch may overshoot) when limit > 0. */
static int consume(rf_kafka_consumer *c, int *seen, int nseen, int want, int commit) {
    int got = 0;
    double end = rf_now() + 20;
    while (got < want && rf_now() < end) {
        rf_kafka_batch b;
        if (rf_kafka_poll_batch(c, 100, 0.5, &b) < 0) fail_msg("poll: %s", rf_errmsg());
        for (size_t i = 0; i < b.n; i++) {
            char v[32];
            size_t n = b.msgs[i].len < sizeof v - 1 ? b.msgs[i].len : sizeof v - 1;
            memcpy(v, b.msgs[i].value, n);
            v[n] = 0;
            int x = atoi(v);
            assert_true(x >= 0 && x < nseen);
            seen[x]++;
        }
        got += (int)b.n;
        if (commit) assert_int_equal(rf_kafka_commit_batch(c, &b), 0);
        rf_kafka_batch_release(&b);
    }
    return got;
}

static void test_round_trip(void **state) {
    const char *topic = unique("rt");
    make_topic(topic, 3);
    rf_kafka_producer *p = producer(0, 10);
    produce_range(p, topic, 0, 3000);
    assert_int_equal(rf_kafka_flush(p, 10), 0);
    assert_int_equal(rf_kafka_delivered(p), 3000);
    assert_int_equal(rf_kafka_failed(p), 0);
    rf_kafka_producer_free(p);

    int *seen = calloc(3000, sizeof *seen);
    rf_kafka_consumer *c = consumer(unique("g"), topic);
    assert_int_equal(consume(c, seen, 3000, 3000, 1), 3000);
    for (int i = 0; i < 3000; i++)
        assert_int_equal(seen[i], 1);
    rf_kafka_consumer_free(c);
    free(seen);
}

/* A consumer commits some batches, processes one more without committing
 * (as if it crashed before its outputs were flushed), and goes away. Its
 * successor in the group gets exactly everything not committed. */
static void test_restart_resumes_from_commit(void **state) {
    const char *topic = unique("resume");
    const char *group = unique("g");
    enum { N = 2000 };
    make_topic(topic, 3);
    rf_kafka_producer *p = producer(0, 10);
    produce_range(p, topic, 0, N);
    assert_int_equal(rf_kafka_flush(p, 10), 0);
    rf_kafka_producer_free(p);

    int *committed = calloc(N, sizeof *committed), *uncommitted = calloc(N, sizeof *uncommitted),
        *later = calloc(N, sizeof *later);
    rf_kafka_consumer *c = consumer(group, topic);
    int first = consume(c, committed, N, 700, 1);
    assert_true(first >= 700 && first < N);
    rf_kafka_batch b;
    double end = rf_now() + 10;
    do {
        assert_int_equal(rf_kafka_poll_batch(c, 50, 0.5, &b), 0);
    } while (b.n == 0 && rf_now() < end);
    assert_true(b.n > 0);
    for (size_t i = 0; i < b.n; i++)
        uncommitted[atoi((const char *)b.msgs[i].value)]++;
    rf_kafka_batch_release(&b); /* not committed */
    rf_kafka_consumer_free(c);

    c = consumer(group, topic);
    int second = consume(c, later, N, N - first, 1);
    assert_int_equal(second, N - first);
    for (int i = 0; i < N; i++) {
        assert_int_equal(committed[i] + later[i], 1);      /* nothing lost, nothing twice */
        if (uncommitted[i]) assert_int_equal(later[i], 1); /* redelivered */
    }
    /* Nothing more arrives. */
    assert_int_equal(rf_kafka_poll_batch(c, 10, 1.0, &b), 0);
    assert_int_equal(b.n, 0);
    rf_kafka_batch_release(&b);
    rf_kafka_consumer_free(c);
    free(committed);
    free(uncommitted);
    free(later);
}

static void test_bounded_in_flight(void **state) {
    const char *topic = unique("bp");
    make_topic(topic, 1);
    rf_kafka_producer *p = producer(20, 10);
    int peak = 0;
    for (int i = 0; i < 500; i++) {
        produce_range(p, topic, i, i + 1);
        int n = rf_kafka_in_flight(p);
        if (n > peak) peak = n;
    }
    assert_true(peak <= 20);
    assert_int_equal(rf_kafka_flush(p, 10), 0);
    assert_int_equal(rf_kafka_delivered(p), 500);
    rf_kafka_producer_free(p);
}

/* Every broker down: messages time out, flush says so (the caller must not
 * commit its inputs); once they are back, new messages go through. */
static void test_flush_reports_failure(void **state) {
    if (!can_fault())
        RF_SKIP("external Kafka at %s without KAFKA_MOCK_CONTROL: brokers cannot be stopped",
                bootstrap);
    const char *topic = unique("fail");
    make_topic(topic, 1);
    /* a request caught on a connection the fault cuts fails after
     * socket.timeout.ms (60 s by default), not message.timeout.ms: 3 s here */
    const char *const sock[] = {"socket.timeout.ms", "3000", NULL};
    rf_kafka_producer *p = producer_x(0, 1.5, sock);
    produce_range(p, topic, 0, 10);
    assert_int_equal(rf_kafka_flush(p, 5), 0);
    for (int b = 1; b <= 3; b++)
        assert_int_equal(broker_down(b), 0);
    /* One message accounted apart (as one gRPC stream among many would be). */
    rf_kafka_tracker t = {0};
    assert_int_equal(rf_kafka_produce_tracked(p, &t, topic, "k", 1, "tracked", 7), 0);
    produce_range(p, topic, 10, 20);
    /* (generous waits: the messages time out after 1.5 s, a request in
     * flight after 3 s) */
    assert_int_equal(rf_kafka_wait(p, &t, 30), RF_ERR_IO);
    assert_int_equal(t.failed, 1);
    assert_int_equal(t.delivered, 0);
    assert_non_null(strstr(rf_errmsg(), "timed out"));
    assert_int_equal(rf_kafka_flush(p, 30), RF_ERR_IO);
    assert_non_null(strstr(rf_errmsg(), "not delivered"));
    assert_int_equal(rf_kafka_failed(p), 11);
    for (int b = 1; b <= 3; b++)
        assert_int_equal(broker_up(b), 0);
    /* The same producer recovers once it has reconnected (its first tries
     * may still time out while it does). */
    int ok = 0;
    for (int attempt = 0; attempt < 10 && !ok; attempt++) {
        produce_range(p, topic, 20, 30);
        ok = rf_kafka_flush(p, 10) == 0;
    }
    assert_true(ok);
    rf_kafka_producer_free(p);
}

/* One broker goes down mid-stream and comes back within the delivery
 * timeout: retries deliver everything, and idempotence keeps it once. */
static void test_broker_down_up(void **state) {
    if (!can_fault())
        RF_SKIP("external Kafka at %s without KAFKA_MOCK_CONTROL: brokers cannot be stopped",
                bootstrap);
    enum { N = 3000 };
    const char *topic = unique("downup");
    make_topic(topic, 3);
    rf_kafka_producer *p = producer(0, 20);
    produce_range(p, topic, 0, N / 3);
    assert_int_equal(broker_down(1), 0);
    produce_range(p, topic, N / 3, 2 * N / 3);
    rf_kafka_flush(p, 1); /* partitions led by broker 1 wait */
    assert_int_equal(broker_up(1), 0);
    produce_range(p, topic, 2 * N / 3, N);
    assert_int_equal(rf_kafka_flush(p, 20), 0);
    assert_int_equal(rf_kafka_delivered(p), N);
    rf_kafka_producer_free(p);

    int *seen = calloc(N, sizeof *seen);
    rf_kafka_consumer *c = consumer(unique("g"), topic);
    assert_int_equal(consume(c, seen, N, N, 1), N);
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    rf_kafka_batch b;
    assert_int_equal(rf_kafka_poll_batch(c, 10, 1.0, &b), 0);
    assert_int_equal(b.n, 0);
    rf_kafka_batch_release(&b);
    rf_kafka_consumer_free(c);
    free(seen);
}

static void test_rejects_topic(void **state) {
    const char *topic = unique("rejected");
    make_topic(topic, 1);
    rf_kafka_producer *p = producer(0, 10);
    rf_kafka_tracker t = {0};
    rf_kafka_reject r = {.run_id = "run-7",
                         .doc_id = "d17",
                         .source = "reviews.jsonl",
                         .line = 17,
                         .offset = 4096,
                         .reason = "invalid_utf8",
                         .excerpt = "\xff\xfe bad",
                         .excerpt_len = 6};
    assert_int_equal(rf_kafka_produce_reject(p, &t, topic, &r), 0);
    assert_int_equal(rf_kafka_wait(p, &t, 10), 0);
    assert_int_equal(t.delivered, 1);
    rf_kafka_producer_free(p);

    rf_kafka_consumer *c = consumer(unique("g"), topic);
    rf_kafka_batch b = {0};
    double end = rf_now() + 20;
    while (b.n == 0 && rf_now() < end) {
        rf_kafka_batch_release(&b);
        assert_int_equal(rf_kafka_poll_batch(c, 10, 0.5, &b), 0);
    }
    assert_int_equal(b.n, 1);
    assert_int_equal(b.msgs[0].key_len, 5);
    assert_memory_equal(b.msgs[0].key, "run-7", 5); /* a run's rejects share a partition */
    Refinery__V1__Reject *got = refinery__v1__reject__unpack(NULL, b.msgs[0].len, b.msgs[0].value);
    assert_non_null(got);
    assert_string_equal(got->run_id, "run-7");
    assert_string_equal(got->doc_id, "d17");
    assert_string_equal(got->source, "reviews.jsonl");
    assert_int_equal(got->line, 17);
    assert_int_equal(got->offset, 4096);
    assert_string_equal(got->reason, "invalid_utf8");
    assert_int_equal(got->excerpt.len, 6);
    refinery__v1__reject__free_unpacked(got, NULL);
    rf_kafka_batch_release(&b);
    rf_kafka_consumer_free(c);
}

/* A committed offset beyond the log's end (the topic was deleted and made
 * again) fails the poll instead of skipping anywhere; a fresh group on the
 * same topic reads from the start. */
static void test_offset_out_of_range(void **state) {
    const char *topic = unique("gone");
    make_topic(topic, 1);
    rf_kafka_producer *p = producer(0, 10);
    for (int i = 0; i < 3; i++)
        assert_int_equal(rf_kafka_produce(p, topic, "k", 1, "v", 1), 0);
    assert_int_equal(rf_kafka_flush(p, 10), 0);
    rf_kafka_producer_free(p);

    const char *group = unique("g");
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err, sizeof err), 0);
    assert_int_equal(rd_kafka_conf_set(conf, "group.id", group, err, sizeof err), 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    assert_non_null(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, 0)->offset = 1000;
    assert_int_equal(rd_kafka_commit(rk, l, 0), 0);
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);

    rf_kafka_consumer *c = consumer(group, topic);
    rf_kafka_batch b = {0};
    int rc = 0;
    double end = rf_now() + 20;
    while (rc == 0 && rf_now() < end) {
        rc = rf_kafka_poll_batch(c, 10, 0.5, &b);
        assert_int_equal(b.n, 0);
        rf_kafka_batch_release(&b);
    }
    assert_int_equal(rc, RF_ERR_IO);
    assert_non_null(strstr(rf_errmsg(), "beyond the log's end"));
    rf_kafka_consumer_free(c);

    c = consumer(unique("fresh"), topic);
    size_t got = 0;
    end = rf_now() + 20;
    while (got < 3 && rf_now() < end) {
        assert_int_equal(rf_kafka_poll_batch(c, 10, 0.5, &b), 0);
        got += b.n;
        rf_kafka_batch_release(&b);
    }
    assert_int_equal(got, 3);
    rf_kafka_consumer_free(c);
}

/* Polls until a batch reports gaps (or 20 s pass), counting messages. */
static size_t poll_gaps(rf_kafka_consumer *c, rf_kafka_gap *gap, size_t *got) {
    size_t n_gaps = 0;
    double end = rf_now() + 20;
    while (n_gaps == 0 && rf_now() < end) {
        rf_kafka_batch b;
        if (rf_kafka_poll_batch(c, 100, 0.5, &b) < 0) fail_msg("poll: %s", rf_errmsg());
        *got += b.n;
        if (b.n_gaps) *gap = b.gaps[0];
        n_gaps = b.n_gaps;
        assert_int_equal(rf_kafka_commit_batch(c, &b), 0);
        rf_kafka_batch_release(&b);
    }
    return n_gaps;
}

/* Records deleted before a group read them (the mock keeps 5 MB of a
 * partition, as retention would): a group whose committed offset is below
 * the log's start, and a new group on a log that no longer starts at 0,
 * resume at the log's start and report the deleted range as a gap. */
static void test_retention_gap(void **state) {
    if (!mock) skip(); /* the 5 MB limit is the in-process mock's */
    const char *topic = unique("retained");
    make_topic(topic, 1);
    const char *group = unique("g");
    rf_kafka_producer *p = producer(0, 10);
    produce_range(p, topic, 0, 1);
    assert_int_equal(rf_kafka_flush(p, 10), 0);
    rf_kafka_consumer *c = consumer(group, topic);
    int seen[1] = {0};
    assert_int_equal(consume(c, seen, 1, 1, 1), 1);
    rf_kafka_consumer_free(c); /* committed offset 1 */

    /* 7 MB in 100 KB messages: the first ones leave the log. */
    static char big[100 * 1024];
    memset(big, 'x', sizeof big);
    for (int i = 0; i < 70; i++)
        assert_int_equal(rf_kafka_produce(p, topic, "k", 1, big, sizeof big), 0);
    assert_int_equal(rf_kafka_flush(p, 30), 0);
    rf_kafka_producer_free(p);

    rf_kafka_gap gap;
    size_t got = 0;
    c = consumer(group, topic);
    assert_int_equal(poll_gaps(c, &gap, &got), 1);
    assert_string_equal(gap.topic, topic);
    assert_int_equal(gap.partition, 0);
    assert_int_equal(gap.from, 1);
    assert_true(gap.to > 1 && gap.to < 71);
    double end = rf_now() + 20;
    while (got < (size_t)(71 - gap.to) && rf_now() < end) {
        rf_kafka_batch b;
        assert_int_equal(rf_kafka_poll_batch(c, 100, 0.5, &b), 0);
        got += b.n;
        rf_kafka_batch_release(&b);
    }
    assert_int_equal(got, 71 - gap.to); /* everything after the gap, once */
    /* Drained: the standing says so for the partition of any key. */
    rf_kafka_standing st;
    assert_int_equal(rf_kafka_consumer_standing(c, topic, "run", 3, 10, &st), 0);
    assert_true(st.assigned);
    assert_int_equal(st.partition, 0);
    assert_int_equal(st.low, gap.to);
    assert_int_equal(st.high, 71);
    assert_int_equal(st.position, 71);
    rf_kafka_consumer_free(c);

    rf_kafka_gap fresh;
    got = 0;
    c = consumer(unique("fresh"), topic);
    assert_int_equal(poll_gaps(c, &fresh, &got), 1);
    assert_int_equal(fresh.from, 0);
    assert_int_equal(fresh.to, gap.to);
    rf_kafka_consumer_free(c);
}

/* Topics a service needs: missing ones named when it may not create them,
 * created (and then found) when it may; repeated and NULL names are fine. */
static void test_topics_ensure(void **state) {
    if (!mock) skip(); /* creates topics */
    const char *a = unique("need-a"), *b = unique("need-b");
    const char *const topics[] = {a, b, NULL, a};
    rf_kafka_opts o = {.bootstrap = bootstrap};
    assert_int_equal(rf_kafka_topics_ensure(&o, topics, 4, 2, false, 5), RF_ERR_NOT_FOUND);
    assert_non_null(strstr(rf_errmsg(), a));
    assert_non_null(strstr(rf_errmsg(), b));
    assert_int_equal(rf_kafka_topics_ensure(&o, topics, 4, 2, true, 5), 0);
    assert_int_equal(rf_kafka_topics_ensure(&o, topics, 4, 2, false, 5), 0);
    /* A consumer of a created topic gets its messages (no start position
     * trouble on a fresh topic). */
    rf_kafka_producer *p = producer(0, 10);
    produce_range(p, a, 0, 5);
    assert_int_equal(rf_kafka_flush(p, 10), 0);
    rf_kafka_producer_free(p);
    rf_kafka_consumer *c = consumer(unique("g"), a);
    int seen[5] = {0};
    assert_int_equal(consume(c, seen, 5, 5, 1), 5);
    rf_kafka_consumer_free(c);
}

static void test_bad_config(void **state) {
    rf_kafka_opts o = {.bootstrap = NULL};
    rf_kafka_producer *p;
    assert_int_equal(rf_kafka_producer_new(&o, &p), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "KAFKA_BOOTSTRAP"));
    const char *const extra[] = {"no.such.property", "1", NULL};
    o = (rf_kafka_opts){.bootstrap = bootstrap, .extra = extra};
    assert_int_equal(rf_kafka_producer_new(&o, &p), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "no.such.property"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_restart_resumes_from_commit),
        cmocka_unit_test(test_bounded_in_flight),
        cmocka_unit_test_teardown(test_flush_reports_failure, brokers_back),
        cmocka_unit_test_teardown(test_broker_down_up, brokers_back),
        cmocka_unit_test(test_rejects_topic),
        cmocka_unit_test(test_offset_out_of_range),
        cmocka_unit_test(test_retention_gap),
        cmocka_unit_test(test_topics_ensure),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
