/* The ingest pipeline: a reader thread fills sequence-numbered batches from a
 * fixed pool, worker threads process them, and the calling thread writes them
 * back in sequence order (so output does not depend on thread count) and
 * returns each batch to the pool. With one thread everything runs inline. */
#include "ingest/ingest.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/queue.h"
#include "common/sys.h"
#include "common/obs.h"
#include "ingest/batch.h"
#include "ingest/process.h"
#include "ingest/source.h"

typedef struct pipeline {
    const rf_ingest_opts *o;
    const rf_ingest_sink *sink;
    rf_stats *stats;
    volatile int *cancel;
    rf_source *src;
    rf_augmenter *aug;
    size_t n_batches; /* the pool; every batch is owned here */
    rf_ibatch **batches;
    size_t n_workers;
    rf_worker **workers;
    uint64_t emitted;           /* doc batches handed downstream */
    uint64_t records_skipped;   /* in batches before sink->first_batch; reader only */
    rf_ingest_reject *rej_view; /* a batch's rejects for sink->batch */
    size_t rej_cap;
    /* Threaded mode only */
    rf_queue *pool, *work, *done;
    atomic_int live_workers;
    int read_rc;
    char read_msg[512];
} pipeline;

static bool canceled(const pipeline *p) {
    return p->cancel && *p->cancel;
}

/* Writes one processed batch and folds its counts into the stats. */
static int write_batch(pipeline *p, rf_ibatch *b) {
    if (b->err) return b->err;
    const rf_ingest_sink *s = p->sink;
    if (s->docs && b->docs_out.len &&
        fwrite(b->docs_out.data, 1, b->docs_out.len, s->docs) != b->docs_out.len)
        return rf_fail(RF_ERR_IO, "ingest: writing documents failed");
    if (s->rejects && b->rejects_out.len &&
        fwrite(b->rejects_out.data, 1, b->rejects_out.len, s->rejects) != b->rejects_out.len)
        return rf_fail(RF_ERR_IO, "ingest: writing rejects failed");
    rf_stats *st = p->stats;
    int64_t rejected = 0;
    char name[96];
    for (size_t i = 0; i < b->n_reasons; i++) {
        snprintf(name, sizeof name, "ingest.rejected.%s", b->reasons[i].reason);
        rf_stats_add(st, name, b->reasons[i].n);
        rf_obs_docs_rejected("ingest", b->reasons[i].reason, (double)b->reasons[i].n);
        rejected += b->reasons[i].n;
    }
    rf_stats_add(st, "ingest.records_in", (int64_t)b->n);
    rf_obs_docs_in("ingest", (double)b->n);
    rf_stats_add(st, "ingest.kept", b->kept);
    rf_stats_add(st, "ingest.rejected_total", rejected);
    rf_stats_add(st, "ingest.augmented", b->augmented);
    rf_stats_add(st, "ingest.clean.utf8_repairs", b->utf8_repairs);
    rf_stats_add(st, "ingest.clean.controls_removed", b->controls_removed);
    rf_stats_add(st, "ingest.clean.nul_bytes", b->nul_bytes);
    rf_stats_add(st, "ingest.clean.entities_decoded", b->entities);
    rf_stats_add(st, "ingest.clean.tags_removed", b->tags);
    if (b->kept + rejected != (int64_t)b->n)
        return rf_fail(RF_ERR_INTERNAL, "ingest: batch %llu accounts for %lld of %zu records",
                       (unsigned long long)b->seq, (long long)(b->kept + rejected), b->n);
    if (s->batch)
        return rf_ibatch_hand_on(b, p->src, &p->rej_view, &p->rej_cap, s->batch, s->batch_ctx);
    if (s->emit && b->docs && b->docs->n) {
        rf_doc_batch *d = b->docs;
        b->docs = NULL;
        d->seq = p->emitted++;
        int rc = s->emit(s->emit_ctx, d);
        if (rc) return rc;
    }
    return 0;
}

