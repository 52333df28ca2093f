#include "pipeline/pipeline.h"

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "common/queue.h"
#include "common/stage.h"
#include "common/stats.h"
#include "common/sys.h"
#include "common/obs.h"
#include "pipeline/stages.h"
#include "trainer/driver.h"

#define MAX_ACTIVE 16

/* One active stage and the wiring around it. */
typedef struct slot {
    const rf_stage_ops *ops;
    void *state;
    rf_queue *in, *out; /* NULL at the ends of the stream */
    pthread_t thread;
    int rc;
    char error[1024]; /* detail of a failure in the stage's thread */
    double seconds;
    _Atomic uint64_t docs_in, docs_out;
    struct run *run;
} slot;

typedef struct run {
    rf_cfg *spec;
    rf_run_ctx ctx;
    slot slots[MAX_ACTIVE];
    size_t nslots, nstream;
    volatile int *cancel;
    int queue_depth;
    const rf_stage_table *stages;
} run;

/* This thread's error detail, prefixed with the stage name. */
static int stage_error(int rc, const char *stage) {
    if (!rf_errmsg()[0]) return rf_fail(rc, "stage %s: %s", stage, rf_err_name(rc));
    return rf_fail_ctx(rc, "stage %s", stage);
}

static int emit_batch(void *emit_ctx, rf_doc_batch *b) {
    slot *s = emit_ctx;
    atomic_fetch_add(&s->docs_out, b->n);
    rf_obs_docs_out(s->ops->name, (double)b->n);
    if (!s->out) { /* end of the stream: nothing downstream */
        rf_doc_batch_free(b);
        return RF_OK;
    }
    int rc = rf_queue_push(s->out, b);
    if (rc) rf_doc_batch_free(b);
    return rc;
}

/* Stops every stage after a failure: closing the queues unblocks them all. */
static void abort_stream(run *r) {
    *r->cancel = 1;
    for (size_t i = 0; i < r->nstream; i++)
        if (r->slots[i].out) rf_queue_close(r->slots[i].out);
}

static void *stage_thread(void *arg) {
    slot *s = arg;
    run *r = s->run;
    double t0 = rf_now();
    int rc = RF_OK;
    if (!s->in) {
        rc = s->ops->produce(s->state, emit_batch, s);
    } else {
        void *item;
        while (rf_queue_pop(s->in, &item) == 1) {
            rf_doc_batch *b = item;
            atomic_fetch_add(&s->docs_in, b->n);
            if (rc || *r->cancel) { /* drain so upstream never blocks forever */
                rf_doc_batch_free(b);
                continue;
            }
            double tb = rf_now();
            rf_obs_docs_in(s->ops->name, (double)b->n);
            rc = s->ops->process(s->state, b, emit_batch, s);
            rf_obs_batch_seconds(s->ops->name, rf_now() - tb);
        }
        if (!rc && !*r->cancel && s->ops->finish) rc = s->ops->finish(s->state, emit_batch, s);
    }
    if (!rc && *r->cancel) rc = RF_ERR_CANCELED;
    s->seconds = rf_now() - t0;
    s->rc = rc;
    if (rc && rc != RF_ERR_CANCELED) {
        /* The detail lives in this thread's buffer: keep it for the caller. */
        stage_error(rc, s->ops->name);
        snprintf(s->error, sizeof s->error, "%s", rf_errmsg());
        rf_error(s->ops->name, "%s", s->error);
        abort_stream(r);
    } else if (rc) {
        abort_stream(r);
    }
    if (s->out) rf_queue_close(s->out);
    return NULL;
}

/* The active stages, in table order, checked for a workable order. */
static int select_stages(run *r) {
    int rc = rf_pipeline_check_spec(r->spec, r->stages);
    if (rc) return rc;
    size_t n = r->stages->n;
    const rf_stage_ops *const *all = r->stages->stages;
    for (size_t i = 0; i < n; i++) {
        if (!rf_cfg_get(r->spec, all[i]->name)) continue;
        slot *s = &r->slots[r->nslots++];
        s->ops = all[i];
        s->run = r;
    }
    /* Streaming stages come first: a source, then transforms. */
    size_t i = 0;
    if (!r->slots[0].ops->produce && r->slots[0].ops->process)
        return rf_fail(RF_ERR_INVALID, "stage '%s' needs a source stage before it",
                       r->slots[0].ops->name);
    if (r->slots[0].ops->produce) {
        i = 1;
        while (i < r->nslots && r->slots[i].ops->process)
            i++;
    }
    r->nstream = i;
    for (; i < r->nslots; i++)
        if (!r->slots[i].ops->run)
            return rf_fail(RF_ERR_INVALID, "stage '%s' cannot follow a batch stage",
                           r->slots[i].ops->name);
    return RF_OK;
}

