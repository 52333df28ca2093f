/* refinery-push: streams the records of a JSON Lines file (plain, gzip or
 * zstd) to refinery.v1.Ingest/Push, one Document per line, and prints the
 * PushSummary as one JSON line. With --streams N the lines are spread over N
 * concurrent Push calls (line k goes to stream k mod N), each in its own
 * thread: the ingest service cleans and filters a stream on one worker, so N
 * streams use up to N of its workers.
 *
 * A line that is not a JSON object with a string text field is not sent; it
 * is counted as "skipped" (the service never sees it). The document id is the
 * id field when it is a string, else "<file name>:<line>"; the label is the
 * label field when it is an integer, else -1.
 *
 * Exit status: 0 when every stream got its summary, 1 otherwise (the failed
 * streams' statuses are on stderr), 2 for bad usage. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/json.h"
#include "common/log.h"
#include "common/reader.h"
#include "common/sys.h"
#include "refinery.pb-c.h"
#include "rpc/client.h"
#include "rpc/rpc.h"
#include "svc/svc.h"

#define PUSH_METHOD "/refinery.v1.Ingest/Push"

typedef struct config {
    const char *target, *run_id, *input, *text_field, *id_field, *label_field;
    int64_t streams;
    double timeout_s;
} config;

/* One Push call and its share of the lines. */
typedef struct pusher {
    const config *c;
    rf_rpc_client *client;
    const char *source; /* file name for ids and Document.source */
    int64_t index;
    uint64_t sent, skipped;
    Refinery__V1__PushSummary sum;
    rf_rpc_status status; /* of the call, once it ended */
    bool called;
    int rc;
} pusher;

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Sends line l as a Document; 0 when sent, 1 when skipped, < 0 when the call broke. */
static int send_line(pusher *p, rf_rpc_stream *st, rf_json_doc *doc, const rf_line *l) {
    const config *c = p->c;
    const rf_json *root, *text, *id, *label;
    if (l->too_long || rf_json_parse(doc, l->data, l->len, &root) < 0) return 1;
    text = rf_json_get(root, c->text_field);
    if (!text || !rf_json_is_str(text)) return 1;
    char gen[64];
    Refinery__V1__Document d = REFINERY__V1__DOCUMENT__INIT;
    id = rf_json_get(root, c->id_field);
    if (id && rf_json_is_str(id)) {
        d.id = (char *)id->u.str;
    } else {
        snprintf(gen, sizeof gen, "%.40s:%" PRIu64, p->source, l->lineno);
        d.id = gen;
    }
    d.text = (char *)text->u.str;
    int64_t lab;
    label = rf_json_get(root, c->label_field);
    d.label = label && rf_json_int64(label, &lab) == RF_OK && lab >= INT32_MIN && lab <= INT32_MAX
                  ? (int32_t)lab
                  : -1;
    d.source = (char *)p->source;
    d.line = l->lineno;
    d.offset = l->offset;
    return rf_rpc_stream_send(st, &d.base);
}

static void *push_thread(void *arg) {
    pusher *p = arg;
    const config *c = p->c;
    const char *const md[] = {"refinery-run-id", c->run_id, NULL};
    rf_reader *r = NULL;
    rf_json_doc *doc = rf_json_doc_new();
    rf_rpc_stream *st = NULL;
    refinery__v1__push_summary__init(&p->sum);
    p->rc = doc ? rf_reader_open(c->input, 64u << 20, &r) : RF_ERR_NOMEM;
    if (p->rc == RF_OK)
        p->rc = rf_rpc_stream_open_md(p->client, PUSH_METHOD, c->timeout_s, md, &st);
    rf_line l;
    int got;
    uint64_t k = 0;
    while (p->rc == RF_OK && (got = rf_reader_next(r, &l)) != 0) {
        if (got < 0) {
            p->rc = got;
            break;
        }
        if (k++ % (uint64_t)c->streams != (uint64_t)p->index) continue;
        int sent = send_line(p, st, doc, &l);
        if (sent < 0) break; /* the server ended the call: finish says why */
        if (sent == 1)
            p->skipped++;
        else
            p->sent++;
    }
    if (st) {
        ProtobufCMessage *m = NULL;
        if (rf_rpc_stream_close_send(st) == RF_OK &&
            rf_rpc_stream_recv(st, &refinery__v1__push_summary__descriptor, &m) == 1) {
            const Refinery__V1__PushSummary *s = (const void *)m;
            p->sum.received = s->received;
            p->sum.accepted = s->accepted;
            p->sum.rejected = s->rejected;
            protobuf_c_message_free_unpacked(m, NULL);
        }
        int done = rf_rpc_stream_finish(st, &p->status);
        p->called = true;
        if (p->rc == RF_OK) p->rc = done;
    }
    if (p->rc < 0 && (!p->called || p->status.code == GRPC_STATUS_OK))
        snprintf(p->status.message, sizeof p->status.message, "%s", rf_errmsg());
    rf_reader_close(r);
    rf_json_doc_free(doc);
    return NULL;
}

