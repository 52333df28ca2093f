/* Ingest.Load and the file loaders: see ingest_files.h. */
#include "ingest/server/ingest_files.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "common/obs.h"
#include "ingest/ingest.h"
#include "refinery.pb-c.h"
#include "runtime/store/store.h"
#include "runtime/doc_out.h"

#define RECORD_EVERY   16              /* batches per delivery wait and progress statement */
#define RECORD_AFTER_S 1.0             /* ... or fewer when this much time passed */
#define ATTEMPTS       5               /* tries of a load after Kafka/PostgreSQL failures */
#define SEQ_LIMIT      "1099511627776" /* 2^40: file seqs stay below, push seqs above */
#define LOCK_CLASS     0x52464c44      /* "RFLD": advisory locks of loaders */

typedef struct loader loader;

struct rf_ingest_files {
    rf_ingest_files_opts o;
    char root[PATH_MAX]; /* the input root, resolved; "" when none */
    rf_store *store;     /* Load's checks; under mu */
    pthread_mutex_t mu;  /* store, loaders */
    loader *loaders;     /* running or finished, not yet joined */
    rf_stats *stats;
    atomic_bool stopping;
};

/* What a run's load needs, from its spec: settings and resolved inputs. */
typedef struct plan {
    rf_cfg *cfg; /* owns the strings of o */
    rf_ingest_opts o;
    char **paths;
    size_t n;
} plan;

static void plan_free(plan *p) {
    for (size_t i = 0; i < p->n; i++)
        free(p->paths[i]);
    free(p->paths);
    rf_ingest_opts_free(&p->o);
    rf_cfg_free(p->cfg);
    memset(p, 0, sizeof *p);
}

/* Counts of one batch, recorded once Kafka has its messages. */
typedef struct done_batch {
    uint64_t seq;
    rf_store_counts counts;
} done_batch;

struct loader {
    rf_ingest_files *f;
    char run_id[128];
    plan plan;
    uint64_t first_batch;
    pthread_t tid;
    volatile int cancel;
    atomic_bool finished;
    loader *next;
    /* Loader thread only: */
    rf_store *store;
    rf_kafka_tracker tracker;
    done_batch done[RECORD_EVERY];
    size_t ndone;
    double last_record, last_state_check;
    double started;       /* this pass, for the rate limit */
    int64_t records_sent; /* this pass */
    bool sink_failed;     /* the failure is Kafka's or PostgreSQL's, not the input's */
    bool run_ended;       /* cancelled (or ended) while loading */
    rf_doc_out out;       /* a batch's kept documents as protobuf */
};

/* ---- inputs ---- */

/* Whether rel, read lexically, climbs above its starting directory. */
static bool escapes(const char *rel) {
    long depth = 0;
    for (const char *p = rel; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            if (--depth < 0) return true;
        } else if (n && !(n == 1 && p[0] == '.')) {
            depth++;
        }
        p += n + (e != NULL);
    }
    return false;
}

/* rel under root as a malloc'd real path: RF_ERR_INVALID for an absolute
 * path or one leading out of root (also through a symlink), RF_ERR_NOT_FOUND
 * for a missing file, RF_ERR_IO for one that is not a readable file. */
static int resolve(const char *root, const char *rel, char **out) {
    *out = NULL;
    if (!rel[0]) return rf_fail(RF_ERR_INVALID, "ingest.inputs: an empty path");
    if (rel[0] == '/')
        return rf_fail(RF_ERR_INVALID,
                       "ingest.inputs: '%s' is absolute: inputs are paths relative to the "
                       "service's input root",
                       rel);
    if (escapes(rel))
        return rf_fail(RF_ERR_INVALID, "ingest.inputs: '%s' leads out of the input root", rel);
    char joined[PATH_MAX * 2], real[PATH_MAX];
    snprintf(joined, sizeof joined, "%s/%s", root, rel);
    if (!realpath(joined, real))
        return errno == ENOENT || errno == ENOTDIR
                   ? rf_fail(RF_ERR_NOT_FOUND, "ingest.inputs: '%s' not found under the input root",
                             rel)
                   : rf_fail(RF_ERR_IO, "ingest.inputs: '%s': %s", rel, strerror(errno));
    size_t n = strlen(root);
    bool inside = strcmp(root, "/") == 0 || (strncmp(real, root, n) == 0 && real[n] == '/');
    if (!inside)
        return rf_fail(RF_ERR_INVALID, "ingest.inputs: '%s' leads out of the input root", rel);
    struct stat st;
    if (stat(real, &st) != 0 || !S_ISREG(st.st_mode) || access(real, R_OK) != 0)
        return rf_fail(RF_ERR_IO, "ingest.inputs: '%s' is not a readable file", rel);
    return (*out = strdup(real)) ? RF_OK : RF_ERR_NOMEM;
}

