/* The Ingest.Push service in-process: gRPC server + mock Kafka cluster +
 * C client. Every pushed document is accounted for in the summary and found
 * exactly once in docs.clean or docs.rejected; bad input gets its status
 * code or reject reason and the service keeps serving; a Kafka outage fails
 * the stream with UNAVAILABLE instead of a summary. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "runtime/kafka/kafka.h"
#include "runtime/kafka/mock.h"
#include "refinery.pb-c.h"
#include "runtime/rpc/client.h"
#include "runtime/rpc/rpc.h"
#include "ingest/decide.h"
#include "ingest/server/ingest_service.h"

#define PUSH       "/refinery.v1.Ingest/Push"
#define PUSH_LISTS "/refinery.v1.Ingest/PushLists"

typedef struct fixture {
    rf_kafka_mock *mock;
    rf_kafka_producer *producer;
    rf_ingest_service *svc;
    rf_rpc_server *server;
    rf_rpc_client *client;
    char clean[64], rejected[64];
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    snprintf(f->clean, sizeof f->clean, "docs.clean.%d.%.0f", (int)getpid(), rf_now() * 1e6);
    snprintf(f->rejected, sizeof f->rejected, "docs.rejected.%d.%.0f", (int)getpid(),
             rf_now() * 1e6);
    if (rf_kafka_mock_new(3, &f->mock) < 0 || rf_kafka_mock_topic(f->mock, f->clean, 3) < 0 ||
        rf_kafka_mock_topic(f->mock, f->rejected, 1) < 0)
        return -1;
    rf_kafka_opts ko = {.bootstrap = rf_kafka_mock_bootstrap(f->mock), .delivery_timeout_s = 2};
    if (rf_kafka_producer_new(&ko, &f->producer) < 0) return -1;
    rf_ingest_service_opts so;
    rf_ingest_service_opts_default(&so);
    so.producer = f->producer;
    so.topic_clean = f->clean;
    so.topic_rejected = f->rejected;
    so.batch_docs = 32;
    so.delivery_timeout_s = 3;
    rf_rpc_server_opts ro = {.listen = "127.0.0.1:0", .workers = 4, .max_message = 64 * 1024};
    if (rf_ingest_service_new(&so, &f->svc) < 0 || rf_rpc_server_new(&ro, &f->server) < 0 ||
        rf_ingest_service_register(f->svc, f->server) < 0 || rf_rpc_server_start(f->server) < 0)
        return -1;
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", rf_rpc_server_port(f->server));
    return rf_rpc_client_new(target, NULL, 1 << 20, &f->client);
}

static int teardown(void **state) {
    fixture *f = *state;
    rf_rpc_client_free(f->client);
    rf_rpc_server_free(f->server);
    rf_ingest_service_free(f->svc);
    rf_kafka_producer_free(f->producer);
    rf_kafka_mock_free(f->mock);
    free(f);
    return 0;
}

/* Document i of a test stream: every 10th is empty, every 10th (offset 5)
 * is not UTF-8, the rest are fine. */
static const char *doc_text(int i, char *buf, size_t size) {
    if (i % 10 == 0) return "   ";
    if (i % 10 == 5) return "caf\xe9 au lait, not UTF-8";
    snprintf(buf, size, "Review number %d: the product works as described.", i);
    return buf;
}

typedef struct push_result {
    grpc_status_code code;
    uint64_t received, accepted, rejected;
} push_result;