static int make_run_dir(run *r, const char *override, char **out) {
    const char *name, *dir;
    int rc = rf_cfg_str(r->spec, "run.name", "run", &name);
    if (!rc) rc = rf_cfg_str(r->spec, "run.out", NULL, &dir);
    if (rc) return rc;
    char *path = NULL;
    if (override) dir = override;
    if (dir) {
        path = strdup(dir);
    } else {
        char ts[32];
        time_t now = time(NULL);
        struct tm tm;
        strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", gmtime_r(&now, &tm));
        if (asprintf(&path, "runs/%s-%s", name, ts) < 0) path = NULL;
    }
    if (!path) return RF_ERR_NOMEM;
    if ((rc = rf_mkdir_p(path))) {
        free(path);
        return rc;
    }
    *out = path;
    return RF_OK;
}

typedef struct progress {
    run *r;
    FILE *out;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    double t0;
} progress;

static void print_progress(progress *p, int final) {
    run *r = p->r;
    char line[512];
    size_t o = 0;
    o += (size_t)snprintf(line + o, sizeof line - o, "\r%6.1fs ", rf_now() - p->t0);
    for (size_t i = 0; i < r->nstream && o < sizeof line - 64; i++)
        o += (size_t)snprintf(line + o, sizeof line - o, "| %s %llu ", r->slots[i].ops->name,
                              (unsigned long long)atomic_load(&r->slots[i].docs_out));
    o += (size_t)snprintf(line + o, sizeof line - o, "docs | rss %lld MB%s",
                          (long long)rf_peak_rss_kb() / 1024, final ? "\n" : "   ");
    fputs(line, p->out);
    fflush(p->out);
}

static void *progress_loop(void *arg) {
    progress *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&p->cond, &p->lock, &ts);
        if (!p->stop) print_progress(p, 0);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static int run_stream(run *r, FILE *progress_out) {
    size_t n = r->nstream;
    if (n == 0) return RF_OK;
    for (size_t i = 0; i + 1 < n; i++) {
        rf_queue *q = rf_queue_new((size_t)r->queue_depth);
        if (!q) {
            while (i-- > 0)
                rf_queue_free(r->slots[i].out);
            return RF_ERR_NOMEM;
        }
        r->slots[i].out = q;
        r->slots[i + 1].in = q;
    }
    progress p = {.r = r, .out = progress_out, .t0 = rf_now()};
    pthread_t pt;
    int have_progress = 0;
    if (progress_out) {
        pthread_mutex_init(&p.lock, NULL);
        pthread_cond_init(&p.cond, NULL);
        have_progress = pthread_create(&pt, NULL, progress_loop, &p) == 0;
    }
    size_t started = 0;
    int rc = RF_OK;
    for (; started < n; started++) {
        if (pthread_create(&r->slots[started].thread, NULL, stage_thread, &r->slots[started])) {
            rc = rf_fail(RF_ERR_INTERNAL, "cannot start a thread for stage '%s'",
                         r->slots[started].ops->name);
            abort_stream(r);
            break;
        }
    }
    for (size_t i = 0; i < started; i++)
        pthread_join(r->slots[i].thread, NULL);
    if (have_progress) {
        pthread_mutex_lock(&p.lock);
        p.stop = 1;
        pthread_cond_signal(&p.cond);
        pthread_mutex_unlock(&p.lock);
        pthread_join(pt, NULL);
        print_progress(&p, 1);
    }
    if (progress_out) {
        pthread_mutex_destroy(&p.lock);
        pthread_cond_destroy(&p.cond);
    }
    for (size_t i = 0; i + 1 < n; i++) {
        void *item; /* batches left behind by a failure */
        while (rf_queue_pop(r->slots[i].out, &item) == 1)
            rf_doc_batch_free(item);
        rf_queue_free(r->slots[i].out);
    }
    if (rc) return rc;
    /* Report the first real failure rather than the cancellations it caused. */
    for (size_t i = 0; i < n; i++)
        if (r->slots[i].rc && r->slots[i].rc != RF_ERR_CANCELED)
            return rf_fail(r->slots[i].rc, "%s", r->slots[i].error);
    for (size_t i = 0; i < n; i++)
        if (r->slots[i].rc) return rf_fail(RF_ERR_CANCELED, "run canceled");
    return RF_OK;
}