/* The run's ingest settings and inputs from its spec. Settings as `refinery
 * run` reads them, except: text must be UTF-8 (as for Push), no augmentation
 * (the services do not augment), and batches hold batch_docs records (0: the
 * spec's ingest.batch_docs when it has one, else the service's). */
static int plan_load(const rf_ingest_files *f, const char *spec, size_t batch_docs, plan *p) {
    memset(p, 0, sizeof *p);
    rf_ingest_opts_default(&p->o);
    const char **inputs = NULL;
    const rf_cfg *section = NULL;
    int rc = rf_cfg_load_string(spec, strlen(spec), "spec", &p->cfg);
    if (rc == RF_OK && !(section = rf_cfg_get(p->cfg, "ingest")))
        rc = rf_fail(RF_ERR_INVALID, "the run's spec has no ingest: section");
    if (rc == RF_OK) rc = rf_ingest_opts_from_cfg(section, &p->o);
    if (rc == RF_OK) rc = rf_cfg_strlist(section, "inputs", &inputs, &p->n);
    if (rc == RF_OK && p->n == 0)
        rc = rf_fail(RF_ERR_INVALID, "the run's spec has no ingest.inputs to load");
    if (rc == RF_OK && !(p->paths = calloc(p->n, sizeof *p->paths))) rc = RF_ERR_NOMEM;
    for (size_t i = 0; rc == RF_OK && i < p->n; i++)
        rc = resolve(f->root, inputs[i], &p->paths[i]);
    free(inputs);
    if (rc < 0) {
        if (!p->paths) p->n = 0;
        plan_free(p);
        return rc;
    }
    p->o.clean.utf8 = RF_UTF8_REJECT;
    p->o.augment.enabled = false;
    if (batch_docs)
        p->o.batch_docs = batch_docs;
    else if (!rf_cfg_get(section, "batch_docs"))
        p->o.batch_docs = f->o.batch_docs;
    return RF_OK;
}

/* ---- the loader thread ---- */

static int record_done(loader *l) {
    if (l->ndone == 0) return RF_OK;
    rf_ingest_files *f = l->f;
    int rc = rf_kafka_wait(f->o.producer, &l->tracker, f->o.delivery_timeout_s);
    for (size_t i = 0; i < l->ndone && rc == RF_OK; i++)
        rc = rf_store_progress_add(l->store, l->run_id, "ingest", l->done[i].seq,
                                   &l->done[i].counts, NULL);
    if (rc < 0) {
        l->sink_failed = true;
        return rc;
    }
    rf_stats_add(f->stats, "load.batches", (int64_t)l->ndone);
    l->ndone = 0;
    l->last_record = rf_now();
    return RF_OK;
}

/* Stops the load once the run is no longer running (cancelled). */
static int check_state(loader *l) {
    double now = rf_now();
    if (now - l->last_state_check < l->f->o.cancel_poll_s) return RF_OK;
    l->last_state_check = now;
    rf_store_run run;
    int rc = rf_store_run_get(l->store, l->run_id, &run);
    if (rc < 0) {
        l->sink_failed = true;
        return rc;
    }
    if (run.state == RF_RUN_RUNNING) return RF_OK;
    l->run_ended = true;
    return rf_fail(RF_ERR_CANCELED, "run %s is %s", l->run_id, rf_run_state_name(run.state));
}

