/* The Ingest.Push handler: clean, filter, batch, produce, account. */
#include "ingest/server/ingest_service.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "common/obs.h"
#include "ingest/decide.h"
#include "ingest/ingest.h"
#include "refinery.pb-c.h"

struct rf_ingest_service {
    rf_ingest_service_opts o;
    pthread_mutex_t store_mu;
    rf_stats *stats;
    atomic_uint_fast64_t next_seq;
    atomic_uint_fast64_t next_stream;
};

void rf_ingest_service_opts_default(rf_ingest_service_opts *o) {
    memset(o, 0, sizeof *o);
    o->topic_clean = "docs.clean";
    o->topic_rejected = "docs.rejected";
    o->batch_docs = 256;
    o->delivery_timeout_s = 30;
    rf_clean_opts_default(&o->clean);
    o->quality_enabled = true;
    rf_quality_opts_default(&o->quality);
    rf_langid_opts_default(&o->language);
}

int rf_ingest_service_new(const rf_ingest_service_opts *o, rf_ingest_service **out) {
    *out = NULL;
    if (!o->producer || !o->topic_clean || !o->topic_rejected || o->batch_docs == 0)
        return rf_fail(RF_ERR_INVALID, "ingest service: producer, topics and batch size needed");
    rf_ingest_service *svc = calloc(1, sizeof *svc);
    if (!svc || !(svc->stats = rf_stats_new())) {
        free(svc);
        return RF_ERR_NOMEM;
    }
    svc->o = *o;
    pthread_mutex_init(&svc->store_mu, NULL);
    svc->o.clean.utf8 = RF_UTF8_REJECT; /* proto3 strings are UTF-8 by contract */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    atomic_init(&svc->next_seq, (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000);
    *out = svc;
    return RF_OK;
}

void rf_ingest_service_free(rf_ingest_service *svc) {
    if (!svc) return;
    pthread_mutex_destroy(&svc->store_mu);
    rf_stats_free(svc->stats);
    free(svc);
}

rf_stats *rf_ingest_service_stats(rf_ingest_service *svc) {
    return svc->stats;
}

/* Kept documents of one stream waiting to fill a DocumentBatch; each owns its
 * strings. */
typedef struct pending {
    Refinery__V1__Document *docs;
    Refinery__V1__Document **ptrs;
    size_t n, cap;
} pending;

static void pending_clear(pending *b) {
    for (size_t i = 0; i < b->n; i++) {
        free(b->docs[i].id);
        free(b->docs[i].text);
        free(b->docs[i].source);
    }
    b->n = 0;
}

static void pending_free(pending *b) {
    pending_clear(b);
    free(b->docs);
    free(b->ptrs);
}

/* Counts of one batch, recorded once the stream's messages are delivered. */
typedef struct progress {
    uint64_t seq;
    rf_store_counts counts;
} progress;

typedef struct stream {
    rf_ingest_service *svc;
    rf_doc_rules rules; /* how the stream's texts are cleaned and filtered */
    rf_decider *decider;
    const char *run_id;
    uint64_t id; /* for generated document ids */
    pending batch;
    rf_store_counts since; /* documents since the last batch was cut */
    progress *done;
    size_t ndone, capdone;
    rf_kafka_tracker tracker;
    Refinery__V1__PushSummary sum;
} stream;

/* Closes the counts since the last cut under sequence number seq. */
static int cut(stream *st, uint64_t seq) {
    if (st->ndone == st->capdone) {
        size_t cap = st->capdone ? 2 * st->capdone : 16;
        progress *grown = realloc(st->done, cap * sizeof *grown);
        if (!grown) return RF_ERR_NOMEM;
        st->done = grown;
        st->capdone = cap;
    }
    st->done[st->ndone++] = (progress){seq, st->since};
    memset(&st->since, 0, sizeof st->since);
    return RF_OK;
}

static int send_batch(stream *st) {
    if (st->batch.n == 0) return RF_OK;
    Refinery__V1__DocumentBatch m = REFINERY__V1__DOCUMENT_BATCH__INIT;
    m.run_id = (char *)st->run_id;
    m.seq = atomic_fetch_add(&st->svc->next_seq, 1);
    if (cut(st, m.seq) < 0) return RF_ERR_NOMEM;
    for (size_t i = 0; i < st->batch.n; i++)
        st->batch.ptrs[i] = &st->batch.docs[i];
    m.docs = st->batch.ptrs;
    m.n_docs = st->batch.n;
    size_t len = refinery__v1__document_batch__get_packed_size(&m);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return RF_ERR_NOMEM;
    refinery__v1__document_batch__pack(&m, buf);
    int rc = rf_kafka_produce_tracked(st->svc->o.producer, &st->tracker, st->svc->o.topic_clean,
                                      st->run_id, strlen(st->run_id), buf, len);
    free(buf);
    pending_clear(&st->batch);
    if (rc == RF_OK) rf_stats_add(st->svc->stats, "ingest.batches", 1);
    return rc;
}

static int keep(stream *st, const Refinery__V1__Document *d, const char *text, size_t len) {
    pending *b = &st->batch;
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        Refinery__V1__Document *docs = realloc(b->docs, cap * sizeof *docs);
        if (!docs) return RF_ERR_NOMEM;
        b->docs = docs;
        Refinery__V1__Document **ptrs = realloc(b->ptrs, cap * sizeof *ptrs);
        if (!ptrs) return RF_ERR_NOMEM;
        b->ptrs = ptrs;
        b->cap = cap;
    }
    Refinery__V1__Document *k = &b->docs[b->n];
    refinery__v1__document__init(k);
    char gen[64];
    if (!d->id[0]) snprintf(gen, sizeof gen, "push-%" PRIu64 "-%" PRIu64, st->id, st->sum.received);
    k->id = strdup(d->id[0] ? d->id : gen);
    k->text = strndup(text, len);
    k->source = strdup(d->source[0] ? d->source : "push");
    if (!k->id || !k->text || !k->source) {
        free(k->id);
        free(k->text);
        free(k->source);
        return RF_ERR_NOMEM;
    }
    k->label = d->label;
    k->line = d->line;
    k->offset = d->offset;
    b->n++;
    st->sum.accepted++;
    st->since.in++;
    st->since.out++;
    rf_stats_add(st->svc->stats, "ingest.kept", 1);
    rf_obs_docs_out("ingest", 1);
    return b->n >= st->svc->o.batch_docs ? send_batch(st) : RF_OK;
}

