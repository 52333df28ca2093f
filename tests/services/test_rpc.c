/* services/runtime/rpc: an in-process server on a random localhost port, called by the
 * C client: unary, client- and server-streaming calls, health, deadlines,
 * message limits, invalid protobuf, unknown methods, TLS and mutual TLS.
 *
 * `test_rpc --serve PORTFILE` runs the same test server until SIGTERM instead,
 * for the Python client test (tests/services/rpc_python.test.sh). */
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
#include <grpc/support/log.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "health.pb-c.h"
#include "refinery.pb-c.h"
#include "runtime/rpc/client.h"
#include "runtime/rpc/rpc.h"

#define PATH_TOKENIZE "/refinery.v1.Tokenizer/Tokenize"
#define PATH_PUSH     "/refinery.v1.Ingest/Push"
#define PATH_COUNT    "/refinery.v1.Test/Count" /* server streaming, test only */
#define PATH_HEALTH   "/grpc.health.v1.Health/Check"

/* --- the test service --- */

/* Tokenize: one sequence per text, its ids the text's bytes. A text "sleep"
 * makes the handler wait until the client's deadline has ended the call. */
static grpc_status_code tokenize(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    const Refinery__V1__TokenizeRequest *r = (const void *)req;
    for (size_t i = 0; i < r->n_texts; i++)
        if (strcmp(r->texts[i], "sleep") == 0) {
            while (!rf_rpc_call_done(call))
                usleep(10000);
            return rf_rpc_fail(call, GRPC_STATUS_DEADLINE_EXCEEDED, "slept past the deadline");
        }
    /* Sequences carry the "refinery-run-id" metadata as doc_id when given. */
    char run[64];
    const char *run_id = rf_rpc_metadata(call, "refinery-run-id", run, sizeof run);
    Refinery__V1__TokenizeResponse resp = REFINERY__V1__TOKENIZE_RESPONSE__INIT;
    Refinery__V1__TokenSequence *seqs = calloc(r->n_texts, sizeof *seqs);
    Refinery__V1__TokenSequence **ptrs = calloc(r->n_texts, sizeof *ptrs);
    uint32_t **ids = calloc(r->n_texts, sizeof *ids);
    for (size_t i = 0; i < r->n_texts; i++) {
        refinery__v1__token_sequence__init(&seqs[i]);
        if (run_id) seqs[i].doc_id = (char *)run_id;
        size_t n = strlen(r->texts[i]);
        ids[i] = calloc(n + 1, sizeof **ids);
        for (size_t j = 0; j < n; j++)
            ids[i][j] = (unsigned char)r->texts[i][j];
        seqs[i].ids = ids[i];
        seqs[i].n_ids = n;
        ptrs[i] = &seqs[i];
    }
    resp.seqs = ptrs;
    resp.n_seqs = r->n_texts;
    int rc = rf_rpc_send(call, &resp.base);
    for (size_t i = 0; i < r->n_texts; i++)
        free(ids[i]);
    free(ids);
    free(ptrs);
    free(seqs);
    return rc < 0 ? rf_rpc_call_status(call) : GRPC_STATUS_OK;
}

/* Push: counts documents; those with an empty text are rejected. */
static grpc_status_code push(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    Refinery__V1__PushSummary sum = REFINERY__V1__PUSH_SUMMARY__INIT;
    ProtobufCMessage *m;
    int r;
    while ((r = rf_rpc_recv(call, &m)) == 1) {
        const Refinery__V1__Document *d = (const void *)m;
        sum.received++;
        if (d->text[0])
            sum.accepted++;
        else
            sum.rejected++;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    if (r < 0) return rf_rpc_call_status(call);
    return rf_rpc_send(call, &sum.base) < 0 ? rf_rpc_call_status(call) : GRPC_STATUS_OK;
}

/* Count: texts[0] is a number n; sends n responses, the i-th with one text "i". */
static grpc_status_code count(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    const Refinery__V1__TokenizeRequest *r = (const void *)req;
    if (r->n_texts != 1) return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "want one text");
    long n = strtol(r->texts[0], NULL, 10);
    for (long i = 0; i < n; i++) {
        uint32_t id = (uint32_t)i;
        Refinery__V1__TokenSequence seq = REFINERY__V1__TOKEN_SEQUENCE__INIT;
        Refinery__V1__TokenSequence *ps = &seq;
        seq.ids = &id;
        seq.n_ids = 1;
        Refinery__V1__TokenizeResponse resp = REFINERY__V1__TOKENIZE_RESPONSE__INIT;
        resp.seqs = &ps;
        resp.n_seqs = 1;
        if (rf_rpc_send(call, &resp.base) < 0) return rf_rpc_call_status(call);
    }
    return GRPC_STATUS_OK;
}