static int produce_reject(loader *l, const rf_ingest_reject *r, const char *doc_id) {
    rf_obs_docs_rejected("ingest", r->reason, 1);
    rf_kafka_reject kr = {.run_id = l->run_id,
                          .doc_id = doc_id,
                          .source = r->source,
                          .line = r->line,
                          .offset = r->offset,
                          .reason = r->reason,
                          .excerpt = r->excerpt,
                          .excerpt_len = r->excerpt_len};
    return rf_kafka_produce_reject(l->f->o.producer, &l->tracker, l->f->o.topic_rejected, &kr);
}

/* A kept document that a protobuf string cannot carry (a NUL in its text,
 * an id that is not UTF-8) becomes a reject here; ok says whether d can go. */
static int check_doc(loader *l, const rf_doc *d, bool *ok) {
    const char *why = rf_doc_out_refusal(d);
    *ok = why == NULL;
    if (!why) return RF_OK;
    char name[64];
    snprintf(name, sizeof name, "load.rejected.%s", why);
    rf_stats_add(l->f->stats, name, 1);
    rf_ingest_reject r = {d->source, d->line, d->offset,
                          why,       d->text, d->text_len < 80 ? d->text_len : 80};
    return produce_reject(l, &r, NULL);
}

static int send_docs(loader *l, const rf_doc_batch *docs, uint64_t seq, int64_t *kept) {
    int rc = RF_OK;
    for (size_t i = 0; i < docs->n && rc == RF_OK; i++) {
        const rf_doc *d = &docs->docs[i];
        bool ok;
        if ((rc = check_doc(l, d, &ok)) == RF_OK && !ok) (*kept)--;
        if (rc == RF_OK && ok) rc = rf_doc_out_add(&l->out, d);
    }
    if (rc == RF_OK)
        rc = rf_doc_out_produce(&l->out, l->f->o.producer, &l->tracker, l->f->o.topic_clean,
                                l->run_id, seq);
    l->out.n = 0; /* after a failure too: the views point into docs */
    return rc;
}

/* Sleeps while this pass is ahead of the rate limit (records/s). */
static void pace(loader *l) {
    double rate = l->f->o.max_rate;
    if (rate <= 0) return;
    double until = l->started + (double)l->records_sent / rate;
    for (double now = rf_now(); now < until && !l->cancel; now = rf_now()) {
        double s = until - now < 0.05 ? until - now : 0.05;
        nanosleep(&(struct timespec){0, (long)(s * 1e9)}, NULL);
    }
}

/* rf_ingest_sink.batch: one batch to Kafka, its counts recorded later. */
static int on_batch(void *ctx, rf_ingest_batch *b) {
    loader *l = ctx;
    int64_t kept = b->kept;
    int rc = b->docs ? send_docs(l, b->docs, b->seq, &kept) : RF_OK;
    rf_doc_batch_free(b->docs);
    b->docs = NULL;
    for (size_t i = 0; i < b->n_rejects && rc == RF_OK; i++)
        rc = produce_reject(l, &b->rejects[i], NULL);
    if (rc < 0) {
        l->sink_failed = rc != RF_ERR_NOMEM;
        return rc;
    }
    int64_t records = (int64_t)b->records;
    l->done[l->ndone++] =
        (done_batch){b->seq, {.in = records, .out = kept, .rejected = records - kept}};
    l->records_sent += records;
    rf_stats_add(l->f->stats, "load.records", records);
    rf_stats_add(l->f->stats, "load.kept", kept);
    rf_stats_add(l->f->stats, "load.rejected", records - kept);
    rf_obs_stage_counts("ingest", (double)records, (double)kept, 0);
    if (l->ndone == RECORD_EVERY || rf_now() - l->last_record >= RECORD_AFTER_S) {
        if ((rc = record_done(l)) < 0) return rc;
    }
    pace(l);
    return check_state(l);
}

/* The first batch without a progress row: batches are recorded in order, so
 * every one before it is in Kafka. */
