#include "pipeline/pipeline.h"

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <math.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"
#include "common/queue.h"
#include "common/stage.h"
#include "common/stats.h"
#include "common/sys.h"
#include "common/obs.h"
#include "pipeline/cache.h"
#include "pipeline/progress.h"
#include "pipeline/resources.h"
#include "pipeline/retry.h"
#include "pipeline/stages.h"
#include "trainer/driver.h"

#define MAX_ACTIVE 16

enum { ST_WAITING, ST_RUNNING, ST_DONE, ST_CACHED, ST_FAILED };
static const char *const state_names[] = {"waiting", "running", "done", "cached", "failed"};

/* One active stage and the wiring around it. */
typedef struct slot {
    const rf_stage_ops *ops;
    void *state;
    rf_queue *in, *out; /* NULL at the ends of the stream */
    pthread_t thread;
    int rc;
    char error[1024]; /* detail of a failure in the stage's thread */
    double seconds, t0;
    _Atomic uint64_t docs_in, docs_out;
    _Atomic int status; /* ST_* */
    struct run *run;
    struct slot *down; /* the next stage of the stream being run, or NULL */
    bool fed;          /* it had a stage before it in the stream */
    rf_run_ctx ctx;    /* the run's, with this stage's threads */
    rf_resources res;
    int64_t retries;
    int attempts;
    bool cache_on; /* the section's cache: */
    bool eligible; /* may be looked up and stored */
    bool hit;      /* reused from the cache */
    bool record;   /* keeps its stream for later stages (stream.jsonl) */
    char key[RF_CACHE_KEY_LEN];
    char *entry;                /* a hit's cache entry */
    char *tmp;                  /* the entry being built for a miss */
    FILE *stream;               /* tmp/stream.jsonl */
    rf_buf line;                /* a document of it */
    const rf_stage_cache *info; /* NULL for stages the pipeline does not know */
    const char *outputs[2];     /* <name>, for those */
    /* bytes of documents queued for this stage, bounded by a quarter of its memory */
    pthread_mutex_t gate_lock;
    pthread_cond_t gate_cond;
    int64_t gate_used, gate_cap;
} slot;

typedef struct run {
    rf_cfg *spec;
    rf_run_ctx ctx;
    slot slots[MAX_ACTIVE];
    size_t nslots, nstream;
    volatile int *cancel;
    int queue_depth;
    const rf_stage_table *stages;
    slot *active[MAX_ACTIVE + 1]; /* the stream being run */
    size_t nactive;
    slot *failed; /* the stage whose failure ended the last stream */
    rf_cache *cache;
    double retry_base;
    uint64_t jitter;
    /* *cancel is what the stages watch: set by a failure (to stop the others), the
     * memory watch, or the caller's flag, which a relay thread copies in (the
     * caller's own flag alone tells a retry apart from a cancellation). */
    volatile int stop;
    volatile int *user;
    pthread_t relay;
    volatile int relay_done;
} run;

static const char *const *slot_outputs(slot *s) {
    return s->info ? s->info->outputs : s->outputs;
}

static size_t batch_bytes(const rf_doc_batch *b) {
    size_t n = sizeof *b + b->n * sizeof(rf_doc);
    for (size_t i = 0; i < b->n; i++)
        n += b->docs[i].text_len + (b->docs[i].id ? strlen(b->docs[i].id) : 0);
    return n;
}

/* Waits for room in s's gate (always lets one batch through). */
static void gate_take(slot *s, int64_t bytes) {
    pthread_mutex_lock(&s->gate_lock);
    while (s->gate_used > 0 && s->gate_used + bytes > s->gate_cap && !*s->run->cancel)
        pthread_cond_wait(&s->gate_cond, &s->gate_lock);
    s->gate_used += bytes;
    pthread_mutex_unlock(&s->gate_lock);
}

static void gate_give(slot *s, int64_t bytes) {
    pthread_mutex_lock(&s->gate_lock);
    s->gate_used -= bytes;
    pthread_cond_broadcast(&s->gate_cond);
    pthread_mutex_unlock(&s->gate_lock);
}