static int run_inline(pipeline *p) {
    rf_ibatch *b = p->batches[0];
    for (uint64_t seq = 0;; seq++) {
        if (canceled(p)) return rf_fail(RF_ERR_CANCELED, "ingest: canceled");
        rf_ibatch_clear(b);
        b->seq = seq;
        int rc = rf_source_fill(p->src, b);
        if (rc <= 0) return rc;
        if (seq < p->sink->first_batch) {
            p->records_skipped += b->n;
            continue;
        }
        rf_worker_process(p->workers[0], b);
        if ((rc = write_batch(p, b))) return rc;
    }
}

static void *reader_main(void *arg) {
    pipeline *p = arg;
    void *item;
    for (uint64_t seq = 0; rf_queue_pop(p->pool, &item) == 1; seq++) {
        rf_ibatch *b = item;
        int rc;
        for (;; seq++) { /* batches before first_batch are read and dropped */
            rf_ibatch_clear(b);
            b->seq = seq;
            rc = canceled(p) ? rf_fail(RF_ERR_CANCELED, "ingest: canceled")
                             : rf_source_fill(p->src, b);
            if (rc <= 0 || seq >= p->sink->first_batch) break;
            p->records_skipped += b->n;
        }
        if (rc < 0) {
            p->read_rc = rc;
            snprintf(p->read_msg, sizeof p->read_msg, "%s", rf_errmsg());
        }
        if (rc <= 0 || rf_queue_push(p->work, b)) break;
    }
    rf_queue_close(p->work);
    return NULL;
}

typedef struct worker_arg {
    pipeline *p;
    rf_worker *w;
} worker_arg;

static void *worker_main(void *arg) {
    worker_arg *a = arg;
    void *item;
    while (rf_queue_pop(a->p->work, &item) == 1) {
        rf_worker_process(a->w, item);
        if (rf_queue_push(a->p->done, item)) break;
    }
    if (atomic_fetch_sub(&a->p->live_workers, 1) == 1) rf_queue_close(a->p->done);
    return NULL;
}

