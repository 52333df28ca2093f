/* docs.raw messages -> the ingest library -> docs.clean / docs.rejected. */
#include "ingest/server/ingest_kafka_source.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "common/utf8.h"
#include "common/obs.h"
#include "ingest/buffer.h"
#include "runtime/doc_out.h"
#include "runtime/svc.h"

#define SEQ_BASE     ((uint64_t)1 << 62)
#define OFFSET_BITS  40
#define MAX_RUNS     16 /* runs whose settings are kept parsed */
#define EXCERPT_MAX  64
#define DOC_OVERHEAD 64 /* protobuf bytes of a Document besides its strings, at most */

/* A run's ingest settings, parsed from its spec once. */
typedef struct run_settings {
    char run_id[128];
    rf_cfg *cfg; /* the spec: opts points into it */
    rf_ingest_opts opts;
    bool own; /* opts came from the spec (else the service's are used) */
    uint64_t used;
} run_settings;

struct rf_ingest_source {
    rf_ingest_source_opts o;
    rf_ingest_opts defaults; /* a shallow copy of *o.ingest, adapted (never freed here) */
    rf_doc_out out;          /* a message's kept documents, reused */
    run_settings runs[MAX_RUNS];
    uint64_t clock;
};

/* Messages are JSON Lines unless the run says otherwise; the services do not
 * augment. */
static void adapt(rf_ingest_opts *o) {
    if (o->format == RF_FORMAT_AUTO) o->format = RF_FORMAT_JSONL;
    o->augment.enabled = false;
}

int rf_ingest_source_new(const rf_ingest_source_opts *o, rf_ingest_source **out) {
    *out = NULL;
    if (!o->producer || !o->topic_clean || !o->topic_rejected || !o->ingest || !o->stats)
        return rf_fail(RF_ERR_INVALID,
                       "ingest source: producer, topics, settings and stats needed");
    rf_ingest_source *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->o = *o;
    if (!s->o.max_batch_bytes) s->o.max_batch_bytes = 900000;
    s->defaults = *o->ingest;
    adapt(&s->defaults);
    *out = s;
    return RF_OK;
}

static void settings_clear(run_settings *r) {
    if (r->own) rf_ingest_opts_free(&r->opts);
    rf_cfg_free(r->cfg);
    memset(r, 0, sizeof *r);
}

void rf_ingest_source_free(rf_ingest_source *s) {
    if (!s) return;
    for (size_t i = 0; i < MAX_RUNS; i++)
        settings_clear(&s->runs[i]);
    rf_doc_out_free(&s->out);
    free(s);
}

/* The run's settings: its spec's `ingest:` section over the defaults of
 * `refinery run`, or the service's when the spec has none. RF_ERR_PARSE when
 * the stored spec does not give settings (it was checked at Submit, so this
 * is a spec written to the database by other means). */
static int settings_for(rf_ingest_source *s, const char *run_id, const rf_ingest_opts **out) {
    run_settings *slot = &s->runs[0];
    for (size_t i = 0; i < MAX_RUNS; i++) {
        run_settings *r = &s->runs[i];
        if (r->run_id[0] && !strcmp(r->run_id, run_id)) {
            r->used = ++s->clock;
            *out = r->own ? &r->opts : &s->defaults;
            return RF_OK;
        }
        if (r->used < slot->used) slot = r; /* least recently used, or empty */
    }
    settings_clear(slot);
    char *spec = NULL;
    int rc = rf_store_run_spec(s->o.store, run_id, &spec);
    if (rc == RF_OK) rc = rf_cfg_load_string(spec, strlen(spec), "spec", &slot->cfg);
    free(spec);
    const rf_cfg *section = rc == RF_OK ? rf_cfg_get(slot->cfg, "ingest") : NULL;
    if (section && rf_cfg_kind_of(section) == RF_CFG_MAP) {
        rf_ingest_opts_default(&slot->opts);
        slot->own = true;
        if (rc == RF_OK) rc = rf_ingest_opts_from_cfg(section, &slot->opts);
        adapt(&slot->opts);
    }
    if (rc < 0) {
        settings_clear(slot);
        return rc == RF_ERR_NOMEM || rc == RF_ERR_IO ? rc : RF_ERR_PARSE;
    }
    snprintf(slot->run_id, sizeof slot->run_id, "%s", run_id);
    slot->used = ++s->clock;
    *out = slot->own ? &slot->opts : &s->defaults;
    return RF_OK;
}