/* Ends a push stream: its summary and status. */
static push_result end_push(rf_rpc_stream *st) {
    push_result res = {GRPC_STATUS_UNKNOWN, 0, 0, 0};
    rf_rpc_stream_close_send(st);
    ProtobufCMessage *m = NULL;
    if (rf_rpc_stream_recv(st, &refinery__v1__push_summary__descriptor, &m) == 1) {
        Refinery__V1__PushSummary *s = (void *)m;
        res.received = s->received;
        res.accepted = s->accepted;
        res.rejected = s->rejected;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    rf_rpc_status status;
    rf_rpc_stream_finish(st, &status);
    res.code = status.code;
    return res;
}

static push_result push_docs(rf_rpc_client *c, const char *run, int from, int to, int junk_at) {
    const char *const md[] = {"refinery-run-id", run, NULL};
    rf_rpc_stream *st;
    rf_rpc_stream_open_md(c, PUSH, 20, md, &st);
    for (int i = from; i < to; i++) {
        if (i == junk_at) {
            rf_rpc_stream_send_raw(st, "\x12\xff", 2);
            continue;
        }
        char id[32], text[128];
        snprintf(id, sizeof id, "d%d", i);
        Refinery__V1__Document d = REFINERY__V1__DOCUMENT__INIT;
        d.id = id;
        d.text = (char *)doc_text(i, text, sizeof text);
        d.label = i % 2;
        d.line = (uint64_t)i + 1;
        if (rf_rpc_stream_send(st, &d.base) < 0) break;
    }
    return end_push(st);
}

/* The same documents through PushLists, `per` to a message. */
static push_result push_lists(rf_rpc_client *c, const char *run, int from, int to, int per) {
    const char *const md[] = {"refinery-run-id", run, NULL};
    rf_rpc_stream *st;
    rf_rpc_stream_open_md(c, PUSH_LISTS, 20, md, &st);
    Refinery__V1__Document docs[16], *ptrs[16];
    char ids[16][32], texts[16][128];
    assert_true(per <= 16);
    for (int i = from; i < to;) {
        Refinery__V1__DocumentList l = REFINERY__V1__DOCUMENT_LIST__INIT;
        for (; i < to && l.n_docs < (size_t)per; i++, l.n_docs++) {
            Refinery__V1__Document *d = &docs[l.n_docs];
            refinery__v1__document__init(d);
            snprintf(ids[l.n_docs], sizeof ids[l.n_docs], "d%d", i);
            d->id = ids[l.n_docs];
            d->text = (char *)doc_text(i, texts[l.n_docs], sizeof texts[l.n_docs]);
            d->label = i % 2;
            d->line = (uint64_t)i + 1;
            ptrs[l.n_docs] = d;
        }
        l.docs = ptrs;
        if (rf_rpc_stream_send(st, &l.base) < 0) break;
    }
    return end_push(st);
}

/* Reads both topics until `want` documents were seen (or 20 s). seen[i]
 * counts document "d<i>" in docs.clean, rej[reason] in docs.rejected. */
typedef struct tally {
    int *seen;
    int n;
    int empty, invalid_utf8, other_reject;
    int docs, batches;
    char run[64];
} tally;

static void read_topics(fixture *f, tally *t, int want) {
    const char *topics[] = {f->clean, f->rejected};
    rf_kafka_opts ko = {.bootstrap = rf_kafka_mock_bootstrap(f->mock)};
    rf_kafka_consumer *c;
    char group[64];
    snprintf(group, sizeof group, "g%.0f", rf_now() * 1e6);
    assert_int_equal(rf_kafka_consumer_new(&ko, group, topics, 2, &c), 0);
    double end = rf_now() + 20;
    while (t->docs + t->empty + t->invalid_utf8 + t->other_reject < want && rf_now() < end) {
        rf_kafka_batch b;
        assert_int_equal(rf_kafka_poll_batch(c, 100, 0.5, &b), 0);
        for (size_t i = 0; i < b.n; i++) {
            const rf_kafka_msg *m = &b.msgs[i];
            if (!strcmp(m->topic, f->clean)) {
                Refinery__V1__DocumentBatch *db =
                    refinery__v1__document_batch__unpack(NULL, m->len, m->value);
                assert_non_null(db);
                snprintf(t->run, sizeof t->run, "%s", db->run_id);
                assert_memory_equal(m->key, db->run_id, m->key_len);
                for (size_t k = 0; k < db->n_docs; k++) {
                    int x = atoi(db->docs[k]->id + 1);
                    assert_true(x >= 0 && x < t->n);
                    t->seen[x]++;
                    t->docs++;
                }
                t->batches++;
                refinery__v1__document_batch__free_unpacked(db, NULL);
            } else {
                Refinery__V1__Reject *r = refinery__v1__reject__unpack(NULL, m->len, m->value);
                assert_non_null(r);
                if (!strcmp(r->reason, "empty"))
                    t->empty++;
                else if (!strcmp(r->reason, "invalid_utf8"))
                    t->invalid_utf8++;
                else
                    t->other_reject++;
                refinery__v1__reject__free_unpacked(r, NULL);
            }
        }
        rf_kafka_batch_release(&b);
    }
    rf_kafka_consumer_free(c);
}

/* Documents 0..1000 pushed into run: every 5th refused (empty or not
 * UTF-8), the rest in docs.clean exactly once, in batches of 32. */
static void check_accounting(fixture *f, const char *run, push_result r) {
    enum { N = 1000 };
    assert_int_equal(r.code, GRPC_STATUS_OK);
    assert_int_equal(r.received, N);
    assert_int_equal(r.accepted, 800);
    assert_int_equal(r.rejected, 200);

    tally t = {.seen = calloc(N, sizeof(int)), .n = N};
    read_topics(f, &t, N);
    assert_int_equal(t.docs, 800);
    assert_int_equal(t.empty, 100);
    assert_int_equal(t.invalid_utf8, 100);
    assert_int_equal(t.other_reject, 0);
    assert_int_equal(t.batches, 25); /* 800 / 32 */
    assert_string_equal(t.run, run);
    for (int i = 0; i < N; i++)
        assert_int_equal(t.seen[i], i % 5 == 0 ? 0 : 1);
    free(t.seen);
}

static void test_push_accounting(void **state) {
    fixture *f = *state;
    check_accounting(f, "run-a", push_docs(f->client, "run-a", 0, 1000, -1));
    rf_stats *s = rf_ingest_service_stats(f->svc);
    assert_int_equal(rf_stats_get(s, "ingest.received"), 1000);
    assert_int_equal(rf_stats_get(s, "ingest.rejected.invalid_utf8"), 100);
}

/* PushLists: the same documents, cleaning and batches as Push, whatever the
 * list size. */
static void test_push_lists_accounting(void **state) {
    fixture *f = *state;
    check_accounting(f, "run-l", push_lists(f->client, "run-l", 0, 1000, 7));
}

typedef struct pusher {
    rf_rpc_client *client;
    int from, to;
    push_result r;
} pusher;

static void *push_thread(void *arg) {
    pusher *p = arg;
    p->r = push_docs(p->client, "run-b", p->from, p->to, -1);
    return NULL;
}

static void test_concurrent_streams(void **state) {
    fixture *f = *state;
    enum { N = 1200, T = 4 };
    pthread_t th[T];
    pusher p[T];
    for (int i = 0; i < T; i++) {
        p[i] = (pusher){f->client, i * N / T, (i + 1) * N / T, {0}};
        pthread_create(&th[i], NULL, push_thread, &p[i]);
    }
    uint64_t received = 0, accepted = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(p[i].r.code, GRPC_STATUS_OK);
        received += p[i].r.received;
        accepted += p[i].r.accepted;
    }
    assert_int_equal(received, N);
    tally t = {.seen = calloc(N, sizeof(int)), .n = N};
    read_topics(f, &t, N);
    assert_int_equal((uint64_t)t.docs, accepted);
    assert_int_equal(t.docs + t.empty + t.invalid_utf8, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(t.seen[i], i % 5 == 0 ? 0 : 1);
    free(t.seen);
}

static void test_bad_input_keeps_serving(void **state) {
    fixture *f = *state;
    /* Invalid protobuf in the middle of a stream. */
    push_result r = push_docs(f->client, "run-c", 0, 50, 20);
    assert_int_equal(r.code, GRPC_STATUS_INVALID_ARGUMENT);
    /* An oversized document (server limit 64 KiB). */
    rf_rpc_stream *st;
    rf_rpc_stream_open(f->client, PUSH, 10, &st);
    char *big = malloc(100 * 1024 + 1);
    memset(big, 'x', 100 * 1024);
    big[100 * 1024] = 0;
    Refinery__V1__Document d = REFINERY__V1__DOCUMENT__INIT;
    d.text = big;
    rf_rpc_stream_send(st, &d.base);
    rf_rpc_stream_close_send(st);
    rf_rpc_status status;
    rf_rpc_stream_finish(st, &status);
    free(big);
    assert_int_equal(status.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    /* Still serving, and the default run id. */
    r = push_docs(f->client, NULL, 1, 5, -1);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    assert_int_equal(r.received, 4);
    rf_stats *s = rf_rpc_server_stats(f->server);
    assert_int_equal(rf_stats_get(s, "rpc.Ingest.Push.INVALID_ARGUMENT"), 1);
    assert_int_equal(rf_stats_get(s, "rpc.Ingest.Push.RESOURCE_EXHAUSTED"), 1);
}

/* Push decides each document with rf_decide, as the embedded workers do:
 * same kept text, same reject reason (filters included), the excerpt taken
 * from the bytes the reason is about, and the cleaning counters. */
static void test_push_verdicts_are_rf_decide(void **state) {
    fixture *f = *state;
    static const char *const texts[] = {
        "  A fine   kettle,\tboils fast.  ",
        "1  2 3\t4 5 6 7 8 9 10 11 12", /* excerpt: the cleaned text */
        "   ",
        "caf\xe9 is not UTF-8",
        "Controls\x01 and\x02 more\x7f text here",
        "\xef\xac\x81ne ligatures are folded by NFKC",
        "12345 67890 and 424242 999",
    };
    enum { N = sizeof texts / sizeof texts[0] };
    const char *const md[] = {"refinery-run-id", "run-v", NULL};
    rf_rpc_stream *st;
    assert_int_equal(rf_rpc_stream_open_md(f->client, PUSH, 20, md, &st), 0);
    for (int i = 0; i < N; i++) {
        char id[16];
        snprintf(id, sizeof id, "d%d", i);
        Refinery__V1__Document d = REFINERY__V1__DOCUMENT__INIT;
        d.id = id;
        d.text = (char *)texts[i];
        d.line = (uint64_t)i + 1;
        assert_int_equal(rf_rpc_stream_send(st, &d.base), 0);
    }
    push_result r = end_push(st);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    assert_int_equal(r.received, N);

    /* The expected verdicts: the service's default rules. */
    rf_ingest_service_opts so;
    rf_ingest_service_opts_default(&so);
    rf_doc_rules rules = {so.clean, so.quality_enabled, so.quality, so.language};
    rules.clean.utf8 = RF_UTF8_REJECT;
    rf_decider *dc = rf_decider_new(&rules);
    assert_non_null(dc);
    char *want_text[N];
    const char *want_reason[N];
    int kept = 0, filter_rejects = 0;
    int64_t controls = 0;
    for (int i = 0; i < N; i++) {
        rf_verdict v;
        assert_int_equal(rf_decide(dc, texts[i], strlen(texts[i]), &v), 0);
        want_reason[i] = v.reject;
        want_text[i] = strndup(v.text, v.len);
        kept += !v.reject;
        filter_rejects += v.reject && v.text != texts[i];
        controls += (int64_t)v.clean.controls_removed;
    }
    rf_decider_free(dc);
    assert_true(filter_rejects >= 1); /* the filters are exercised, not only cleaning */
    assert_int_equal(r.accepted, kept);
    assert_int_equal(r.rejected, N - kept);

    const char *topics[] = {f->clean, f->rejected};
    rf_kafka_opts ko = {.bootstrap = rf_kafka_mock_bootstrap(f->mock)};
    rf_kafka_consumer *c;
    assert_int_equal(rf_kafka_consumer_new(&ko, "verdicts", topics, 2, &c), 0);
    int seen = 0, got[N] = {0};
    double end = rf_now() + 20;
    while (seen < N && rf_now() < end) {
        rf_kafka_batch b;
        assert_int_equal(rf_kafka_poll_batch(c, 100, 0.5, &b), 0);
        for (size_t i = 0; i < b.n; i++) {
            const rf_kafka_msg *m = &b.msgs[i];
            if (!strcmp(m->topic, f->clean)) {
                Refinery__V1__DocumentBatch *db =
                    refinery__v1__document_batch__unpack(NULL, m->len, m->value);
                assert_non_null(db);
                for (size_t k = 0; k < db->n_docs; k++) {
                    int x = atoi(db->docs[k]->id + 1);
                    assert_true(x >= 0 && x < N);
                    assert_null(want_reason[x]);
                    assert_string_equal(db->docs[k]->text, want_text[x]);
                    got[x]++;
                    seen++;
                }
                refinery__v1__document_batch__free_unpacked(db, NULL);
            } else {
                Refinery__V1__Reject *rj = refinery__v1__reject__unpack(NULL, m->len, m->value);
                assert_non_null(rj);
                int x = atoi(rj->doc_id + 1);
                assert_true(x >= 0 && x < N);
                assert_non_null(want_reason[x]);
                assert_string_equal(rj->reason, want_reason[x]);
                size_t n = strlen(want_text[x]);
                assert_int_equal(rj->excerpt.len, n < 64 ? n : 64);
                assert_memory_equal(rj->excerpt.data, want_text[x], rj->excerpt.len);
                got[x]++;
                seen++;
                refinery__v1__reject__free_unpacked(rj, NULL);
            }
        }
        rf_kafka_batch_release(&b);
    }
    rf_kafka_consumer_free(c);
    for (int i = 0; i < N; i++) {
        assert_int_equal(got[i], 1);
        free(want_text[i]);
    }
    assert_true(controls > 0);
    assert_int_equal(rf_stats_get(rf_ingest_service_stats(f->svc), "ingest.clean.controls_removed"),
                     controls);
}

/* Kafka unreachable: no summary, UNAVAILABLE, so the client pushes again. */
static void test_kafka_outage_fails_stream(void **state) {
    fixture *f = *state;
    for (int b = 1; b <= 3; b++)
        assert_int_equal(rf_kafka_mock_broker_down(f->mock, b), 0);
    push_result r = push_docs(f->client, "run-d", 0, 100, -1);
    assert_int_equal(r.code, GRPC_STATUS_UNAVAILABLE);
    assert_int_equal(r.received, 0); /* no summary was sent */
    assert_int_equal(rf_stats_get(rf_ingest_service_stats(f->svc), "ingest.streams_failed"), 1);
    for (int b = 1; b <= 3; b++)
        assert_int_equal(rf_kafka_mock_broker_up(f->mock, b), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_push_accounting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_push_lists_accounting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_push_verdicts_are_rf_decide, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input_keeps_serving, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kafka_outage_fails_stream, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