static int first_unrecorded(rf_store *s, const char *run_id, uint64_t *first) {
    const char *p[] = {run_id};
    PGresult *r;
    int rc = rf_store_exec(
        s,
        "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM stage_progress WHERE run_id = $1"
        " AND stage = 'ingest' AND batch_seq = 0) THEN 0 ELSE (SELECT min(a.batch_seq) + 1"
        " FROM stage_progress a WHERE a.run_id = $1 AND a.stage = 'ingest'"
        " AND a.batch_seq < " SEQ_LIMIT " AND NOT EXISTS (SELECT 1 FROM stage_progress b"
        " WHERE b.run_id = $1 AND b.stage = 'ingest' AND b.batch_seq = a.batch_seq + 1)) END",
        1, p, &r);
    if (rc < 0) return rc;
    *first = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return RF_OK;
}

/* Session-level: held until the loader's connection closes. */
static int try_lock(rf_store *s, const char *run_id, bool *locked) {
    char cls[16];
    snprintf(cls, sizeof cls, "%d", LOCK_CLASS);
    const char *p[] = {cls, run_id};
    PGresult *r;
    int rc = rf_store_exec(s, "SELECT pg_try_advisory_lock($1::int, hashtext($2))", 2, p, &r);
    if (rc < 0) return rc;
    *locked = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    return RF_OK;
}

/* Ends a run that is still running as failed, with the reason. */
static int fail_run(rf_store *s, const char *run_id, const char *why) {
    char error[300];
    snprintf(error, sizeof error, "ingest: %.280s", why);
    const char *p[] = {run_id, error};
    return rf_store_exec(s,
                         "UPDATE runs SET state = 'failed', error = $2, updated_at = now()"
                         " WHERE id = $1 AND state IN ('pending', 'running')",
                         2, p, NULL);
}

/* One pass over the inputs from the first unrecorded batch. */
static int load_once(loader *l) {
    l->sink_failed = false;
    int rc = first_unrecorded(l->store, l->run_id, &l->first_batch);
    if (rc < 0) {
        l->sink_failed = true;
        return rc;
    }
    rf_info("ingest", "run %s: loading %zu file(s) from batch %" PRIu64, l->run_id, l->plan.n,
            l->first_batch);
    memset(&l->tracker, 0, sizeof l->tracker); /* drained: nothing in flight */
    l->ndone = 0;
    l->last_record = l->last_state_check = l->started = rf_now();
    l->records_sent = 0;
    rf_ingest_sink sink = {.batch = on_batch, .batch_ctx = l, .first_batch = l->first_batch};
    rf_stats *st = rf_stats_new();
    if (!st) return RF_ERR_NOMEM;
    double t0 = rf_now();
    rc = rf_ingest_run(&l->plan.o, (const char *const *)l->plan.paths, l->plan.n, &sink, st,
                       &l->cancel);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", rc < 0 ? rf_errmsg() : "");
    /* What was produced is delivered and recorded whatever happened, so that
     * the next pass (or start) resumes after it. */
    int rec = record_done(l);
    int wait = rf_kafka_wait(l->f->o.producer, &l->tracker, l->f->o.delivery_timeout_s);
    if (rc == RF_OK && (rec < 0 || wait < 0)) {
        l->sink_failed = true;
        rc = rec < 0 ? rec : wait;
    } else if (rc < 0) {
        rf_fail(rc, "%s", msg);
    }
    if (rc == RF_OK) {
        double s = rf_now() - t0;
        int64_t n = rf_stats_get(st, "ingest.records_in");
        rf_info("ingest", "run %s: loaded %" PRId64 " records in %.2f s (%.0f records/s)",
                l->run_id, n, s, s > 0 ? (double)n / s : 0);
    }
    rf_stats_free(st);
    return rc;
}

/* Waits until no message of the tracker is in flight (delivery reports
 * write into it), as long as librdkafka's own delivery timeout takes. */
static bool drain(loader *l) {
    for (int i = 0; i < 3 && atomic_load(&l->tracker.pending) > 0; i++)
        rf_kafka_wait(l->f->o.producer, &l->tracker, l->f->o.delivery_timeout_s);
    return atomic_load(&l->tracker.pending) == 0;
}