static void record_stats(run *r, double seconds) {
    rf_stats *st = r->ctx.stats;
    char key[128];
    for (size_t i = 0; i < r->nslots; i++) {
        slot *s = &r->slots[i];
        const char *name = s->ops->name;
        if (i < r->nstream) {
            if (s->in) {
                snprintf(key, sizeof key, "%s.docs_in", name);
                rf_stats_set(st, key, (int64_t)atomic_load(&s->docs_in));
            }
            snprintf(key, sizeof key, "%s.docs_out", name);
            rf_stats_set(st, key, (int64_t)atomic_load(&s->docs_out));
            snprintf(key, sizeof key, "%s.docs_per_s", name);
            uint64_t docs = s->in ? atomic_load(&s->docs_in) : atomic_load(&s->docs_out);
            rf_stats_set_real(st, key, s->seconds > 0 ? (double)docs / s->seconds : 0);
            /* Stages that count their input bytes get a throughput. */
            snprintf(key, sizeof key, "%s.bytes_in", name);
            int64_t bytes = rf_stats_get(st, key);
            if (bytes > 0 && s->seconds > 0) {
                snprintf(key, sizeof key, "%s.mb_per_s", name);
                rf_stats_set_real(st, key, (double)bytes / 1e6 / s->seconds);
            }
        }
        snprintf(key, sizeof key, "%s.seconds", name);
        rf_stats_set_real(st, key, s->seconds);
    }
    rf_stats_set_real(st, "run.seconds", seconds);
    rf_stats_set(st, "run.peak_rss_kb", rf_peak_rss_kb());
}

static int write_stats(run *r) {
    rf_buf b = RF_BUF_INIT;
    int rc = rf_stats_to_json(r->ctx.stats, &b);
    if (!rc) rc = rf_buf_putc(&b, '\n');
    char *path = NULL;
    if (!rc && asprintf(&path, "%s/stats.json", r->ctx.run_dir) < 0) rc = RF_ERR_NOMEM;
    if (!rc) rc = rf_write_file_atomic(path, b.data, b.len);
    free(path);
    rf_buf_free(&b);
    return rc;
}

/* Every log line of the run is also kept in <run_dir>/run.log. */
static FILE *open_run_log(const char *dir) {
    char *path = NULL;
    if (asprintf(&path, "%s/run.log", dir) < 0) return NULL;
    FILE *f = fopen(path, "a");
    free(path);
    if (f) rf_log_set_tee(f);
    return f;
}

/* Rank 0's word to the other ranks of a group: the data stages' outcome and
 * the run directory. */
typedef struct group_word {
    int32_t rc;
    char dir[4092];
} group_word;

static int group_announce(rf_comm *c, int rc, const char *dir) {
    group_word w = {.rc = rc};
    snprintf(w.dir, sizeof w.dir, "%s", dir ? dir : "");
    int crc = rf_comm_broadcast(c, &w, sizeof w, RF_COMM_U8, 0);
    return crc ? rf_fail_ctx(crc, "run: telling the other ranks") : RF_OK;
}

static const rf_stage_ops *find_trainer(run *r, size_t *at) {
    for (size_t i = 0; i < r->nslots; i++)
        if (!strcmp(r->slots[i].ops->name, "trainer")) {
            *at = i;
            return r->slots[i].ops;
        }
    return NULL;
}

/* Ranks 1..N-1: wait for rank 0's data stages, then train with the group. */
static int run_follower(run *r, rf_comm *c, int64_t threads, char **run_dir) {
    group_word w;
    int rc = rf_comm_broadcast(c, &w, sizeof w, RF_COMM_U8, 0);
    if (rc) return rf_fail_ctx(rc, "run: waiting for rank 0's data stages");
    if (w.rc)
        return rf_fail(w.rc, "run: rank 0 failed before training (%s); see its log",
                       rf_err_name(w.rc));
    w.dir[sizeof w.dir - 1] = 0;
    if (!(*run_dir = strdup(w.dir))) return RF_ERR_NOMEM;
    size_t at = 0;
    const rf_stage_ops *t = find_trainer(r, &at);
    r->ctx = (rf_run_ctx){*run_dir, r->spec, rf_stats_new(), r->cancel, (int)threads};
    if (!r->ctx.stats) return RF_ERR_NOMEM;
    void *state = NULL;
    rc = t->open(rf_cfg_get(r->spec, t->name), &r->ctx, &state);
    if (!rc) {
        rf_trainer_stage_set_group(c);
        rc = t->run(state);
        rf_trainer_stage_set_group(NULL);
    }
    if (rc) rc = stage_error(rc, t->name);
    if (state && t->close) t->close(state);
    return rc;
}