int rf_ingest_source_identify(void *user, const rf_kafka_msg *m, rf_stage_batch_id *id) {
    (void)user;
    memset(id, 0, sizeof *id);
    if (!m->key || m->key_len == 0) return rf_fail(RF_ERR_PARSE, "no key (the run id)");
    if (m->key_len >= sizeof id->run_id) return rf_fail(RF_ERR_RANGE, "run id too long");
    if (!rf_utf8_valid(m->key, m->key_len) || memchr(m->key, 0, m->key_len))
        return rf_fail(RF_ERR_PARSE, "the key (run id) is not UTF-8 text");
    if (m->partition < 0 || m->partition >= (1 << (62 - OFFSET_BITS)) || m->offset < 0 ||
        m->offset >= ((int64_t)1 << OFFSET_BITS))
        return rf_fail(RF_ERR_RANGE, "partition or offset too large for a batch number");
    memcpy(id->run_id, m->key, m->key_len);
    id->seq = SEQ_BASE | (uint64_t)m->partition << OFFSET_BITS | (uint64_t)m->offset;
    return RF_OK;
}

/* Whether the run takes input; a pending run becomes running. */
static int run_open(rf_ingest_source *s, const char *run_id, bool *open) {
    *open = true;
    if (!s->o.store) return RF_OK;
    rf_store_run run;
    int rc = rf_store_run_get(s->o.store, run_id, &run);
    if (rc < 0) return rc;
    *open = !run.sealed && !rf_run_state_ended(run.state);
    if (*open && run.state == RF_RUN_PENDING) rc = rf_store_run_start(s->o.store, run_id, NULL);
    return rc;
}

/* One message on its way: its rejects go out as they come, its kept
 * documents are gathered into one batch. */
typedef struct message {
    rf_ingest_source *s;
    const rf_stage_batch_id *id;
    const char *source;
    rf_kafka_tracker *t;
    rf_store_counts *counts;
    rf_doc_batch *docs;
} message;

static int reject(message *g, const char *doc_id, uint64_t line, uint64_t offset,
                  const char *reason, const char *excerpt, size_t excerpt_len) {
    char name[96];
    snprintf(name, sizeof name, "source.reasons.%s", reason);
    rf_stats_add(g->s->o.stats, name, 1);
    g->counts->rejected++;
    rf_kafka_reject r = {.run_id = g->id->run_id,
                         .doc_id = doc_id,
                         .source = g->source,
                         .line = line,
                         .offset = offset,
                         .reason = reason,
                         .excerpt = excerpt,
                         .excerpt_len = excerpt_len < EXCERPT_MAX ? excerpt_len : EXCERPT_MAX};
    return rf_kafka_produce_reject(g->s->o.producer, g->t, g->s->o.topic_rejected, &r);
}

/* rf_ingest_buffer's callback. */
static int on_batch(void *ctx, rf_ingest_batch *b) {
    message *g = ctx;
    g->counts->in += (int64_t)b->records;
    int rc = RF_OK;
    for (size_t i = 0; rc == RF_OK && i < b->n_rejects; i++) {
        const rf_ingest_reject *r = &b->rejects[i];
        rf_obs_docs_rejected("ingest", r->reason, 1);
        rc = reject(g, NULL, r->line, r->offset, r->reason, r->excerpt, r->excerpt_len);
    }
    if (!b->docs) return rc;
    if (!g->docs) { /* the common case: one batch holds the whole message */
        g->docs = b->docs;
        return rc;
    }
    for (size_t i = 0; rc == RF_OK && i < b->docs->n; i++) {
        rf_doc *d = rf_doc_batch_push(g->docs);
        if (!d) {
            rc = RF_ERR_NOMEM;
            break;
        }
        *d = b->docs->docs[i]; /* moved */
        memset(&b->docs->docs[i], 0, sizeof b->docs->docs[i]);
    }
    rf_doc_batch_free(b->docs);
    return rc;
}

/* The kept documents: a DocumentBatch of the message's (run, seq); those that
 * cannot go (a protobuf string cannot carry them, the batch would pass
 * max_batch_bytes, or the run is closed) are rejected instead. */
static int send_docs(message *g, bool open) {
    rf_ingest_source *s = g->s;
    size_t n = g->docs ? g->docs->n : 0, bytes = 0;
    int rc = RF_OK;
    for (size_t i = 0; rc == RF_OK && i < n; i++) {
        const rf_doc *d = &g->docs->docs[i];
        size_t need = strlen(d->id) + d->text_len + strlen(d->source) + DOC_OVERHEAD;
        const char *why = open ? rf_doc_out_refusal(d) : "run_closed";
        if (!why && bytes + need > s->o.max_batch_bytes) why = "message_too_large";
        if (why) {
            const char *doc_id = strcmp(why, "invalid_utf8_id") ? d->id : NULL;
            rc = reject(g, doc_id, d->line, d->offset, why, d->text, d->text_len);
            continue;
        }
        bytes += need;
        g->counts->out++;
        rc = rf_doc_out_add(&s->out, d);
    }
    if (rc == RF_OK)
        rc = rf_doc_out_produce(&s->out, s->o.producer, g->t, s->o.topic_clean, g->id->run_id,
                                g->id->seq);
    s->out.n = 0; /* after a failure too: the views point into g->docs */
    return rc;
}