/* Retries Kafka/PostgreSQL failures; ends the run on anything else. */
static void load(loader *l) {
    rf_ingest_files *f = l->f;
    int rc = RF_OK;
    for (int attempt = 1; attempt <= ATTEMPTS; attempt++) {
        rc = load_once(l);
        if (rc == RF_OK || l->cancel || l->run_ended || !l->sink_failed) break;
        if (attempt == ATTEMPTS || !drain(l)) break;
        double wait = (double)(1 << (attempt - 1));
        rf_warn("ingest", "run %s: %s; retrying in %.0f s", l->run_id, rf_errmsg(), wait);
        rf_stats_add(f->stats, "load.retries", 1);
        for (double end = rf_now() + wait; rf_now() < end && !l->cancel;)
            nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    if (rc == RF_OK) {
        if (rf_store_run_seal(l->store, l->run_id) < 0) {
            rf_error("ingest", "run %s: loaded, but not sealed: %s", l->run_id, rf_errmsg());
            return;
        }
        rf_stats_add(f->stats, "load.sealed", 1);
        rf_info("ingest", "run %s: every input loaded, run sealed", l->run_id);
    } else if (l->run_ended) {
        rf_info("ingest", "run %s: load stopped: %s", l->run_id, rf_errmsg());
        rf_stats_add(f->stats, "load.cancelled", 1);
    } else if (l->cancel) {
        rf_info("ingest",
                "run %s: load stopped for shutdown at batch %" PRIu64
                " (resumes at the next start)",
                l->run_id, l->first_batch);
    } else {
        char why[256];
        snprintf(why, sizeof why, "%s", rf_errmsg());
        rf_error("ingest", "run %s: load failed: %s", l->run_id, why);
        rf_stats_add(f->stats, "load.failed", 1);
        if (fail_run(l->store, l->run_id, why) < 0)
            rf_error("ingest", "run %s: cannot record the failure: %s", l->run_id, rf_errmsg());
    }
}

static void *loader_main(void *arg) {
    loader *l = arg;
    rf_store_opts so = {.conninfo = l->f->o.pg};
    bool locked = false;
    if (rf_store_open(&so, &l->store) < 0 || try_lock(l->store, l->run_id, &locked) < 0)
        rf_error("ingest", "run %s: cannot start loading: %s", l->run_id, rf_errmsg());
    else if (!locked)
        rf_info("ingest", "run %s: another process is loading it", l->run_id);
    else
        load(l);
    drain(l);
    rf_store_close(l->store); /* releases the lock */
    l->store = NULL;
    atomic_store(&l->finished, true);
    return NULL;
}

static void loader_free(loader *l) {
    if (atomic_load(&l->tracker.pending) > 0) { /* delivery reports would write into it */
        rf_error("ingest", "run %s: messages still in flight; loader state kept", l->run_id);
        return;
    }
    plan_free(&l->plan);
    rf_doc_out_free(&l->out);
    free(l);
}

/* Joins finished loaders. Under f->mu. */
static void reap(rf_ingest_files *f, bool all) {
    for (loader **pp = &f->loaders; *pp;) {
        loader *l = *pp;
        if (!all && !atomic_load(&l->finished)) {
            pp = &l->next;
            continue;
        }
        pthread_join(l->tid, NULL);
        *pp = l->next;
        loader_free(l);
    }
}

static bool loading(rf_ingest_files *f, const char *run_id) {
    for (loader *l = f->loaders; l; l = l->next)
        if (!atomic_load(&l->finished) && strcmp(l->run_id, run_id) == 0) return true;
    return false;
}

/* Starts a loader for run_id with p (taken over, also on failure). Under f->mu. */
static int start_loader(rf_ingest_files *f, const char *run_id, plan *p) {
    loader *l = calloc(1, sizeof *l);
    if (!l) {
        plan_free(p);
        return RF_ERR_NOMEM;
    }
    l->f = f;
    snprintf(l->run_id, sizeof l->run_id, "%s", run_id);
    l->plan = *p;
    memset(p, 0, sizeof *p);
    if (pthread_create(&l->tid, NULL, loader_main, l) != 0) {
        loader_free(l);
        return rf_fail(RF_ERR_INTERNAL, "cannot start a loader thread");
    }
    l->next = f->loaders;
    f->loaders = l;
    rf_stats_add(f->stats, "load.started", 1);
    return RF_OK;
}

/* ---- Load ---- */

static grpc_status_code status_of(int rc) {
    switch (rc) {
    case RF_ERR_INVALID:
        return GRPC_STATUS_INVALID_ARGUMENT;
    case RF_ERR_NOT_FOUND:
        return GRPC_STATUS_NOT_FOUND;
    case RF_ERR_NOMEM:
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    default:
        return GRPC_STATUS_FAILED_PRECONDITION;
    }
}

/* The batch size of run_id's load: the recorded one, else a new row with
 * want. Under f->mu. */
static int load_row(rf_ingest_files *f, const char *run_id, size_t want, size_t *batch_docs) {
    char bd[32];
    snprintf(bd, sizeof bd, "%zu", want);
    const char *p[] = {run_id, f->root, bd};
    PGresult *r;
    int rc = rf_store_exec(f->store,
                           "INSERT INTO loads (run_id, input_root, batch_docs) VALUES ($1, $2, $3)"
                           " ON CONFLICT (run_id) DO UPDATE SET run_id = EXCLUDED.run_id"
                           " RETURNING batch_docs",
                           3, p, &r);
    if (rc < 0) return rc;
    *batch_docs = (size_t)strtoull(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return RF_OK;
}

static grpc_status_code load_call(rf_rpc_call *call, rf_ingest_files *f, const char *run_id,
                                  Refinery__V1__LoadReply *reply) {
    if (!run_id[0]) return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "run_id is empty");
    if (!f->root[0])
        return rf_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                           "this refinery-ingest reads no files (no --input-root): push the "
                           "documents instead (refinery submit without --server-inputs)");
    if (!f->store)
        return rf_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                           "this refinery-ingest has no PostgreSQL (--pg): it cannot load runs");
    if (atomic_load(&f->stopping))
        return rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "service stopping");
    rf_store_run run;
    char *spec = NULL;
    int rc = rf_store_run_get(f->store, run_id, &run);
    if (rc == RF_ERR_NOT_FOUND)
        return rf_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "unknown run '%s'", run_id);
    if (rc == RF_OK && (run.sealed || rf_run_state_ended(run.state)))
        return rf_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "run '%s' is %s", run_id,
                           rf_run_state_ended(run.state) ? rf_run_state_name(run.state)
                                                         : "sealed: no more input");
    if (rc == RF_OK) rc = rf_store_run_spec(f->store, run_id, &spec);
    if (rc < 0) {
        free(spec);
        return rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "store: %s", rf_errmsg());
    }
    plan p;
    rc = plan_load(f, spec, 0, &p);
    free(spec);
    if (rc < 0) return rf_rpc_fail(call, status_of(rc), "run '%s': %s", run_id, rf_errmsg());
    reply->inputs = (uint32_t)p.n;
    size_t batch_docs;
    if (loading(f, run_id)) { /* already loading here: nothing to start */
        rc = load_row(f, run_id, p.o.batch_docs, &batch_docs);
        plan_free(&p);
    } else if ((rc = load_row(f, run_id, p.o.batch_docs, &batch_docs)) == RF_OK &&
               (rc = rf_store_run_start(f->store, run_id, NULL)) == RF_OK) {
        p.o.batch_docs = batch_docs;
        rc = start_loader(f, run_id, &p);
        reply->started = rc == RF_OK;
    } else {
        plan_free(&p);
    }
    if (rc < 0) return rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "store: %s", rf_errmsg());
    reply->batch_docs = (uint32_t)batch_docs;
    return GRPC_STATUS_OK;
}