int rf_pipeline_run(const rf_pipeline_opts *o, char **run_dir) {
    return rf_pipeline_run_group(o, NULL, run_dir);
}

int rf_pipeline_run_group(const rf_pipeline_opts *o, rf_comm *comm, char **run_dir) {
    static volatile int no_cancel;
    run *r = calloc(1, sizeof *r);
    if (!r) return RF_ERR_NOMEM;
    *run_dir = NULL;
    r->cancel = o->cancel ? o->cancel : &no_cancel;
    r->stages = o->stages ? o->stages : rf_pipeline_stages();
    int rc = rf_cfg_load_file(o->spec_path, &r->spec);
    if (!rc) rc = rf_cfg_apply_env(r->spec);
    if (!rc) rc = select_stages(r);
    int64_t threads = 0, depth = 0;
    if (!rc) rc = rf_cfg_int(r->spec, "run.threads", rf_ncpu(), 1, 1024, &threads);
    if (!rc) rc = rf_cfg_int(r->spec, "run.queue_depth", 8, 1, 4096, &depth);
    rf_comm *grp = comm && rf_comm_world(comm) > 1 ? comm : NULL;
    size_t trainer_at = 0;
    bool announced = false, waiting = false; /* waiting: the other ranks wait for our word */
    if (!rc && grp && !find_trainer(r, &trainer_at))
        rc = rf_fail(RF_ERR_INVALID,
                     "run: %d ranks but the spec has no trainer: section (only "
                     "the trainer runs in parallel)",
                     rf_comm_world(grp));
    if (!rc && grp && rf_comm_rank(grp) > 0) {
        rc = run_follower(r, grp, threads, run_dir);
        goto out;
    }
    waiting = !rc && grp; /* every rank made the same checks of the same spec */
    char *dir = NULL;
    if (!rc) rc = make_run_dir(r, o->out_dir, &dir);
    if (rc) goto out;
    *run_dir = dir;
    FILE *log_file = open_run_log(dir);
    r->queue_depth = (int)depth;
    r->ctx = (rf_run_ctx){dir, r->spec, rf_stats_new(), r->cancel, (int)threads};
    if (!r->ctx.stats) {
        rc = RF_ERR_NOMEM;
        goto out;
    }
    rf_info("run", "run directory %s, %zu stages (%zu streaming), %d threads", dir, r->nslots,
            r->nstream, (int)threads);
    size_t opened = 0;
    for (; opened < r->nslots && !rc; opened++) {
        slot *s = &r->slots[opened];
        rc = s->ops->open(rf_cfg_get(r->spec, s->ops->name), &r->ctx, &s->state);
        if (rc) {
            rc = stage_error(rc, s->ops->name);
            break;
        }
    }
    double t0 = rf_now();
    if (!rc) rc = run_stream(r, o->progress);
    for (size_t i = r->nstream; i < r->nslots && !rc; i++) {
        slot *s = &r->slots[i];
        rf_info("run", "stage %s", s->ops->name);
        if (grp && i == trainer_at) { /* the data is ready: the other ranks join */
            announced = true;
            if ((rc = group_announce(grp, RF_OK, dir))) break;
            rf_trainer_stage_set_group(grp);
        }
        double ts = rf_now();
        rc = s->ops->run(s->state);
        if (grp && i == trainer_at) rf_trainer_stage_set_group(NULL);
        s->seconds = rf_now() - ts;
        if (!rc && *r->cancel) rc = rf_fail(RF_ERR_CANCELED, "run canceled");
        if (rc && rc != RF_ERR_CANCELED) rc = stage_error(rc, s->ops->name);
    }
    for (size_t i = 0; i < opened; i++)
        if (r->slots[i].ops->close) r->slots[i].ops->close(r->slots[i].state);
    record_stats(r, rf_now() - t0);
    rf_stats_set(r->ctx.stats, "run.ok", rc == RF_OK);
    int wrc = write_stats(r);
    if (!rc) rc = wrc;
    if (rc)
        rf_error("run", "%s", rf_errmsg());
    else
        rf_info("run", "finished in %.1fs", rf_now() - t0);
    if (log_file) {
        rf_log_set_tee(NULL);
        fclose(log_file);
    }
out:
    if (waiting && !announced && !rf_comm_broken(grp)) {
        /* the others wait for rank 0's word: tell them it failed */
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", rf_errmsg());
        group_announce(grp, rc ? rc : RF_ERR_INTERNAL, NULL);
        if (rc) rf_fail(rc, "%s", keep);
    }
    if (r->ctx.stats) rf_stats_free(r->ctx.stats);
    rf_cfg_free(r->spec);
    free(r);
    return rc;
}