/* excerpt[0..n): the bytes the reason is about (rf_verdict.text). */
static int reject(stream *st, const Refinery__V1__Document *d, const char *reason,
                  const char *excerpt, size_t n) {
    char name[96];
    snprintf(name, sizeof name, "ingest.rejected.%s", reason);
    rf_stats_add(st->svc->stats, name, 1);
    rf_obs_docs_rejected("ingest", reason, 1);
    st->sum.rejected++;
    st->since.in++;
    st->since.rejected++;
    rf_kafka_reject r = {.run_id = st->run_id,
                         .doc_id = d->id,
                         .source = d->source[0] ? d->source : "push",
                         .line = d->line,
                         .offset = d->offset,
                         .reason = reason,
                         .excerpt = excerpt,
                         .excerpt_len = n < 64 ? n : 64};
    return rf_kafka_produce_reject(st->svc->o.producer, &st->tracker, st->svc->o.topic_rejected,
                                   &r);
}

/* The verdict of decide.h on one document (the embedded stage's workers call
 * the same rf_decide); keeps or rejects it. The label, id and source arrive
 * mapped by the client (`refinery submit` maps them with the ingest library);
 * kept documents are not augmented, as nowhere in the services. */
static int ingest_one(stream *st, const Refinery__V1__Document *d) {
    st->sum.received++;
    rf_stats_add(st->svc->stats, "ingest.received", 1);
    rf_obs_docs_in("ingest", 1);
    rf_verdict v;
    int rc = rf_decide(st->decider, d->text, strlen(d->text), &v);
    if (rc < 0) return rc;
    rf_verdict_count_clean(&v, st->svc->stats);
    return v.reject ? reject(st, d, v.reject, v.text, v.len) : keep(st, d, v.text, v.len);
}

