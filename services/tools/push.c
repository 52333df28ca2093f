/* refinery-push: streams the records of a JSON Lines file (plain, gzip or
 * zstd) to refinery.v1.Ingest/PushLists, --batch Documents per message (or
 * with --batch 1 to Ingest/Push, one per message), and prints the
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
#include "runtime/rpc/client.h"
#include "runtime/rpc/rpc.h"
#include "runtime/svc.h"

#define PUSH_METHOD       "/refinery.v1.Ingest/Push"
#define PUSH_LISTS_METHOD "/refinery.v1.Ingest/PushLists"
#define LIST_MAX_BYTES    (1u << 20) /* a list is sent before it grows past this */

typedef struct config {
    const char *target, *run_id, *input, *text_field, *id_field, *label_field;
    int64_t streams, batch;
    double timeout_s;
} config;

/* Documents waiting to go as one DocumentList; each owns its id and text. */
typedef struct doc_list {
    Refinery__V1__Document *docs;
    Refinery__V1__Document **ptrs;
    size_t n, bytes;
} doc_list;

/* One Push call and its share of the lines. */
typedef struct pusher {
    const config *c;
    rf_rpc_client *client;
    const char *source; /* file name for ids and Document.source */
    int64_t index;
    uint64_t sent, skipped;
    doc_list list; /* --batch > 1 */
    Refinery__V1__PushSummary sum;
    rf_rpc_status status; /* of the call, once it ended */
    bool called;
    int rc;
} pusher;

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Sends the list as one message and empties it; < 0 when the call broke. */
static int flush_list(pusher *p, rf_rpc_stream *st) {
    doc_list *l = &p->list;
    if (l->n == 0) return RF_OK;
    for (size_t i = 0; i < l->n; i++)
        l->ptrs[i] = &l->docs[i];
    Refinery__V1__DocumentList m = REFINERY__V1__DOCUMENT_LIST__INIT;
    m.docs = l->ptrs;
    m.n_docs = l->n;
    int rc = rf_rpc_stream_send(st, &m.base);
    if (rc == RF_OK) p->sent += l->n;
    for (size_t i = 0; i < l->n; i++) {
        free(l->docs[i].id);
        free(l->docs[i].text);
    }
    l->n = l->bytes = 0;
    return rc;
}

/* Adds a copy of d to the list, sending the list when it is full. */
static int add_to_list(pusher *p, rf_rpc_stream *st, const Refinery__V1__Document *d) {
    doc_list *l = &p->list;
    size_t len = strlen(d->text) + strlen(d->id);
    if (l->n && l->bytes + len > LIST_MAX_BYTES) {
        int rc = flush_list(p, st);
        if (rc < 0) return rc;
    }
    Refinery__V1__Document *k = &l->docs[l->n];
    *k = *d;
    k->id = strdup(d->id);
    k->text = strdup(d->text);
    if (!k->id || !k->text) {
        free(k->id);
        free(k->text);
        return RF_ERR_NOMEM;
    }
    l->n++;
    l->bytes += len;
    return l->n == (size_t)p->c->batch ? flush_list(p, st) : RF_OK;
}

/* Sends line l as a Document (alone or in a list); 0 when sent or queued, 1
 * when skipped, < 0 when the call broke. */
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
    if (p->c->batch > 1) return add_to_list(p, st, &d);
    int rc = rf_rpc_stream_send(st, &d.base);
    if (rc == RF_OK) p->sent++;
    return rc;
}

static void *push_thread(void *arg) {
    pusher *p = arg;
    const config *c = p->c;
    const char *const md[] = {"refinery-run-id", c->run_id, NULL};
    rf_reader *r = NULL;
    rf_json_doc *doc = rf_json_doc_new();
    rf_rpc_stream *st = NULL;
    refinery__v1__push_summary__init(&p->sum);
    size_t cap = c->batch > 1 ? (size_t)c->batch : 0;
    p->list.docs = cap ? calloc(cap, sizeof *p->list.docs) : NULL;
    p->list.ptrs = cap ? calloc(cap, sizeof *p->list.ptrs) : NULL;
    p->rc = doc && (!cap || (p->list.docs && p->list.ptrs))
                ? rf_reader_open(c->input, 64u << 20, &r)
                : RF_ERR_NOMEM;
    if (p->rc == RF_OK)
        p->rc = rf_rpc_stream_open_md(p->client, cap ? PUSH_LISTS_METHOD : PUSH_METHOD,
                                      c->timeout_s, md, &st);
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
        if (sent == 1) p->skipped++;
    }
    if (st && p->rc == RF_OK) flush_list(p, st); /* if the call broke, finish says why */
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
    for (size_t i = 0; i < p->list.n; i++) { /* not sent: the call broke */
        free(p->list.docs[i].id);
        free(p->list.docs[i].text);
    }
    free(p->list.docs);
    free(p->list.ptrs);
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
        {"batch", NULL, RF_OPT_INT, &c.batch, "256",
         "documents per message (PushLists); 1: one per message (Push)"},
        {"timeout", NULL, RF_OPT_REAL, &c.timeout_s, "600", "deadline of each Push call, seconds"},
    };
    int rc = rf_svc_parse(
        "refinery-push", "Pushes a JSON Lines file to refinery.v1.Ingest/Push; prints the summary.",
        opts, sizeof opts / sizeof opts[0], argc, argv);
    if (rc == 1) return 0;
    if (rc == RF_OK && !c.input) rc = rf_fail(RF_ERR_INVALID, "--input is required");
    if (rc == RF_OK &&
        (c.streams < 1 || c.streams > 256 || c.batch < 1 || c.batch > 100000 || c.timeout_s <= 0))
        rc = rf_fail(RF_ERR_INVALID, "a numeric option is out of range (see --help)");
    if (rc < 0) {
        fprintf(stderr, "refinery-push: %s\n", rf_errmsg());
        return 2;
    }
    rc = push_all(&c);
    if (rc < 0) fprintf(stderr, "refinery-push: %s\n", rf_errmsg());
    return rc == RF_OK ? 0 : 1;
}