int rf_ingest_source_process(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                             rf_kafka_tracker *t, rf_store_counts *counts) {
    rf_ingest_source *s = user;
    memset(counts, 0, sizeof *counts);
    if (m->len == 0) return RF_OK; /* the end marker: sealed in after_record */
    bool open;
    int rc = run_open(s, id->run_id, &open);
    const rf_ingest_opts *opts = &s->defaults;
    if (rc == RF_OK && s->o.store) rc = settings_for(s, id->run_id, &opts);
    if (rc < 0) return rc;

    char source[192];
    snprintf(source, sizeof source, "%s[%d]@%" PRId64, m->topic, (int)m->partition, m->offset);
    message g = {s, id, source, t, counts, NULL};
    rc = rf_ingest_buffer(opts, source, m->value, m->len, on_batch, &g);
    if (rc < 0 && rc != RF_ERR_NOMEM && rc != RF_ERR_IO) {
        /* Corrupt compressed data, a CSV column that is not there: what was
         * read before stays, the rest of the message is one unreadable
         * record (the same on a replay). */
        rf_warn("ingest", "%s: %s; the rest is rejected as one record", source, rf_errmsg());
        counts->in++;
        rc = reject(&g, NULL, 0, 0, "unreadable_message", m->value, m->len);
    }
    if (rc == RF_OK) rc = send_docs(&g, open);
    if (rc == RF_OK && counts->out + counts->rejected != counts->in)
        rc = rf_fail(RF_ERR_INTERNAL, "ingest source: %s accounts for %" PRId64 " of %" PRId64,
                     source, counts->out + counts->rejected, counts->in);
    rf_doc_batch_free(g.docs);
    return rc;
}

int rf_ingest_source_after_record(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id) {
    rf_ingest_source *s = user;
    if (m->len != 0 || !s->o.store) return RF_OK;
    int rc = rf_store_run_seal(s->o.store, id->run_id);
    if (rc == RF_OK) rf_info("ingest", "run %s: end of its Kafka input, sealed", id->run_id);
    return rc;
}

struct rf_ingest_source_thread {
    rf_stage_loop loop;
    rf_ingest_source *source;
    rf_store *store;
    rf_stats *stats;
    pthread_t tid;
    int rc;
};

static void thread_free(rf_ingest_source_thread *t) {
    rf_kafka_consumer_free(t->loop.consumer);
    rf_ingest_source_free(t->source);
    rf_store_close(t->store);
    rf_stats_free(t->stats);
    free(t);
}

static void *thread_main(void *arg) {
    rf_ingest_source_thread *t = arg;
    t->rc = rf_stage_loop_run(&t->loop);
    if (t->rc < 0) rf_svc_request_stop(); /* the service must not run on without its source */
    return NULL;
}

int rf_ingest_source_start(const rf_ingest_source_thread_opts *o, rf_ingest_source_thread **out) {
    *out = NULL;
    rf_ingest_source_thread *t = calloc(1, sizeof *t);
    if (!t || !(t->stats = rf_stats_new())) {
        free(t);
        return RF_ERR_NOMEM;
    }
    rf_ingest_source_opts so = o->source;
    so.stats = t->stats;
    int rc = RF_OK;
    if (o->conninfo) {
        rf_store_opts sto = {.conninfo = o->conninfo};
        if ((rc = rf_store_open(&sto, &t->store)) == RF_OK) so.store = t->store;
    }
    if (rc == RF_OK) rc = rf_ingest_source_new(&so, &t->source);
    t->loop = (rf_stage_loop){.stage = "ingest",
                              .counters = "source",
                              .producer = so.producer,
                              .store = t->store,
                              .max_messages = o->max_messages,
                              .delivery_timeout_s = o->delivery_timeout_s,
                              .identify = rf_ingest_source_identify,
                              .process = rf_ingest_source_process,
                              .after_record = rf_ingest_source_after_record,
                              .user = t->source,
                              .stats = t->stats};
    if (rc == RF_OK)
        rc = rf_kafka_consumer_new(o->kafka, o->group, &o->topic, 1, &t->loop.consumer);
    if (rc == RF_OK && pthread_create(&t->tid, NULL, thread_main, t) != 0)
        rc = rf_fail(RF_ERR_INTERNAL, "ingest source: cannot start its thread");
    if (rc < 0) {
        thread_free(t);
        return rc;
    }
    *out = t;
    return RF_OK;
}

int rf_ingest_source_join(rf_ingest_source_thread *t, rf_stats *stats) {
    if (!t) return RF_OK;
    pthread_join(t->tid, NULL);
    int rc = t->rc;
    if (stats) rf_stats_merge(stats, t->stats);
    thread_free(t);
    return rc;
}