static rf_rpc_server *start_server(const rf_rpc_tls *tls, size_t max_message) {
    rf_rpc_server_opts o = {.listen = "127.0.0.1:0", .workers = 3, .max_message = max_message};
    if (tls) o.tls = *tls;
    rf_rpc_server *s;
    if (rf_rpc_server_new(&o, &s) < 0) return NULL;
    const rf_rpc_method ms[] = {
        {PATH_TOKENIZE, RF_RPC_UNARY, &refinery__v1__tokenize_request__descriptor, tokenize, NULL},
        {PATH_PUSH, RF_RPC_CLIENT_STREAM, &refinery__v1__document__descriptor, push, NULL},
        {PATH_COUNT, RF_RPC_SERVER_STREAM, &refinery__v1__tokenize_request__descriptor, count,
         NULL},
    };
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        if (rf_rpc_server_add(s, &ms[i]) < 0) goto fail;
    if (rf_rpc_server_start(s) < 0) goto fail;
    return s;
fail:
    fprintf(stderr, "server: %s\n", rf_errmsg());
    rf_rpc_server_free(s);
    return NULL;
}

static rf_rpc_client *connect_to(const rf_rpc_server *s, const rf_rpc_tls *tls) {
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", rf_rpc_server_port(s));
    rf_rpc_client *c;
    if (rf_rpc_client_new(target, tls, 1u << 20, &c) < 0) return NULL;
    return c;
}

typedef struct fixture {
    rf_rpc_server *server;
    rf_rpc_client *client;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->server = start_server(NULL, 64 * 1024);
    if (!f->server) return -1;
    f->client = connect_to(f->server, NULL);
    *state = f;
    return f->client ? 0 : -1;
}

static int teardown(void **state) {
    fixture *f = *state;
    rf_rpc_client_free(f->client);
    rf_rpc_server_free(f->server);
    free(f);
    return 0;
}

/* Tokenize with the given texts; returns the status code (response in *out). */
static grpc_status_code call_tokenize(rf_rpc_client *c, char **texts, size_t n, double timeout,
                                      Refinery__V1__TokenizeResponse **out) {
    Refinery__V1__TokenizeRequest req = REFINERY__V1__TOKENIZE_REQUEST__INIT;
    req.texts = texts;
    req.n_texts = n;
    rf_rpc_status st;
    ProtobufCMessage *resp = NULL;
    rf_rpc_unary(c, PATH_TOKENIZE, &req.base, &refinery__v1__tokenize_response__descriptor, &resp,
                 timeout, &st);
    if (out)
        *out = (void *)resp;
    else if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    return st.code;
}

/* The server counts a call once it has fully ended on its side, which may be
 * just after the client saw the status: wait up to 2 s for the count. */
static int64_t counter(rf_rpc_server *s, const char *method, const char *status, int64_t want) {
    char name[256];
    snprintf(name, sizeof name, "rpc.%s.%s", method, status);
    int64_t got = 0;
    for (int i = 0; i < 200 && (got = rf_stats_get(rf_rpc_server_stats(s), name)) != want; i++)
        usleep(10000);
    return got;
}