/* This thread's error detail, prefixed with the stage name. */
static int stage_error(int rc, const char *stage) {
    if (!rf_errmsg()[0]) return rf_fail(rc, "stage %s: %s", stage, rf_err_name(rc));
    return rf_fail_ctx(rc, "stage %s", stage);
}

static int emit_batch(void *emit_ctx, rf_doc_batch *b) {
    slot *s = emit_ctx;
    atomic_fetch_add(&s->docs_out, b->n);
    rf_obs_docs_out(s->ops->name, (double)b->n);
    if (s->stream) { /* kept in the cache entry for the stages after this one */
        for (size_t i = 0; i < b->n; i++) {
            rf_buf_reset(&s->line);
            int rc = rf_doc_to_json(&b->docs[i], &s->line);
            if (!rc) rc = rf_buf_putc(&s->line, '\n');
            if (!rc && fwrite(s->line.data, 1, s->line.len, s->stream) != s->line.len)
                rc = rf_fail(RF_ERR_IO, "%s: writing its stream into the cache", s->ops->name);
            if (rc) {
                rf_doc_batch_free(b);
                return rc;
            }
        }
    }
    if (!s->out) { /* end of the stream: nothing downstream */
        rf_doc_batch_free(b);
        return RF_OK;
    }
    int64_t bytes = s->down && s->down->gate_cap ? (int64_t)batch_bytes(b) : 0;
    if (bytes) gate_take(s->down, bytes);
    int rc = rf_queue_push(s->out, b);
    if (rc) {
        if (bytes) gate_give(s->down, bytes);
        rf_doc_batch_free(b);
    }
    return rc;
}

/* Stops every stage after a failure: closing the queues unblocks them all. */
static void abort_stream(run *r) {
    *r->cancel = 1;
    for (size_t i = 0; i < r->nactive; i++) {
        if (r->active[i]->out) rf_queue_close(r->active[i]->out);
        gate_give(r->active[i], 0); /* wakes a producer waiting for room */
    }
}