/* With a store, the run must exist and take input (not sealed, not ended);
 * its first push moves it from pending to running. */
static grpc_status_code check_run(rf_rpc_call *call, rf_ingest_service *svc, const char *run_id) {
    if (!svc->o.store) return GRPC_STATUS_OK;
    if (!run_id)
        return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "the refinery-run-id request metadata is required");
    rf_store_run run;
    pthread_mutex_lock(&svc->store_mu);
    int rc = rf_store_run_get(svc->o.store, run_id, &run);
    bool takes_input = rc == RF_OK && !run.sealed && !rf_run_state_ended(run.state);
    if (takes_input && run.state == RF_RUN_PENDING)
        rc = rf_store_run_start(svc->o.store, run_id, NULL);
    pthread_mutex_unlock(&svc->store_mu);
    if (rc == RF_ERR_NOT_FOUND)
        return rf_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "unknown run '%s'", run_id);
    if (rc < 0) return rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "store: %s", rf_errmsg());
    if (!takes_input)
        return rf_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "run '%s' is %s", run_id,
                           run.sealed && !rf_run_state_ended(run.state)
                               ? "sealed: no more input"
                               : rf_run_state_name(run.state));
    return GRPC_STATUS_OK;
}

/* The service's settings, or those of the run's spec when it has an
 * `ingest:` section: cleaning, quality and language keys with the defaults of
 * `refinery run` for the rest, so a submitted spec cleans as it does
 * embedded. Text stays UTF-8-or-rejected (proto3 strings). */
static grpc_status_code stream_text_opts(rf_rpc_call *call, stream *st) {
    rf_ingest_service *svc = st->svc;
    st->rules =
        (rf_doc_rules){svc->o.clean, svc->o.quality_enabled, svc->o.quality, svc->o.language};
    if (!svc->o.store) return GRPC_STATUS_OK;
    char *spec = NULL;
    pthread_mutex_lock(&svc->store_mu);
    int rc = rf_store_run_spec(svc->o.store, st->run_id, &spec);
    pthread_mutex_unlock(&svc->store_mu);
    if (rc < 0) {
        free(spec);
        return rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "store: %s", rf_errmsg());
    }
    rf_cfg *cfg = NULL;
    const rf_cfg *section;
    rf_ingest_opts io;
    rf_ingest_opts_default(&io);
    rc = rf_cfg_load_string(spec, strlen(spec), "spec", &cfg);
    if (rc == RF_OK && (section = rf_cfg_get(cfg, "ingest")) &&
        rf_cfg_kind_of(section) == RF_CFG_MAP &&
        (rc = rf_ingest_opts_from_cfg(section, &io)) == RF_OK) {
        rf_doc_rules_from_opts(&io, &st->rules);
        st->rules.clean.utf8 = RF_UTF8_REJECT;
    }
    grpc_status_code code = rc < 0 ? rf_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                                                 "run '%s': %s", st->run_id, rf_errmsg())
                                   : GRPC_STATUS_OK;
    rf_ingest_opts_free(&io);
    rf_cfg_free(cfg);
    free(spec);
    return code;
}

static int record_progress(stream *st) {
    rf_ingest_service *svc = st->svc;
    if (!svc->o.store) return RF_OK;
    int rc = RF_OK;
    pthread_mutex_lock(&svc->store_mu);
    for (size_t i = 0; i < st->ndone && rc == RF_OK; i++)
        rc = rf_store_progress_add(svc->o.store, st->run_id, "ingest", st->done[i].seq,
                                   &st->done[i].counts, NULL);
    pthread_mutex_unlock(&svc->store_mu);
    return rc;
}