static void test_unary(void **state) {
    fixture *f = *state;
    char *texts[] = {"ab", "", "xyz"};
    Refinery__V1__TokenizeResponse *r;
    assert_int_equal(call_tokenize(f->client, texts, 3, 5, &r), GRPC_STATUS_OK);
    assert_non_null(r);
    assert_int_equal(r->n_seqs, 3);
    assert_int_equal(r->seqs[0]->n_ids, 2);
    assert_int_equal(r->seqs[0]->ids[1], 'b');
    assert_int_equal(r->seqs[1]->n_ids, 0);
    assert_int_equal(r->seqs[2]->ids[2], 'z');
    protobuf_c_message_free_unpacked(&r->base, NULL);
    assert_int_equal(counter(f->server, "Tokenizer.Tokenize", "OK", 1), 1);
}

static void test_metadata(void **state) {
    fixture *f = *state;
    const char *const md[] = {"refinery-run-id", "run-42", NULL};
    char *texts[] = {"a"};
    Refinery__V1__TokenizeRequest req = REFINERY__V1__TOKENIZE_REQUEST__INIT;
    req.texts = texts;
    req.n_texts = 1;
    rf_rpc_stream *st;
    assert_int_equal(rf_rpc_stream_open_md(f->client, PATH_TOKENIZE, 5, md, &st), 0);
    assert_int_equal(rf_rpc_stream_send(st, &req.base), 0);
    assert_int_equal(rf_rpc_stream_close_send(st), 0);
    ProtobufCMessage *m;
    assert_int_equal(rf_rpc_stream_recv(st, &refinery__v1__tokenize_response__descriptor, &m), 1);
    assert_string_equal(((Refinery__V1__TokenizeResponse *)m)->seqs[0]->doc_id, "run-42");
    protobuf_c_message_free_unpacked(m, NULL);
    assert_int_equal(rf_rpc_stream_finish(st, NULL), 0);
    /* Without it, the field stays empty. */
    Refinery__V1__TokenizeResponse *r;
    assert_int_equal(call_tokenize(f->client, texts, 1, 5, &r), GRPC_STATUS_OK);
    assert_string_equal(r->seqs[0]->doc_id, "");
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void test_client_stream(void **state) {
    fixture *f = *state;
    rf_rpc_stream *st;
    assert_int_equal(rf_rpc_stream_open(f->client, PATH_PUSH, 10, &st), 0);
    for (int i = 0; i < 500; i++) {
        Refinery__V1__Document d = REFINERY__V1__DOCUMENT__INIT;
        d.text = i % 10 == 0 ? "" : "some text";
        assert_int_equal(rf_rpc_stream_send(st, &d.base), 0);
    }
    assert_int_equal(rf_rpc_stream_close_send(st), 0);
    ProtobufCMessage *m;
    assert_int_equal(rf_rpc_stream_recv(st, &refinery__v1__push_summary__descriptor, &m), 1);
    const Refinery__V1__PushSummary *sum = (const void *)m;
    assert_int_equal(sum->received, 500);
    assert_int_equal(sum->accepted, 450);
    assert_int_equal(sum->rejected, 50);
    protobuf_c_message_free_unpacked(m, NULL);
    rf_rpc_status status;
    assert_int_equal(rf_rpc_stream_finish(st, &status), 0);
    assert_int_equal(status.code, GRPC_STATUS_OK);
}

static void test_server_stream(void **state) {
    fixture *f = *state;
    rf_rpc_stream *st;
    char *texts[] = {"1000"};
    Refinery__V1__TokenizeRequest req = REFINERY__V1__TOKENIZE_REQUEST__INIT;
    req.texts = texts;
    req.n_texts = 1;
    assert_int_equal(rf_rpc_stream_open(f->client, PATH_COUNT, 10, &st), 0);
    assert_int_equal(rf_rpc_stream_send(st, &req.base), 0);
    assert_int_equal(rf_rpc_stream_close_send(st), 0);
    ProtobufCMessage *m;
    uint32_t n = 0;
    int r;
    while ((r = rf_rpc_stream_recv(st, &refinery__v1__tokenize_response__descriptor, &m)) == 1) {
        const Refinery__V1__TokenizeResponse *resp = (const void *)m;
        assert_int_equal(resp->n_seqs, 1);
        assert_int_equal(resp->seqs[0]->ids[0], n);
        n++;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    assert_int_equal(r, 0);
    assert_int_equal(n, 1000);
    assert_int_equal(rf_rpc_stream_finish(st, NULL), 0);
}

static int health(rf_rpc_client *c, const char *service, grpc_status_code *code) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    ProtobufCMessage *m = NULL;
    rf_rpc_status st;
    rf_rpc_unary(c, PATH_HEALTH, &req.base, &grpc__health__v1__health_check_response__descriptor,
                 &m, 5, &st);
    *code = st.code;
    if (!m) return -1;
    int status = ((Grpc__Health__V1__HealthCheckResponse *)m)->status;
    protobuf_c_message_free_unpacked(m, NULL);
    return status;
}

static void test_health(void **state) {
    fixture *f = *state;
    grpc_status_code code;
    assert_int_equal(health(f->client, "", &code),
                     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    assert_int_equal(code, GRPC_STATUS_OK);
    assert_int_equal(health(f->client, "refinery.v1.Ingest", &code), -1);
    assert_int_equal(code, GRPC_STATUS_NOT_FOUND);
    rf_rpc_server_set_health(f->server, "refinery.v1.Ingest", 0);
    assert_int_equal(health(f->client, "refinery.v1.Ingest", &code),
                     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
    rf_rpc_server_set_health(f->server, "refinery.v1.Ingest", 1);
    assert_int_equal(health(f->client, "refinery.v1.Ingest", &code),
                     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
}

#define PATH_WATCH "/grpc.health.v1.Health/Watch"
#define H_SERVING  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define H_NOT      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
#define H_UNKNOWN  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN

static rf_rpc_stream *watch(rf_rpc_client *c, const char *service, double timeout) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    rf_rpc_stream *st;
    if (rf_rpc_stream_open(c, PATH_WATCH, timeout, &st) < 0) return NULL;
    if (rf_rpc_stream_send(st, &req.base) < 0 || rf_rpc_stream_close_send(st) < 0) {
        rf_rpc_stream_finish(st, NULL);
        return NULL;
    }
    return st;
}

/* The next status a Watch sends; -1 at its end (or a broken call). */
static int watch_next(rf_rpc_stream *st) {
    ProtobufCMessage *m;
    if (rf_rpc_stream_recv(st, &grpc__health__v1__health_check_response__descriptor, &m) != 1)
        return -1;
    int status = ((Grpc__Health__V1__HealthCheckResponse *)m)->status;
    protobuf_c_message_free_unpacked(m, NULL);
    return status;
}

/* Watch: the current status at once, then each change; an unknown name is
 * SERVICE_UNKNOWN until it is set; at most workers - 1 (here 2) at once;
 * a Watch past its deadline frees its slot; stopping the server sends the
 * last status and ends every Watch OK, without waiting for the grace. */
static void test_health_watch(void **state) {
    fixture *f = *state;
    rf_rpc_stream *all = watch(f->client, "", 30);
    assert_non_null(all);
    assert_int_equal(watch_next(all), H_SERVING);
    rf_rpc_stream *svc = watch(f->client, "refinery.v1.Ingest", 1.5);
    assert_non_null(svc);
    assert_int_equal(watch_next(svc), H_UNKNOWN);
    rf_rpc_server_set_health(f->server, "refinery.v1.Ingest", 0);
    assert_int_equal(watch_next(svc), H_NOT);
    rf_rpc_server_set_health(f->server, "refinery.v1.Ingest", 0); /* no change: nothing sent */
    rf_rpc_server_set_health(f->server, "refinery.v1.Ingest", 1);
    assert_int_equal(watch_next(svc), H_SERVING);

    /* A third Watch would take the last worker. */
    rf_rpc_stream *third = watch(f->client, "", 30);
    assert_non_null(third);
    assert_int_equal(watch_next(third), -1);
    rf_rpc_status st;
    assert_int_equal(rf_rpc_stream_finish(third, &st), RF_ERR_IO);
    assert_int_equal(st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    /* Check still has a worker. */
    grpc_status_code code;
    assert_int_equal(health(f->client, "", &code), H_SERVING);

    /* A Watch that ends (its deadline) frees its slot. */
    assert_int_equal(watch_next(svc), -1);
    assert_int_equal(rf_rpc_stream_finish(svc, &st), RF_ERR_IO);
    assert_int_equal(st.code, GRPC_STATUS_DEADLINE_EXCEEDED);
    rf_rpc_stream *again = NULL;
    for (int i = 0; i < 100 && !again; i++) {
        rf_rpc_stream *w = watch(f->client, "refinery.v1.Ingest", 30);
        if (w && watch_next(w) == H_SERVING) {
            again = w;
        } else {
            if (w) rf_rpc_stream_finish(w, NULL);
            usleep(20000);
        }
    }
    assert_non_null(again);

    double t0 = rf_now();
    rf_rpc_server_stop(f->server, 10);
    assert_true(rf_now() - t0 < 2);
    assert_int_equal(watch_next(all), H_NOT);
    assert_int_equal(watch_next(all), -1);
    assert_int_equal(rf_rpc_stream_finish(all, &st), 0);
    assert_int_equal(watch_next(again), -1); /* Ingest stayed SERVING: no new status */
    assert_int_equal(rf_rpc_stream_finish(again, &st), 0);
}

static void test_deadline(void **state) {
    fixture *f = *state;
    char *texts[] = {"sleep"};
    double t0 = rf_now();
    assert_int_equal(call_tokenize(f->client, texts, 1, 0.3, NULL), GRPC_STATUS_DEADLINE_EXCEEDED);
    double took = rf_now() - t0;
    assert_true(took >= 0.25 && took < 3.0);
    /* The server keeps serving afterwards. */
    char *ok[] = {"a"};
    assert_int_equal(call_tokenize(f->client, ok, 1, 5, NULL), GRPC_STATUS_OK);
    assert_int_equal(counter(f->server, "Tokenizer.Tokenize", "DEADLINE_EXCEEDED", 1), 1);
}

static void test_oversized(void **state) {
    fixture *f = *state;
    size_t n = 100 * 1024; /* the server takes at most 64 KiB */
    char *big = malloc(n + 1);
    memset(big, 'a', n);
    big[n] = 0;
    char *texts[] = {big};
    assert_int_equal(call_tokenize(f->client, texts, 1, 5, NULL), GRPC_STATUS_RESOURCE_EXHAUSTED);
    free(big);
    char *ok[] = {"a"};
    assert_int_equal(call_tokenize(f->client, ok, 1, 5, NULL), GRPC_STATUS_OK);
}

static grpc_status_code send_raw(rf_rpc_client *c, const char *path, const void *data, size_t len,
                                 int then_valid) {
    rf_rpc_stream *st;
    rf_rpc_stream_open(c, path, 5, &st);
    if (then_valid) {
        Refinery__V1__Document d = REFINERY__V1__DOCUMENT__INIT;
        d.text = "fine";
        rf_rpc_stream_send(st, &d.base);
    }
    rf_rpc_stream_send_raw(st, data, len);
    rf_rpc_stream_close_send(st);
    rf_rpc_status status;
    rf_rpc_stream_finish(st, &status);
    return status.code;
}

static void test_invalid_protobuf(void **state) {
    fixture *f = *state;
    /* Field 1 as a length-delimited string claiming 100 bytes, with 2 present. */
    const unsigned char bad[] = {0x0a, 0x64, 'h', 'i'};
    assert_int_equal(send_raw(f->client, PATH_TOKENIZE, bad, sizeof bad, 0),
                     GRPC_STATUS_INVALID_ARGUMENT);
    /* A valid document, then garbage, in a client stream. */
    const unsigned char junk[] = {0xff, 0xff, 0xff, 0xff};
    assert_int_equal(send_raw(f->client, PATH_PUSH, junk, sizeof junk, 1),
                     GRPC_STATUS_INVALID_ARGUMENT);
    assert_int_equal(counter(f->server, "Tokenizer.Tokenize", "INVALID_ARGUMENT", 1), 1);
    assert_int_equal(counter(f->server, "Ingest.Push", "INVALID_ARGUMENT", 1), 1);
}

static void test_unknown_method(void **state) {
    fixture *f = *state;
    assert_int_equal(send_raw(f->client, "/refinery.v1.Nope/Nothing", "", 0, 0),
                     GRPC_STATUS_UNIMPLEMENTED);
}

/* --- TLS: certificates made by the openssl command in a temporary directory --- */

static char tls_dir[] = "/tmp/rf-rpc-tls-XXXXXX";

static int make_certs(void) {
    if (!mkdtemp(tls_dir)) return -1;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "set -e; cd %s;"
             "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca"
             " -keyout ca.key -out ca.pem;"
             "for who in server client; do"
             " openssl req -newkey rsa:2048 -nodes -subj /CN=$who -keyout $who.key -out $who.csr;"
             " printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > $who.ext;"
             " openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2"
             " -extfile $who.ext -out $who.pem;"
             "done",
             tls_dir);
    char full[2200];
    snprintf(full, sizeof full, "(%s) >/dev/null 2>&1", cmd);
    return system(full) == 0 ? 0 : -1;
}

static void remove_certs(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tls_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tls_dir);
}

static char *tls_path(const char *name) {
    static char paths[8][300];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 300, "%s/%s", tls_dir, name);
    return p;
}

static grpc_status_code tls_call(const rf_rpc_server *s, const rf_rpc_tls *tls) {
    rf_rpc_client *c = connect_to(s, tls);
    char *texts[] = {"x"};
    grpc_status_code code = call_tokenize(c, texts, 1, 5, NULL);
    rf_rpc_client_free(c);
    return code;
}

static void test_tls(void **state) {
    if (make_certs() < 0) {
        remove_certs();
        fail_msg("could not make test certificates with openssl");
    }
    rf_rpc_tls server = {tls_path("server.pem"), tls_path("server.key"), NULL, NULL};
    rf_rpc_server *s = start_server(&server, 0);
    assert_non_null(s);
    rf_rpc_tls verify = {NULL, NULL, tls_path("ca.pem"), NULL};
    assert_int_equal(tls_call(s, &verify), GRPC_STATUS_OK);
    assert_int_equal(tls_call(s, NULL), GRPC_STATUS_UNAVAILABLE); /* plaintext client */
    rf_rpc_server_free(s);

    /* Mutual TLS: the server wants a client certificate signed by the CA. */
    rf_rpc_tls mutual = {tls_path("server.pem"), tls_path("server.key"), tls_path("ca.pem"), NULL};
    s = start_server(&mutual, 0);
    assert_non_null(s);
    assert_int_equal(tls_call(s, &verify), GRPC_STATUS_UNAVAILABLE); /* no client certificate */
    rf_rpc_tls client = {tls_path("client.pem"), tls_path("client.key"), tls_path("ca.pem"), NULL};
    assert_int_equal(tls_call(s, &client), GRPC_STATUS_OK);
    rf_rpc_server_free(s);
    remove_certs();
}

static void test_bad_tls_config(void **state) {
    rf_rpc_tls missing = {"/nonexistent/server.pem", "/nonexistent/server.key", NULL, NULL};
    rf_rpc_server_opts o = {.listen = "127.0.0.1:0", .tls = missing};
    rf_rpc_server *s;
    assert_int_equal(rf_rpc_server_new(&o, &s), 0);
    assert_true(rf_rpc_server_start(s) < 0);
    assert_non_null(strstr(rf_errmsg(), "/nonexistent/server.pem"));
    rf_rpc_server_free(s);
}

/* A second server on a port already in use fails to start (no SO_REUSEPORT
 * sharing) and names the address; the first keeps serving. */
static void test_busy_port(void **state) {
    fixture *f = *state;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", rf_rpc_server_port(f->server));
    rf_rpc_server_opts o = {.listen = addr, .workers = 1};
    rf_rpc_server *s;
    /* gRPC core's own error about the bind comes out as a JSON log line. */
    FILE *log = tmpfile();
    assert_non_null(log);
    rf_log_set_output(log);
    assert_int_equal(rf_rpc_server_new(&o, &s), 0);
    assert_true(rf_rpc_server_start(s) < 0);
    rf_log_set_output(NULL);
    assert_non_null(strstr(rf_errmsg(), addr));
    rf_rpc_server_free(s);
    rewind(log);
    char line[4096];
    int seen = 0;
    while (fgets(line, sizeof line, log))
        if (strncmp(line, "{\"ts\":", 6) == 0 && strstr(line, "\"level\":\"error\"") &&
            strstr(line, "\"comp\":\"grpc\"") && strstr(line, "Address already in use"))
            seen = 1;
    fclose(log);
    assert_true(seen);
    char *texts[] = {"ab"};
    assert_int_equal(call_tokenize(f->client, texts, 1, 5, NULL), GRPC_STATUS_OK);
}

/* The hook maps each gRPC severity to the JSON logger's level, debug
 * included when enabled. */
static void test_grpc_log_hook(void **state) {
    FILE *log = tmpfile();
    assert_non_null(log);
    rf_log_set_output(log);
    rf_log_set_level(RF_LOG_DEBUG);
    gpr_log_func_args a = {"src/core/x/y.cc", 12, GPR_LOG_SEVERITY_DEBUG, "d \"quoted\""};
    rf_rpc_log_hook(&a);
    a.severity = GPR_LOG_SEVERITY_INFO;
    a.message = "i";
    rf_rpc_log_hook(&a);
    rf_log_set_level(RF_LOG_INFO);
    a.severity = GPR_LOG_SEVERITY_DEBUG;
    a.message = "dropped";
    rf_rpc_log_hook(&a);
    /* Through gRPC itself (gpr_log -> the installed function). */
    rf_rpc_log_install();
    gpr_log(GPR_ERROR, "from core %d", 7);
    rf_log_set_output(NULL);
    rewind(log);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, log);
    buf[n] = 0;
    fclose(log);
    assert_non_null(strstr(
        buf, "\"level\":\"debug\",\"comp\":\"grpc\",\"msg\":\"d \\\"quoted\\\" (y.cc:12)\""));
    assert_non_null(strstr(buf, "\"level\":\"info\",\"comp\":\"grpc\",\"msg\":\"i (y.cc:12)\""));
    assert_null(strstr(buf, "dropped"));
    assert_non_null(
        strstr(buf, "\"level\":\"error\",\"comp\":\"grpc\",\"msg\":\"from core 7 (test_rpc.c:"));
}

/* --- serve mode for external clients --- */

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) {
    stop_requested = 1;
}

static int serve(const char *port_file) {
    rf_rpc_server *s = start_server(NULL, 64 * 1024);
    if (!s) return 1;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    FILE *fp = fopen(port_file, "w");
    if (!fp) return 1;
    fprintf(fp, "%d\n", rf_rpc_server_port(s));
    fclose(fp);
    while (!stop_requested)
        usleep(50000);
    rf_rpc_server_stop(s, 5);
    rf_buf b = RF_BUF_INIT;
    rf_stats_to_json(rf_rpc_server_stats(s), &b);
    printf("%s\n", b.data ? b.data : "{}");
    rf_buf_free(&b);
    rf_rpc_server_free(s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--serve") == 0) return serve(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metadata, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_health, setup, teardown),
        cmocka_unit_test_setup_teardown(test_health_watch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oversized, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_protobuf, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_method, setup, teardown),
        cmocka_unit_test(test_tls),
        cmocka_unit_test(test_bad_tls_config),
        cmocka_unit_test_setup_teardown(test_busy_port, setup, teardown),
        cmocka_unit_test(test_grpc_log_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