static void *stage_thread(void *arg) {
    slot *s = arg;
    run *r = s->run;
    double t0 = rf_now();
    s->t0 = t0;
    atomic_store(&s->status, ST_RUNNING);
    int rc = RF_OK;
    if (!s->in) {
        rc = s->ops->produce(s->state, emit_batch, s);
    } else {
        void *item;
        while (rf_queue_pop(s->in, &item) == 1) {
            rf_doc_batch *b = item;
            atomic_fetch_add(&s->docs_in, b->n);
            if (s->gate_cap) gate_give(s, (int64_t)batch_bytes(b));
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
    atomic_store(&s->status, rc ? ST_FAILED : ST_DONE);
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

/* Runs list[0..n) as one stream: list[0] a source, the others transforms. */
static int run_stream(run *r, slot **list, size_t n) {
    if (n == 0) return RF_OK;
    r->nactive = n;
    r->failed = NULL;
    for (size_t i = 0; i < n; i++) {
        r->active[i] = list[i];
        list[i]->in = list[i]->out = NULL;
        list[i]->down = i + 1 < n ? list[i + 1] : NULL;
        list[i]->fed = i > 0;
        list[i]->gate_used = 0;
        list[i]->rc = RF_OK;
        list[i]->error[0] = 0;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        rf_queue *q = rf_queue_new((size_t)r->queue_depth);
        if (!q) {
            while (i-- > 0)
                rf_queue_free(list[i]->out);
            return RF_ERR_NOMEM;
        }
        list[i]->out = q;
        list[i + 1]->in = q;
    }
    size_t started = 0;
    int rc = RF_OK;
    for (; started < n; started++) {
        if (pthread_create(&list[started]->thread, NULL, stage_thread, list[started])) {
            rc = rf_fail(RF_ERR_INTERNAL, "cannot start a thread for stage '%s'",
                         list[started]->ops->name);
            abort_stream(r);
            break;
        }
    }
    for (size_t i = 0; i < started; i++)
        pthread_join(list[i]->thread, NULL);
    for (size_t i = 0; i + 1 < n; i++) {
        void *item; /* batches left behind by a failure */
        while (rf_queue_pop(list[i]->out, &item) == 1)
            rf_doc_batch_free(item);
        rf_queue_free(list[i]->out);
        list[i]->out = list[i + 1]->in = NULL;
    }
    r->nactive = 0;
    if (rc) return rc;
    /* Report the first real failure rather than the cancellations it caused. */
    for (size_t i = 0; i < n; i++)
        if (list[i]->rc && list[i]->rc != RF_ERR_CANCELED) {
            r->failed = list[i];
            return rf_fail(list[i]->rc, "%s", list[i]->error);
        }
    for (size_t i = 0; i < n; i++)
        if (list[i]->rc) return rf_fail(RF_ERR_CANCELED, "run canceled");
    return RF_OK;
}

/* The runner's counters of a stage that ran (stored with it in the cache). */
static void record_slot(run *r, slot *s, bool streamed) {
    rf_stats *st = r->ctx.stats;
    char key[128];
    const char *name = s->ops->name;
    if (streamed) {
        if (s->fed) {
            snprintf(key, sizeof key, "%s.docs_in", name);
            rf_stats_set(st, key, (int64_t)atomic_load(&s->docs_in));
        }
        snprintf(key, sizeof key, "%s.docs_out", name);
        rf_stats_set(st, key, (int64_t)atomic_load(&s->docs_out));
        snprintf(key, sizeof key, "%s.docs_per_s", name);
        uint64_t docs = s->fed ? atomic_load(&s->docs_in) : atomic_load(&s->docs_out);
        rf_stats_set_real(st, key, s->seconds > 0 ? (double)docs / s->seconds : 0);
        /* Stages that count their input bytes get a throughput. */
        snprintf(key, sizeof key, "%s.bytes_in", name);
        int64_t bytes = rf_stats_get(st, key);
        if (bytes > 0 && s->seconds > 0) {
            snprintf(key, sizeof key, "%s.mb_per_s", name);
            rf_stats_set_real(st, key, (double)bytes / 1e6 / s->seconds);
        }
    }
}

/* Every stage's records: cached, key, attempts, seconds. */
static void record_stats(run *r, double seconds) {
    rf_stats *st = r->ctx.stats;
    char key[128];
    for (size_t i = 0; i < r->nslots; i++) {
        slot *s = &r->slots[i];
        const char *name = s->ops->name;
        snprintf(key, sizeof key, "%s.seconds", name);
        rf_stats_set_real(st, key, s->seconds);
        snprintf(key, sizeof key, "%s.cached", name);
        rf_stats_set_bool(st, key, s->hit);
        snprintf(key, sizeof key, "%s.attempts", name);
        rf_stats_set(st, key, s->attempts);
        if (s->key[0]) {
            snprintf(key, sizeof key, "%s.key", name);
            rf_stats_set_str(st, key, s->key);
        }
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

/* ---- the replay of a cached stream ---- */

static int replay_produce(void *state, rf_emit_fn emit, void *emit_ctx) {
    const char *path = state;
    FILE *f = fopen(path, "rb");
    if (!f) return rf_fail(RF_ERR_IO, "cache: %s: %s", path, strerror(errno));
    rf_json_doc *jd = rf_json_doc_new();
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    uint64_t no = 0;
    rf_doc_batch *b = NULL;
    int rc = jd ? RF_OK : RF_ERR_NOMEM;
    while (!rc && (len = getline(&line, &cap, f)) > 0) {
        no++;
        const rf_json *root;
        if (!b && !(b = rf_doc_batch_new(1024))) rc = RF_ERR_NOMEM;
        rf_doc *d = rc ? NULL : rf_doc_batch_push(b);
        if (!rc && !d) rc = RF_ERR_NOMEM;
        if (!rc) rc = rf_json_parse(jd, line, (size_t)len, &root);
        if (!rc) rc = rf_doc_from_json(root, d);
        if (rc) rc = rf_fail_ctx(rc, "cache: %s:%llu", path, (unsigned long long)no);
        if (!rc && b->n == 1024) {
            rc = emit(emit_ctx, b);
            b = NULL;
            rf_json_doc_free(jd); /* its arena grows with every line parsed */
            if (!(jd = rf_json_doc_new())) rc = rc ? rc : RF_ERR_NOMEM;
        }
    }
    if (!rc && ferror(f)) rc = rf_fail(RF_ERR_IO, "cache: reading %s", path);
    if (!rc && b)
        rc = emit(emit_ctx, b);
    else if (b)
        rf_doc_batch_free(b);
    free(line);
    rf_json_doc_free(jd);
    fclose(f);
    return rc;
}

static const rf_stage_ops replay_ops = {.name = "cache", .produce = replay_produce};

/* ---- stage settings, cache plan, attempts ---- */

/* cache:, retries:, resources: of each stage, and its threads. */
static int setup_slots(run *r, int64_t threads) {
    for (size_t i = 0; i < r->nslots; i++) {
        slot *s = &r->slots[i];
        const rf_cfg *sec = rf_cfg_get(r->spec, s->ops->name);
        s->info = rf_pipeline_stage_cache(s->ops->name);
        s->outputs[0] = s->ops->name;
        s->line = (rf_buf)RF_BUF_INIT;
        pthread_mutex_init(&s->gate_lock, NULL);
        pthread_cond_init(&s->gate_cond, NULL);
        int rc = rf_cfg_bool(sec, "cache", true, &s->cache_on);
        if (!rc) rc = rf_cfg_int(sec, "retries", 0, 0, 100, &s->retries);
        if (!rc) rc = rf_resources_parse(sec, &s->res);
        if (rc) return rc;
        s->ctx = r->ctx;
        if (s->res.cpu > 0) s->ctx.threads = (int)ceil(s->res.cpu);
        s->gate_cap = s->res.memory / 4;
    }
    return RF_OK;
}

static bool has_stream(const char *entry) {
    char path[4200];
    snprintf(path, sizeof path, "%s/stream.jsonl", entry);
    return access(path, R_OK) == 0;
}

static void unhit(slot *s) {
    s->hit = false;
    free(s->entry);
    s->entry = NULL;
}

/* Keys, lookups, and which stages run: returns the first streaming stage to
 * run (nstream when none) in *from, its last in *to, and the entry to replay
 * (a borrowed pointer or NULL) in *replay. */
static int plan_cache(run *r, bool enabled, size_t *from, size_t *to, const char **replay) {
    const char *up = NULL;
    bool chain = enabled;
    for (size_t i = 0; i < r->nslots && enabled; i++) {
        slot *s = &r->slots[i];
        const rf_cfg *sec = rf_cfg_get(r->spec, s->ops->name);
        bool keyed = chain && rf_cache_key(r->cache, s->ops->name, s->info, sec, up, s->key) == 0;
        up = s->key;
        const char *outside = NULL;
        for (const char *const *k = s->info ? s->info->output_keys : NULL; k && *k; k++)
            if (rf_cfg_get(sec, *k)) outside = *k;
        if (chain && !keyed) /* an input that cannot be read is the stage's to report */
            rf_warn("cache", "stage %s: not cached: %s", s->ops->name, rf_errmsg());
        else if (outside)
            rf_info("cache", "stage %s: not cached (%s.%s sends its outputs out of the run)",
                    s->ops->name, s->ops->name, outside);
        else if (!s->cache_on)
            rf_info("cache", "stage %s: cache: false", s->ops->name);
        else if (!chain)
            rf_info("cache", "stage %s: not cached (a stage before it is not)", s->ops->name);
        if (!keyed) s->key[0] = 0;
        s->eligible = keyed && s->cache_on && !outside;
        if (!s->eligible) chain = false; /* what follows depends on outputs not keyed */
        if (!s->eligible) continue;
        const char *why = "";
        s->hit = rf_cache_lookup(r->cache, s->ops->name, s->key, &s->entry, &why) == 1;
        if (!s->hit && strcmp(why, "absent"))
            rf_warn("cache", "stage %s: entry %s unusable, rebuilding: %s", s->ops->name, s->key,
                    why);
        s->record = i + 1 < r->nstream;
    }
    /* The stream runs from its first miss to its last; a cached stage in between
     * runs again, and the stage before the first miss is replayed from its entry. */
    size_t first = r->nstream, last = 0;
    for (size_t i = 0; i < r->nstream; i++)
        if (!r->slots[i].hit) {
            if (first == r->nstream) first = i;
            last = i;
        }
    *replay = NULL;
    if (first < r->nstream) {
        while (first > 0 && !has_stream(r->slots[first - 1].entry))
            first--; /* no stream kept (it was the last stage then): run it again */
        for (size_t i = first; i <= last; i++)
            unhit(&r->slots[i]);
        if (first > 0) *replay = r->slots[first - 1].entry;
    }
    *from = first;
    *to = first < r->nstream ? last + 1 : first;
    return RF_OK;
}

/* Opens stage s for a new attempt (and its cache entry under construction). */
static int open_slot(run *r, slot *s) {
    s->attempts++;
    atomic_store(&s->docs_in, 0);
    atomic_store(&s->docs_out, 0);
    atomic_store(&s->status, ST_WAITING);
    int rc = rf_retry_injected(s->ops->name, s->attempts);
    if (!rc) rc = rf_cache_unlink_outputs(r->ctx.run_dir, slot_outputs(s));
    if (!rc && s->eligible) rc = rf_cache_begin(r->cache, s->ops->name, s->key, &s->tmp);
    if (!rc && s->tmp && s->record) {
        char path[4200];
        snprintf(path, sizeof path, "%s/stream.jsonl", s->tmp);
        if (!(s->stream = fopen(path, "wb")))
            rc = rf_fail(RF_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (!rc) rc = s->ops->open(rf_cfg_get(r->spec, s->ops->name), &s->ctx, &s->state);
    if (rc) {
        s->state = NULL;
        atomic_store(&s->status, ST_FAILED);
        return stage_error(rc, s->ops->name);
    }
    return RF_OK;
}

static int close_slot(slot *s, int rc) {
    if (s->state && s->ops->close) s->ops->close(s->state);
    s->state = NULL;
    if (s->stream && fclose(s->stream) != 0 && !rc)
        rc = rf_fail(RF_ERR_IO, "%s: writing its stream into the cache", s->ops->name);
    s->stream = NULL;
    if (rc) {
        rf_cache_abort(s->tmp);
        s->tmp = NULL;
    }
    return rc;
}

/* Runs a unit (the stream stages list[0..n), fed by replay when not NULL, or
 * one batch stage) with its retries, memory budget and cache entries. */
static int run_unit(run *r, slot **list, size_t n, const char *replay, bool streamed) {
    int rc;
    for (;;) {
        rc = RF_OK;
        slot *failed = NULL;
        /* the budget: the stage's, or the streaming stages' together */
        int64_t budget = 0;
        char budgets[512] = "";
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            char t[32];
            rf_bytes_text(list[i]->res.memory, t, sizeof t);
            budget = list[i]->res.memory && (i == 0 || budget) ? budget + list[i]->res.memory : 0;
            o += (size_t)snprintf(budgets + o, sizeof budgets - o, "%s%s %s", i ? " + " : "",
                                  list[i]->ops->name, t);
            if (o >= sizeof budgets) o = sizeof budgets - 1;
        }
        rf_memwatch *watch = NULL; /* from before the stages open: they allocate there too */
        if (budget) rc = rf_memwatch_start(budget, r->cancel, &watch);
        for (size_t i = 0; i < n && !rc; i++)
            if ((rc = open_slot(r, list[i]))) failed = list[i];
        char stream_path[4200];
        snprintf(stream_path, sizeof stream_path, "%s/stream.jsonl", replay ? replay : "");
        if (!rc && streamed) {
            slot src = {.ops = &replay_ops, .state = stream_path, .run = r};
            slot *all[MAX_ACTIVE + 1];
            size_t k = 0;
            if (replay) all[k++] = &src;
            for (size_t i = 0; i < n; i++)
                all[k++] = list[i];
            rc = run_stream(r, all, k);
            failed = r->failed == &src ? NULL : r->failed;
        } else if (!rc) {
            slot *s = list[0];
            atomic_store(&s->status, ST_RUNNING);
            s->t0 = rf_now();
            rc = s->ops->run(s->state);
            s->seconds = rf_now() - s->t0;
            if (!rc && *r->cancel) rc = rf_fail(RF_ERR_CANCELED, "run canceled");
            if (rc && rc != RF_ERR_CANCELED) rc = stage_error(rc, s->ops->name);
            atomic_store(&s->status, rc ? ST_FAILED : ST_DONE);
            failed = s;
        }
        if (watch) {
            bool over;
            int64_t grew = rf_memwatch_stop(watch, &over);
            if (over) {
                char b[32], g[32];
                rf_bytes_text(budget, b, sizeof b);
                rf_bytes_text(grew, g, sizeof g);
                rc = rf_fail(RF_ERR_RANGE,
                             "stage %s exceeded its memory budget of %s (resources.memory: %s): "
                             "resident memory grew by %s",
                             n == 1 ? list[0]->ops->name : "stream", b, budgets, g);
                failed = NULL;
                for (size_t i = 0; i < n; i++)
                    atomic_store(&list[i]->status, ST_FAILED);
            }
        }
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", rf_errmsg());
        for (size_t i = 0; i < n; i++)
            rc = close_slot(list[i], rc);
        if (rc) rf_fail(rc, "%s", keep);
        if (!rc) break;
        if (!failed || !rf_retry_transient(rc) || failed->attempts > failed->retries ||
            (r->user && *r->user))
            return rc;
        double wait = rf_retry_delay(r->retry_base, failed->attempts + 1, &r->jitter);
        rf_warn("run", "stage %s: attempt %d of %lld failed (%s); retrying in %.2fs",
                failed->ops->name, failed->attempts, (long long)failed->retries + 1, keep, wait);
        rf_retry_sleep(wait, r->user);
        if (r->user && *r->user) return rc;
        *r->cancel = 0;                /* the failure's stop, not the caller's */
        for (size_t i = 0; i < n; i++) /* a fresh start: no half-written outputs */
            for (const char *const *out = slot_outputs(list[i]); *out; out++) {
                char path[4200];
                snprintf(path, sizeof path, "%s/%s", r->ctx.run_dir, *out);
                rf_rm_tree(path);
            }
    }
    for (size_t i = 0; i < n; i++) {
        slot *s = list[i];
        record_slot(r, s, streamed);
        if (!s->tmp) continue;
        char *tmp = s->tmp;
        s->tmp = NULL;
        rc = rf_cache_commit(r->cache, s->ops->name, s->key, tmp, r->ctx.run_dir, slot_outputs(s),
                             r->ctx.stats, &s->entry);
        if (rc) return rc;
        rf_info("cache", "stage %s: stored as %s", s->ops->name, s->key);
    }
    return RF_OK;
}

/* ---- progress rows ---- */

/* The progress_field of the last line of a batch stage's progress file. */
static uint64_t file_progress(run *r, slot *s) {
    char path[4200], tail[1024];
    snprintf(path, sizeof path, "%s/%s", r->ctx.run_dir, s->info->progress_file);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = 0;
    if (fseeko(f, 0, SEEK_END) == 0) {
        off_t size = ftello(f);
        off_t at = size > (off_t)sizeof tail - 1 ? size - (off_t)sizeof tail + 1 : 0;
        if (fseeko(f, at, SEEK_SET) == 0) n = fread(tail, 1, sizeof tail - 1, f);
    }
    fclose(f);
    tail[n] = 0;
    while (n > 0 && tail[n - 1] == '\n')
        tail[--n] = 0;
    char *line = strrchr(tail, '\n');
    line = line ? line + 1 : tail;
    char field[80];
    snprintf(field, sizeof field, "\"%s\":", s->info->progress_field);
    char *at = strstr(line, field);
    return at ? strtoull(at + strlen(field), NULL, 10) : 0;
}

static size_t progress_rows(void *user, rf_prog_row *rows, size_t max) {
    run *r = user;
    size_t n = 0;
    double now = rf_now();
    for (size_t i = 0; i < r->nslots && n < max; i++) {
        slot *s = &r->slots[i];
        int st = atomic_load(&s->status);
        rf_prog_row *w = &rows[n++];
        *w = (rf_prog_row){.name = s->ops->name, .state = state_names[st]};
        w->seconds = st == ST_RUNNING ? now - s->t0 : s->seconds;
        if (i >= r->nstream && st == ST_RUNNING && s->info && s->info->progress_file) {
            w->unit = s->info->unit;
            w->count = file_progress(r, s);
            int64_t total = 0;
            if (rf_cfg_int(rf_cfg_get(r->spec, s->ops->name), s->info->total_key, 0, 0, INT64_MAX,
                           &total) == RF_OK &&
                total > 0)
                w->total = (uint64_t)total;
        }
        if (i < r->nstream && st != ST_CACHED) {
            w->unit = "docs";
            w->count = s->fed ? atomic_load(&s->docs_in) : atomic_load(&s->docs_out);
            /* the total is known once the stage before has finished */
            slot *up = NULL;
            for (size_t j = 0; j < r->nactive; j++)
                if (r->active[j] == s && j > 0) up = r->active[j - 1];
            if (up && (up->ops == &replay_ops || atomic_load(&up->status) == ST_DONE))
                w->total = atomic_load(&up->docs_out);
        }
    }
    return n;
}

/* Copies the caller's cancel flag (a signal handler's) into the run's. */
static void *relay_cancel(void *arg) {
    run *r = arg;
    while (!r->relay_done) {
        if (*r->user) *r->cancel = 1;
        rf_retry_sleep(0.05, &r->relay_done);
    }
    return NULL;
}

int rf_pipeline_run(const rf_pipeline_opts *o, char **run_dir) {
    return rf_pipeline_run_group(o, NULL, run_dir);
}

int rf_pipeline_run_group(const rf_pipeline_opts *o, rf_comm *comm, char **run_dir) {
    run *r = calloc(1, sizeof *r);
    if (!r) return RF_ERR_NOMEM;
    *run_dir = NULL;
    r->cancel = &r->stop;
    r->user = o->cancel;
    bool relaying = r->user && pthread_create(&r->relay, NULL, relay_cancel, r) == 0;
    r->stages = o->stages ? o->stages : rf_pipeline_stages();
    int rc = rf_cfg_load_file(o->spec_path, &r->spec);
    if (!rc) rc = rf_cfg_apply_env(r->spec);
    if (!rc) rc = select_stages(r);
    int64_t threads = 0, depth = 0;
    bool cache_on = true;
    const char *cache_dir = NULL;
    double backoff = 1.0;
    if (!rc) rc = rf_cfg_int(r->spec, "run.threads", rf_ncpu(), 1, 1024, &threads);
    if (!rc) rc = rf_cfg_int(r->spec, "run.queue_depth", 8, 1, 4096, &depth);
    if (!rc) rc = rf_cfg_bool(r->spec, "run.cache", true, &cache_on);
    if (!rc) rc = rf_cfg_str(r->spec, "run.cache_dir", NULL, &cache_dir);
    if (!rc) rc = rf_cfg_real(r->spec, "run.retry_backoff", 1.0, 0, 3600, &backoff);
    r->retry_base = backoff;
    r->jitter = rf_mix64((uint64_t)(rf_now() * 1e9) ^ (uint64_t)getpid());
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
    rc = setup_slots(r, threads);
    /* the cache: not under mpirun (every rank would need the same entries) */
    cache_on = cache_on && !o->no_cache && !grp;
    char *def_dir = NULL;
    if (!rc && cache_on && !cache_dir) cache_dir = def_dir = rf_cache_default_dir();
    if (!rc && cache_on && !cache_dir) {
        rf_warn("cache", "no run.cache_dir, XDG_CACHE_HOME or HOME: running without the cache");
        cache_on = false;
    }
    if (!rc && cache_on) rc = rf_cache_open(cache_dir, &r->cache);
    free(def_dir);
    for (size_t i = 0; grp && i < r->nslots; i++)
        r->slots[i].retries = 0; /* the other ranks would not try again with us */
    size_t from = r->nstream, to = r->nstream;
    const char *replay = NULL;
    if (!rc) rc = plan_cache(r, cache_on, &from, &to, &replay);
    rf_info("run", "run directory %s, %zu stages (%zu streaming), %d threads, cache %s", dir,
            r->nslots, r->nstream, (int)threads, r->cache ? rf_cache_path(r->cache) : "off");
    double t0 = rf_now();
    for (size_t i = 0; i < r->nslots && !rc; i++) {
        slot *s = &r->slots[i];
        if (!s->hit) continue;
        rc = rf_cache_reuse(s->entry, dir, slot_outputs(s), r->ctx.stats);
        if (rc) rc = rf_fail_ctx(rc, "reusing stage %s from the cache", s->ops->name);
        atomic_store(&s->status, ST_CACHED);
        rf_info("run", "stage %s: cached (%s)", s->ops->name, s->key);
    }
    /* the batch stages that will run check their settings now, not after the stream */
    for (size_t i = r->nstream; i < r->nslots && !rc; i++) {
        slot *s = &r->slots[i];
        if (s->hit) continue;
        void *state = NULL;
        rc = s->ops->open(rf_cfg_get(r->spec, s->ops->name), &s->ctx, &state);
        if (rc) rc = stage_error(rc, s->ops->name);
        if (state && s->ops->close) s->ops->close(state);
    }
    rf_progress *prog = NULL;
    if (!rc) rf_progress_start(o->progress, o->progress_every, progress_rows, r, &prog);
    if (!rc && from < to) {
        slot *list[MAX_ACTIVE];
        for (size_t i = from; i < to; i++)
            list[i - from] = &r->slots[i];
        rc = run_unit(r, list, to - from, replay, true);
    }
    for (size_t i = r->nstream; i < r->nslots && !rc; i++) {
        slot *s = &r->slots[i];
        if (s->hit) continue;
        rf_info("run", "stage %s", s->ops->name);
        bool is_trainer = grp && i == trainer_at;
        if (is_trainer) { /* the data is ready: the other ranks join */
            announced = true;
            if ((rc = group_announce(grp, RF_OK, dir))) break;
            rf_trainer_stage_set_group(grp);
        }
        rc = run_unit(r, &s, 1, NULL, false);
        if (is_trainer) rf_trainer_stage_set_group(NULL);
    }
    rf_progress_stop(prog);
    record_stats(r, rf_now() - t0);
    rf_stats_set(r->ctx.stats, "run.ok", rc == RF_OK);
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", rf_errmsg());
    int wrc = write_stats(r);
    if (rc) rf_fail(rc, "%s", keep);
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
        char keep2[1024];
        snprintf(keep2, sizeof keep2, "%s", rf_errmsg());
        group_announce(grp, rc ? rc : RF_ERR_INTERNAL, NULL);
        if (rc) rf_fail(rc, "%s", keep2);
    }
    for (size_t i = 0; i < r->nslots; i++) {
        slot *s = &r->slots[i];
        if (s->state && s->ops->close) s->ops->close(s->state);
        rf_cache_abort(s->tmp);
        free(s->entry);
        rf_buf_free(&s->line);
        if (s->info || s->outputs[0]) {
            pthread_mutex_destroy(&s->gate_lock);
            pthread_cond_destroy(&s->gate_cond);
        }
    }
    if (relaying) {
        r->relay_done = 1;
        pthread_join(r->relay, NULL);
    }
    rf_cache_close(r->cache);
    if (r->ctx.stats) rf_stats_free(r->ctx.stats);
    rf_cfg_free(r->spec);
    free(r);
    return rc;
}