/* Push and PushLists: one Document or one DocumentList per message. */
static grpc_status_code push_stream(rf_rpc_call *call, rf_ingest_service *svc, bool lists) {
    char run[128];
    stream st = {.svc = svc, .id = atomic_fetch_add(&svc->next_stream, 1)};
    st.run_id = rf_rpc_metadata(call, "refinery-run-id", run, sizeof run);
    if (st.run_id && !st.run_id[0]) st.run_id = NULL;
    grpc_status_code code = check_run(call, svc, st.run_id);
    if (code != GRPC_STATUS_OK) {
        rf_stats_add(svc->stats, "ingest.streams_failed", 1);
        return code;
    }
    if (!st.run_id) st.run_id = "adhoc";
    if ((code = stream_text_opts(call, &st)) != GRPC_STATUS_OK) {
        rf_stats_add(svc->stats, "ingest.streams_failed", 1);
        return code;
    }
    if (!(st.decider = rf_decider_new(&st.rules))) {
        rf_stats_add(svc->stats, "ingest.streams_failed", 1);
        return rf_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "ingest: out of memory");
    }
    refinery__v1__push_summary__init(&st.sum);
    ProtobufCMessage *m;
    int r;
    while ((r = rf_rpc_recv(call, &m)) == 1) {
        int rc = RF_OK;
        if (lists) {
            const Refinery__V1__DocumentList *l = (const Refinery__V1__DocumentList *)m;
            for (size_t i = 0; i < l->n_docs && rc == RF_OK; i++)
                rc = ingest_one(&st, l->docs[i]);
        } else {
            rc = ingest_one(&st, (const Refinery__V1__Document *)m);
        }
        protobuf_c_message_free_unpacked(m, NULL);
        if (rc < 0) {
            code = rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "ingest: %s", rf_errmsg());
            break;
        }
    }
    if (r < 0) code = rf_rpc_call_status(call);
    if (code == GRPC_STATUS_OK && send_batch(&st) < 0)
        code = rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "ingest: %s", rf_errmsg());
    /* Trailing rejects without kept documents still get a progress row. */
    if (code == GRPC_STATUS_OK && st.since.in > 0 &&
        cut(&st, atomic_fetch_add(&svc->next_seq, 1)) < 0)
        code = rf_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "ingest: out of memory");
    /* Whatever happened, wait for what was produced: the tracker lives here. */
    int delivered = rf_kafka_wait(svc->o.producer, &st.tracker, svc->o.delivery_timeout_s);
    if (code == GRPC_STATUS_OK && delivered < 0)
        code = rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE,
                           "documents not durably stored, push again: %s", rf_errmsg());
    if (code == GRPC_STATUS_OK && record_progress(&st) < 0)
        code = rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "progress not recorded: %s", rf_errmsg());
    if (code == GRPC_STATUS_OK && rf_rpc_send(call, &st.sum.base) < 0)
        code = rf_rpc_call_status(call);
    if (code != GRPC_STATUS_OK) rf_stats_add(svc->stats, "ingest.streams_failed", 1);
    pending_free(&st.batch);
    free(st.done);
    rf_decider_free(st.decider);
    return code;
}

static grpc_status_code push(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    return push_stream(call, user, false);
}

static grpc_status_code push_lists(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    return push_stream(call, user, true);
}

int rf_ingest_service_register(rf_ingest_service *svc, rf_rpc_server *s) {
    rf_rpc_method one = {
        .path = "/refinery.v1.Ingest/Push",
        .kind = RF_RPC_CLIENT_STREAM,
        .request = &refinery__v1__document__descriptor,
        .handler = push,
        .user = svc,
    };
    rf_rpc_method lists = one;
    lists.path = "/refinery.v1.Ingest/PushLists";
    lists.request = &refinery__v1__document_list__descriptor;
    lists.handler = push_lists;
    int rc = rf_rpc_server_add(s, &one);
    if (rc == RF_OK) rc = rf_rpc_server_add(s, &lists);
    return rc < 0 ? rc : rf_rpc_server_set_health(s, "refinery.v1.Ingest", 1);
}