static int push_all(const config *c) {
    rf_rpc_client *client;
    int rc = rf_rpc_client_new(c->target, NULL, 0, &client);
    if (rc < 0) return rc;
    size_t n = (size_t)c->streams;
    pusher *p = calloc(n, sizeof *p);
    pthread_t *th = calloc(n, sizeof *th);
    if (!p || !th) {
        free(p);
        free(th);
        rf_rpc_client_free(client);
        return RF_ERR_NOMEM;
    }
    double t0 = rf_now();
    size_t started = 0;
    for (size_t i = 0; i < n; i++) {
        p[i] =
            (pusher){.c = c, .client = client, .source = base_name(c->input), .index = (int64_t)i};
        if (pthread_create(&th[i], NULL, push_thread, &p[i]) != 0) {
            rc = rf_fail(RF_ERR_IO, "cannot start push thread %zu", i);
            break;
        }
        started++;
    }
    uint64_t sent = 0, skipped = 0, received = 0, accepted = 0, rejected = 0, failed = 0;
    for (size_t i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        sent += p[i].sent;
        skipped += p[i].skipped;
        received += p[i].sum.received;
        accepted += p[i].sum.accepted;
        rejected += p[i].sum.rejected;
        if (p[i].rc < 0) {
            failed++;
            if (p[i].called && p[i].status.code != GRPC_STATUS_OK)
                fprintf(stderr, "refinery-push: stream %zu: status %d (%s): %s\n", i,
                        (int)p[i].status.code, rf_rpc_status_name(p[i].status.code),
                        p[i].status.message);
            else
                fprintf(stderr, "refinery-push: stream %zu: %s\n", i, p[i].status.message);
        }
    }
    double secs = rf_now() - t0;
    printf("{\"pushed\":%" PRIu64 ",\"skipped\":%" PRIu64 ",\"received\":%" PRIu64
           ",\"accepted\":%" PRIu64 ",\"rejected\":%" PRIu64 ",\"streams\":%zu"
           ",\"failed_streams\":%" PRIu64 ",\"seconds\":%.3f}\n",
           sent, skipped, received, accepted, rejected, n, failed, secs);
    if (rc == RF_OK && (failed || started < n))
        rc = rf_fail(RF_ERR_IO, "%" PRIu64 " push streams failed", failed);
    free(p);
    free(th);
    rf_rpc_client_free(client);
    return rc;
}

int main(int argc, char **argv) {
    rf_log_init_from_env();
    config c;
    const rf_opt opts[] = {
        {"target", "REFINERY_INGEST", RF_OPT_STR, &c.target, "127.0.0.1:7101",
         "ingest service host:port"},
        {"run", "REFINERY_RUN_ID", RF_OPT_STR, &c.run_id, "adhoc",
         "run id (refinery-run-id metadata)"},
        {"input", NULL, RF_OPT_STR, &c.input, NULL,
         "JSON Lines file (plain, .gz, .zst) (required)"},
        {"text-field", NULL, RF_OPT_STR, &c.text_field, "text", "JSON key of the text"},
        {"id-field", NULL, RF_OPT_STR, &c.id_field, "id", "JSON key of the document id"},
        {"label-field", NULL, RF_OPT_STR, &c.label_field, "label", "JSON key of the integer label"},
        {"streams", NULL, RF_OPT_INT, &c.streams, "1", "concurrent Push calls"},
        {"timeout", NULL, RF_OPT_REAL, &c.timeout_s, "600", "deadline of each Push call, seconds"},
    };
    int rc = rf_svc_parse(
        "refinery-push", "Pushes a JSON Lines file to refinery.v1.Ingest/Push; prints the summary.",
        opts, sizeof opts / sizeof opts[0], argc, argv);
    if (rc == 1) return 0;
    if (rc == RF_OK && !c.input) rc = rf_fail(RF_ERR_INVALID, "--input is required");
    if (rc == RF_OK && (c.streams < 1 || c.streams > 256 || c.timeout_s <= 0))
        rc = rf_fail(RF_ERR_INVALID, "a numeric option is out of range (see --help)");
    if (rc < 0) {
        fprintf(stderr, "refinery-push: %s\n", rf_errmsg());
        return 2;
    }
    rc = push_all(&c);
    if (rc < 0) fprintf(stderr, "refinery-push: %s\n", rf_errmsg());
    return rc == RF_OK ? 0 : 1;
}