static grpc_status_code load_handler(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    rf_ingest_files *f = user;
    const Refinery__V1__LoadRequest *r = (const Refinery__V1__LoadRequest *)req;
    rf_stats_add(f->stats, "load.requests", 1);
    Refinery__V1__LoadReply reply = REFINERY__V1__LOAD_REPLY__INIT;
    reply.run_id = r->run_id;
    pthread_mutex_lock(&f->mu);
    reap(f, false);
    grpc_status_code code = load_call(call, f, r->run_id, &reply);
    pthread_mutex_unlock(&f->mu);
    if (code != GRPC_STATUS_OK) return code;
    rf_info("ingest", "run %s: Load: %u input(s), batches of %u%s", r->run_id, reply.inputs,
            reply.batch_docs, reply.started ? "" : " (already loading)");
    return rf_rpc_send(call, &reply.base) < 0 ? rf_rpc_call_status(call) : GRPC_STATUS_OK;
}

/* ---- lifecycle ---- */

int rf_ingest_files_new(const rf_ingest_files_opts *o, rf_ingest_files **out) {
    *out = NULL;
    if (!o->producer || !o->topic_clean || !o->topic_rejected || o->batch_docs == 0)
        return rf_fail(RF_ERR_INVALID, "file loader: producer, topics and batch size needed");
    rf_ingest_files *f = calloc(1, sizeof *f);
    if (!f || !(f->stats = rf_stats_new())) {
        free(f);
        return RF_ERR_NOMEM;
    }
    f->o = *o;
    if (f->o.cancel_poll_s <= 0) f->o.cancel_poll_s = 1;
    pthread_mutex_init(&f->mu, NULL);
    int rc = RF_OK;
    if (o->input_root && !realpath(o->input_root, f->root))
        rc = rf_fail(RF_ERR_NOT_FOUND, "input root '%s': %s", o->input_root, strerror(errno));
    if (rc == RF_OK && o->pg && o->input_root) { /* Load's own connection */
        rf_store_opts so = {.conninfo = o->pg};
        rc = rf_store_open(&so, &f->store);
    }
    if (rc < 0) {
        rf_ingest_files_free(f);
        return rc;
    }
    *out = f;
    return RF_OK;
}