static int run_threaded(pipeline *p) {
    size_t n = p->n_batches, nw = p->n_workers;
    p->pool = rf_queue_new(n);
    p->work = rf_queue_new(n);
    p->done = rf_queue_new(n);
    rf_ibatch **pending = calloc(n, sizeof(*pending));
    pthread_t reader, *tids = calloc(nw, sizeof(*tids));
    worker_arg *args = calloc(nw, sizeof(*args));
    void *item;
    int rc = 0;
    if (!p->pool || !p->work || !p->done || !pending || !tids || !args) {
        rc = RF_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        rf_queue_push(p->pool, p->batches[i]);
    atomic_store(&p->live_workers, (int)nw);
    size_t started = 0;
    for (; started < nw; started++) {
        args[started] = (worker_arg){p, p->workers[started]};
        if (pthread_create(&tids[started], NULL, worker_main, &args[started])) break;
    }
    bool reader_up = started == nw && pthread_create(&reader, NULL, reader_main, p) == 0;
    if (!reader_up) {
        /* Let the workers that did start see a closed queue and exit. */
        atomic_fetch_sub(&p->live_workers, (int)(nw - started));
        rf_queue_close(p->work);
        if (started == 0) rf_queue_close(p->done);
        rc = rf_fail(RF_ERR_INTERNAL, "ingest: cannot start threads");
    }

    /* Writer: restore sequence order. At most n batches exist, so the ones in
     * flight have distinct seq modulo n. */
    uint64_t next = p->sink->first_batch;
    while (rf_queue_pop(p->done, &item) == 1) {
        rf_ibatch *b = item;
        pending[b->seq % n] = b;
        while (!rc && (b = pending[next % n]) && b->seq == next) {
            pending[next % n] = NULL;
            if (canceled(p))
                rc = rf_fail(RF_ERR_CANCELED, "ingest: canceled");
            else
                rc = write_batch(p, b);
            next++;
            rf_queue_push(p->pool, b);
        }
        if (rc) { /* stop reading; keep draining until the workers are done */
            rf_queue_close(p->pool);
            rf_queue_close(p->work);
        }
    }
    rf_queue_close(p->pool);
    if (reader_up) pthread_join(reader, NULL);
    for (size_t i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    if (!rc && p->read_rc) rc = rf_fail(p->read_rc, "%s", p->read_msg);

out:; /* the batches stay owned by p->batches: just empty the queues */
    rf_queue *queues[] = {p->pool, p->work, p->done};
    for (size_t i = 0; i < 3; i++) {
        if (!queues[i]) continue;
        rf_queue_close(queues[i]);
        while (rf_queue_pop(queues[i], &item) == 1) {
        }
        rf_queue_free(queues[i]);
    }
    free(pending);
    free(tids);
    free(args);
    return rc;
}

static void pipeline_free(pipeline *p) {
    for (size_t i = 0; i < p->n_batches; i++)
        rf_ibatch_free(p->batches[i]);
    free(p->batches);
    for (size_t i = 0; i < p->n_workers; i++)
        rf_worker_free(p->workers[i]);
    free(p->workers);
    free(p->rej_view);
    rf_augmenter_free(p->aug);
    rf_source_close(p->src);
}

static void final_stats(pipeline *p, double seconds) {
    rf_stats *st = p->stats;
    uint64_t bytes = rf_source_bytes(p->src);
    int64_t records = rf_stats_get(st, "ingest.records_in");
    rf_stats_add(st, "ingest.lines_skipped", (int64_t)rf_source_lines_skipped(p->src));
    if (p->sink->first_batch)
        rf_stats_add(st, "ingest.records_skipped", (int64_t)p->records_skipped);
    rf_stats_add(st, "ingest.bytes_in", (int64_t)bytes);
    rf_stats_set(st, "ingest.threads", p->o->threads);
    rf_stats_set_real(st, "ingest.seconds", seconds);
    rf_stats_set_real(st, "ingest.docs_per_s", seconds > 0 ? (double)records / seconds : 0);
    rf_stats_set_real(st, "ingest.mb_per_s", seconds > 0 ? (double)bytes / 1e6 / seconds : 0);
    rf_stats_set(st, "ingest.peak_rss_kb", rf_peak_rss_kb());
}

int rf_ingest_run(const rf_ingest_opts *o, const char *const *inputs, size_t n,
                  const rf_ingest_sink *sink, rf_stats *stats, volatile int *cancel) {
    if (o->n_text_fields == 0) return rf_fail(RF_ERR_INVALID, "ingest: no text field");
    if (sink->emit && sink->batch)
        return rf_fail(RF_ERR_INVALID, "ingest: a sink takes emit or batch, not both");
    double t0 = rf_now();
    pipeline p = {.o = o, .sink = sink, .stats = stats, .cancel = cancel};
    int rc = rf_source_open(o, inputs, n, &p.src);
    if (rc) return rc;
    if (o->augment.enabled && (rc = rf_augmenter_new(&o->augment, &p.aug))) goto out;

    bool threaded = o->threads > 1;
    p.n_workers = (size_t)o->threads;
    p.n_batches = threaded ? 2 * p.n_workers + 2 : 1;
    p.batches = calloc(p.n_batches, sizeof(*p.batches));
    p.workers = calloc(p.n_workers, sizeof(*p.workers));
    if (!p.batches || !p.workers) {
        rc = RF_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < p.n_batches; i++)
        if (!(p.batches[i] = rf_ibatch_new())) {
            rc = RF_ERR_NOMEM;
            goto out;
        }
    for (size_t i = 0; i < p.n_workers; i++) {
        bool want_docs = sink->emit || sink->batch;
        if ((rc = rf_worker_new(o, p.aug, p.src, want_docs, &p.workers[i]))) goto out;
        if (sink->batch) rf_worker_keep_rejects(p.workers[i]);
    }

    rc = threaded ? run_threaded(&p) : run_inline(&p);
    if (!rc) final_stats(&p, rf_now() - t0);
out:
    pipeline_free(&p);
    return rc;
}