int rf_ingest_files_register(rf_ingest_files *f, rf_rpc_server *s) {
    rf_rpc_method m = {
        .path = "/refinery.v1.Ingest/Load",
        .kind = RF_RPC_UNARY,
        .request = &refinery__v1__load_request__descriptor,
        .handler = load_handler,
        .user = f,
    };
    return rf_rpc_server_add(s, &m);
}

int rf_ingest_files_resume(rf_ingest_files *f, size_t *started) {
    if (started) *started = 0;
    if (!f->store || !f->root[0]) return RF_OK;
    pthread_mutex_lock(&f->mu);
    PGresult *r = NULL;
    int rc = rf_store_exec(f->store,
                           "SELECT l.run_id, l.batch_docs, r.spec FROM loads l JOIN runs r"
                           " ON r.id = l.run_id WHERE r.state = 'running' AND r.sealed_at IS NULL"
                           " ORDER BY l.created_at",
                           0, NULL, &r);
    for (int i = 0; rc == RF_OK && i < PQntuples(r); i++) {
        const char *run_id = PQgetvalue(r, i, 0);
        if (loading(f, run_id)) continue;
        plan p;
        size_t batch_docs = (size_t)strtoull(PQgetvalue(r, i, 1), NULL, 10);
        int prc = plan_load(f, PQgetvalue(r, i, 2), batch_docs, &p);
        if (prc < 0) { /* the files are gone or the root moved: the run cannot finish */
            char why[300];
            snprintf(why, sizeof why, "cannot resume: %s", rf_errmsg());
            rf_error("ingest", "run %s: %s", run_id, why);
            rc = fail_run(f->store, run_id, why);
            continue;
        }
        if ((rc = start_loader(f, run_id, &p)) == RF_OK && started) (*started)++;
    }
    PQclear(r);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

void rf_ingest_files_stop(rf_ingest_files *f) {
    atomic_store(&f->stopping, true);
    pthread_mutex_lock(&f->mu);
    for (loader *l = f->loaders; l; l = l->next)
        l->cancel = 1;
    reap(f, true);
    pthread_mutex_unlock(&f->mu);
}

rf_stats *rf_ingest_files_stats(rf_ingest_files *f) {
    return f->stats;
}

void rf_ingest_files_free(rf_ingest_files *f) {
    if (!f) return;
    rf_ingest_files_stop(f);
    rf_store_close(f->store);
    pthread_mutex_destroy(&f->mu);
    rf_stats_free(f->stats);
    free(f);
}
