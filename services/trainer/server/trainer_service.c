/* The trainer service: intake of tokens.train, one training thread, and the
 * checkpoint exports and announcements. See trainer_service.h. */
#include "trainer/server/trainer_service.h"

#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/sys.h"
#include "refinery.pb-c.h"
#include "runtime/intake.h"
#include "runtime/svc.h"
#include "trainer/driver.h"
#include "trainer/server/group.h"

#define PATH_SIZE 4096
#define SCAN_S    1.0 /* seconds between scans for a run to train */

/* An intake file kept open for appending while its run takes batches in. */
typedef struct open_intake {
    char *run_id;
    rf_intake *in;
} open_intake;

/* One run being trained by the training thread. */
typedef struct job {
    rf_trainer_service *s;
    char run_id[128];
    char dirname[160];         /* the run's directory name under STATE and CHECKPOINTS */
    const char *model;         /* the model folder (in the spec tree, alive during the job) */
    volatile int cancel;       /* set by the service's thread: run cancelled or service stopping */
    atomic_bool run_cancelled; /* why cancel was set (before it) */
    atomic_bool done;          /* the thread has finished */
    bool trained;              /* the run reached its last step */
    pthread_t thread;
} job;

struct rf_trainer_service {
    rf_trainer_service_opts o;
    char *state_dir;       /* copies of the options' */
    char *checkpoints_dir; /* absolute */
    rf_store *train_store; /* the training thread's connection, opened by its first job */
    open_intake *intakes;
    size_t nintakes, cap_intakes;
    job *job; /* NULL when no training runs */
    double next_scan, next_cancel_poll;
    int world;                /* the group's size (1: no group) */
    atomic_bool group_failed; /* a training of the group failed: the group must restart */
};

static const char *const chain[] = {"ingest", "dedup", "tokenizer", "trainer"};

static void count(const rf_trainer_service *s, const char *name, int64_t n) {
    if (s->o.stats) rf_stats_add(s->o.stats, name, n);
}

void rf_trainer_run_dirname(const char *run_id, char *out, size_t size) {
    size_t len = strlen(run_id), i = 0;
    while (i < len && (isalnum((unsigned char)run_id[i]) || strchr("._-", run_id[i])))
        i++;
    if (len && i == len && len <= 128 && run_id[0] != '.')
        snprintf(out, size, "%s", run_id);
    else
        snprintf(out, size, "run-%016llx", (unsigned long long)rf_hash64(run_id, len, 0));
}

/* STATE/<run>/<leaf> */
static void state_path(const rf_trainer_service *s, const char *dirname, const char *leaf,
                       char *out) {
    snprintf(out, PATH_SIZE, "%s/%s/%s", s->state_dir, dirname, leaf);
}

/* ---- intake ---- */

static int intake_for(rf_trainer_service *s, const char *run_id, rf_intake **out) {
    for (size_t i = 0; i < s->nintakes; i++)
        if (!strcmp(s->intakes[i].run_id, run_id)) {
            *out = s->intakes[i].in;
            return RF_OK;
        }
    if (s->nintakes == s->cap_intakes) {
        size_t cap = s->cap_intakes ? 2 * s->cap_intakes : 8;
        open_intake *n = realloc(s->intakes, cap * sizeof *n);
        if (!n) return RF_ERR_NOMEM;
        s->intakes = n;
        s->cap_intakes = cap;
    }
    char dirname[160], path[PATH_SIZE];
    rf_trainer_run_dirname(run_id, dirname, sizeof dirname);
    state_path(s, dirname, "intake", path);
    open_intake oi = {strdup(run_id), NULL};
    int rc = oi.run_id ? rf_intake_open(path, &oi.in) : RF_ERR_NOMEM;
    if (rc) {
        free(oi.run_id);
        return rc;
    }
    s->intakes[s->nintakes++] = oi;
    *out = oi.in;
    return RF_OK;
}

static void intake_close(rf_trainer_service *s, const char *run_id) {
    for (size_t i = 0; i < s->nintakes; i++)
        if (!strcmp(s->intakes[i].run_id, run_id)) {
            rf_intake_close(s->intakes[i].in);
            free(s->intakes[i].run_id);
            s->intakes[i] = s->intakes[--s->nintakes];
            return;
        }
}

static bool kept(const Refinery__V1__TokenSequence *q) {
    return q->n_ids > 0 && q->label >= 0;
}

int rf_trainer_service_process(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                               rf_kafka_tracker *t, rf_store_counts *counts) {
    rf_trainer_service *s = user;
    Refinery__V1__TokenBatch *b =
        refinery__v1__token_batch__unpack(NULL, m->len, (const uint8_t *)m->value);
    if (!b)
        return rf_fail(RF_ERR_PARSE, "trainer: batch %s/%" PRIu64 " is not a TokenBatch",
                       id->run_id, id->seq);
    rf_intake *in;
    int rc = intake_for(s, b->run_id, &in);
    if (!rc) rc = rf_intake_append(in, b);
    if (!rc) {
        int64_t n = 0;
        for (size_t i = 0; i < b->n_seqs; i++)
            n += kept(b->seqs[i]);
        *counts = (rf_store_counts){
            .in = (int64_t)b->n_seqs, .out = n, .rejected = (int64_t)b->n_seqs - n};
    }
    refinery__v1__token_batch__free_unpacked(b, NULL);
    return rc;
}

/* ---- checkpoints (training thread) ---- */

static int announce(rf_trainer_service *s, const job *j, const rf_train_checkpoint *c,
                    const char *path) {
    Refinery__V1__CheckpointAnnounce a = REFINERY__V1__CHECKPOINT_ANNOUNCE__INIT;
    a.run_id = (char *)j->run_id;
    a.step = c->step;
    a.path = (char *)path;
    a.final = c->step == c->total;
    a.train_loss = c->loss;
    size_t len = refinery__v1__checkpoint_announce__get_packed_size(&a);
    uint8_t *buf = malloc(len + 1);
    if (!buf) return RF_ERR_NOMEM;
    refinery__v1__checkpoint_announce__pack(&a, buf);
    rf_kafka_tracker t = {0};
    int rc = rf_kafka_produce_tracked(s->o.producer, &t, s->o.topic_checkpoints, j->run_id,
                                      strlen(j->run_id), buf, len);
    /* Wait even after a failed produce: t must outlive what was queued. */
    int delivered = rf_kafka_wait(s->o.producer, &t,
                                  s->o.delivery_timeout_s > 0 ? s->o.delivery_timeout_s : 30);
    free(buf);
    return rc ? rc : delivered;
}

static int on_checkpoint(void *user, const rf_bert *m, const rf_train_checkpoint *c) {
    job *j = user;
    rf_trainer_service *s = j->s;
    char path[PATH_SIZE];
    snprintf(path, sizeof path, "%s/%s/step-%ld", s->checkpoints_dir, j->dirname, c->step);
    int rc = rf_export_hf(m, j->model, path);
    if (!rc) rc = rf_store_checkpoint_add(s->train_store, j->run_id, c->step, path, c->loss);
    if (!rc) rc = rf_store_metric_add(s->train_store, j->run_id, c->step, "loss", c->loss);
    if (!rc) rc = rf_store_metric_add(s->train_store, j->run_id, c->step, "lr", c->lr);
    if (!rc)
        rc = rf_store_metric_add(s->train_store, j->run_id, c->step, "tokens_per_s",
                                 c->tokens_per_s);
    if (!rc) rc = announce(s, j, c, path);
    if (rc) return rf_fail_ctx(rc, "checkpoint at step %ld", c->step);
    count(s, "trainer.checkpoints", 1);
    rf_info("trainer", "run %s: checkpoint step %ld/%ld loss %.4f lr %.3g %.0f tokens/s -> %s%s",
            j->run_id, c->step, c->total, c->loss, c->lr, c->tokens_per_s, path,
            c->step == c->total ? " (final)" : "");
    return RF_OK;
}

/* ---- training (training thread) ---- */

/* The run's spec, parsed; `model` defaults to the service's. */
/* The run's spec, parsed (group.h: `model` defaults to the service's, and
 * parallel.dp to the group's size); *text (the caller frees it) is the spec
 * as stored, which a group sends to its other ranks. */
static int load_spec(rf_trainer_service *s, const char *run_id, rf_cfg **root,
                     rf_trainer_spec *spec, char **text) {
    int rc = rf_store_run_spec(s->train_store, run_id, text);
    if (rc) return rf_fail_ctx(rc, "reading the spec");
    return rf_tgroup_parse_spec(*text, run_id, s->o.model, s->world, root, spec);
}

/* The intake's sequences with a label, checked against the progress rows:
 * every kept sequence recorded there must be in the file. */
static int load_data(rf_trainer_service *s, const job *j, int max_len, rf_dataset *data) {
    char path[PATH_SIZE];
    state_path(s, j->dirname, "intake", path);
    rf_dataset all = {0};
    rf_intake_info info;
    rf_store_counts rows;
    int rc = rf_intake_load(path, j->run_id, max_len, &all, &info);
    if (rc == RF_ERR_NOT_FOUND) rc = rf_fail(rc, "no training data: no batch of the run arrived");
    if (!rc) rc = rf_store_progress_total(s->train_store, j->run_id, "trainer", &rows);
    for (size_t i = 0; i < all.n && !rc; i++)
        if (all.label[i] >= 0)
            rc = rf_dataset_add(data, all.tokens + all.start[i], all.len[i], all.label[i]);
    if (!rc && ((int64_t)data->n != rows.out || (int64_t)info.batches < rows.batches))
        rc = rf_fail(RF_ERR_CORRUPT,
                     "intake %s holds %zu labelled sequences in %" PRIu64
                     " batches, but %lld in %lld batches were recorded as taken in (a different "
                     "--state directory?)",
                     path, data->n, info.batches, (long long)rows.out, (long long)rows.batches);
    if (!rc && data->n == 0) rc = rf_fail(RF_ERR_INVALID, "no labelled training sequences");
    if (!rc)
        rf_info("trainer",
                "run %s: %zu training sequences from %" PRIu64 " batches (%" PRIu64
                " replayed records, %zu without label or ids skipped)",
                j->run_id, data->n, info.batches, info.replays, all.n - data->n + all.skipped);
    rf_dataset_free(&all);
    return rc;
}

static int write_marker(const rf_trainer_service *s, const job *j, const rf_train_result *r) {
    char path[PATH_SIZE];
    rf_buf b = RF_BUF_INIT;
    state_path(s, j->dirname, "trained", path);
    int rc = rf_buf_printf(&b, "{\"run_id\":\"%s\",\"steps\":%ld,\"last_loss\":%.6f}\n", j->dirname,
                           r->steps, r->last_loss);
    if (!rc) rc = rf_write_file_atomic(path, b.data, b.len);
    rf_buf_free(&b);
    return rc;
}

/* The run's intake through the trainer driver (trainer/driver.h), which
 * checks labels and vocabulary, loads the model and trains; the checkpoints
 * go to on_checkpoint (the final one included), not to an export folder. */
static int train_run(job *j) {
    rf_trainer_service *s = j->s;
    rf_cfg *root = NULL;
    rf_trainer_spec spec;
    rf_dataset data = {0};
    char path[PATH_SIZE], *text = NULL;
    int max_len = 0;
    int rc = load_spec(s, j->run_id, &root, &spec, &text);
    if (!rc) {
        j->model = spec.model;
        rc = rf_trainer_max_len(spec.model, spec.max_len, &max_len);
    }
    if (!rc) rc = load_data(s, j, max_len, &data);
    rf_train_result res = {0};
    if (!rc && s->world > 1) {
        /* the group (group.h): every rank gets the run and checks it; none
         * trains unless all can */
        bool all_ok = false;
        int local = rf_trainer_check(&spec, &data, s->o.comm);
        char why[512];
        snprintf(why, sizeof why, "%s", local ? rf_errmsg() : "");
        rc = rf_tgroup_send_job(s->o.comm, j->run_id, text, &data, local, &all_ok);
        if (rc) {
            atomic_store(&s->group_failed, true);
            rf_fail_ctx(rc, "sending the run to the group");
        } else if (!all_ok) {
            rc = local ? rf_fail(local, "%s", why)
                       : rf_fail(RF_ERR_INVALID,
                                 "another rank of the trainer group could not prepare the run "
                                 "(see its log)");
        }
    }
    if (!rc) {
        state_path(s, j->dirname, "train", path);
        spec.threads = s->o.threads > 0 ? s->o.threads : spec.threads > 0 ? spec.threads : 1;
        spec.export_dir = NULL; /* the checkpoints are the service's exports */
        spec.opts.out_dir = path;
        spec.opts.resume = true; /* a restarted service continues where it stopped */
        rf_trainer_hooks h = {.cancel = &j->cancel,
                              .on_checkpoint = on_checkpoint,
                              .user = j,
                              .comm = s->world > 1 ? s->o.comm : NULL};
        rc = rf_trainer_drive(&spec, &data, &h, &res);
        /* in a group, the other ranks may be inside a collective that this
         * rank will never join: only a restart of the whole group is safe */
        if (rc && s->world > 1) atomic_store(&s->group_failed, true);
    }
    if (!rc && res.finished) {
        rc = write_marker(s, j, &res);
        j->trained = !rc;
    }
    if (!rc && !res.finished)
        rf_info("trainer", "run %s: stopped at step %ld (%s); state kept", j->run_id, res.steps,
                atomic_load(&j->run_cancelled) ? "run no longer running" : "service stopping");
    rf_dataset_free(&data);
    rf_cfg_free(root);
    free(text);
    return rc;
}

static void *train_thread(void *arg) {
    job *j = arg;
    rf_trainer_service *s = j->s;
    rf_info("trainer", "run %s: intake complete, training", j->run_id);
    rf_store_opts sto = {.conninfo = s->o.pg};
    int rc = s->train_store ? RF_OK : rf_store_open(&sto, &s->train_store);
    if (!rc) rc = train_run(j);
    if (rc && s->world > 1 && rf_comm_broken(s->o.comm)) {
        /* the group failed (a rank died or went silent), not the run: it
         * stays running and resumes from its last checkpoint when the group
         * is restarted */
        rf_error("trainer",
                 "run %s: the trainer group failed: %s; the run resumes when the group "
                 "restarts",
                 j->run_id, rf_errmsg());
    } else if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "trainer: %s", rf_errmsg());
        rf_error("trainer", "run %s failed: %s", j->run_id, msg);
        count(s, "trainer.runs_failed", 1);
        if (!s->train_store ||
            rf_store_run_set_state(s->train_store, j->run_id, RF_RUN_FAILED, msg) < 0)
            rf_error("trainer", "run %s: cannot record the failure: %s", j->run_id, rf_errmsg());
    } else if (j->trained) {
        rf_info("trainer", "run %s: trained", j->run_id);
        count(s, "trainer.runs_trained", 1);
    }
    atomic_store(&j->done, true);
    return NULL;
}

/* ---- the service's thread ---- */

int rf_trainer_service_new(const rf_trainer_service_opts *o, rf_trainer_service **out) {
    rf_trainer_service *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->o = *o;
    s->world = o->comm ? rf_comm_world(o->comm) : 1;
    atomic_init(&s->group_failed, false);
    int rc = rf_mkdir_p(o->state_dir);
    if (rc) rf_fail_ctx(rc, "--state %s", o->state_dir);
    if (!rc && (rc = rf_mkdir_p(o->checkpoints_dir)))
        rf_fail_ctx(rc, "--checkpoints %s", o->checkpoints_dir);
    if (!rc && !(s->state_dir = strdup(o->state_dir))) rc = RF_ERR_NOMEM;
    if (!rc && !(s->checkpoints_dir = realpath(o->checkpoints_dir, NULL)))
        rc = rf_fail(RF_ERR_IO, "--checkpoints %s: cannot resolve", o->checkpoints_dir);
    if (rc) {
        rf_trainer_service_free(s);
        return rc;
    }
    *out = s;
    return RF_OK;
}

/* Joins the finished training thread and forgets the job; the run's intake
 * is closed (a late batch would open it again). */
static void reap(rf_trainer_service *s) {
    job *j = s->job;
    pthread_join(j->thread, NULL);
    intake_close(s, j->run_id);
    free(j);
    s->job = NULL;
}

void rf_trainer_service_free(rf_trainer_service *s) {
    if (!s) return;
    if (s->job) {
        s->job->cancel = 1;
        reap(s);
    }
    for (size_t i = 0; i < s->nintakes; i++) {
        rf_intake_close(s->intakes[i].in);
        free(s->intakes[i].run_id);
    }
    free(s->intakes);
    rf_store_close(s->train_store);
    free(s->checkpoints_dir);
    free(s->state_dir);
    free(s);
}

static int start(rf_trainer_service *s, const char *run_id, const char *dirname) {
    job *j = calloc(1, sizeof *j);
    if (!j) return RF_ERR_NOMEM;
    j->s = s;
    snprintf(j->run_id, sizeof j->run_id, "%s", run_id);
    snprintf(j->dirname, sizeof j->dirname, "%s", dirname);
    atomic_init(&j->done, false);
    atomic_init(&j->run_cancelled, false);
    if (pthread_create(&j->thread, NULL, train_thread, j)) {
        free(j);
        return rf_fail(RF_ERR_INTERNAL, "trainer: cannot start a training thread");
    }
    s->job = j;
    s->next_cancel_poll = rf_now() + (s->o.cancel_poll_s > 0 ? s->o.cancel_poll_s : 2);
    return RF_OK;
}

/* Starts the oldest running, sealed run that is not trained here yet and
 * whose trainer intake is complete. */
static int scan(rf_trainer_service *s) {
    PGresult *r;
    int rc = rf_store_exec(s->o.store,
                           "SELECT id FROM runs WHERE state = 'running' AND sealed_at IS NOT NULL"
                           " ORDER BY created_at, id",
                           0, NULL, &r);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r) && !rc && !s->job; i++) {
        const char *run_id = PQgetvalue(r, i, 0);
        char dirname[160], marker[PATH_SIZE];
        struct stat sb;
        bool complete;
        rf_trainer_run_dirname(run_id, dirname, sizeof dirname);
        state_path(s, dirname, "trained", marker);
        if (stat(marker, &sb) == 0) continue;
        rc = rf_store_stage_complete(s->o.store, run_id, chain, 4, &complete);
        if (!rc && complete) rc = start(s, run_id, dirname);
    }
    PQclear(r);
    return rc;
}

/* Stops the training when its run is no longer running (cancelled, or
 * ended by someone else). */
static int poll_cancel(rf_trainer_service *s) {
    rf_store_run run;
    int rc = rf_store_run_get(s->o.store, s->job->run_id, &run);
    if (rc == RF_OK && run.state != RF_RUN_RUNNING && !s->job->cancel) {
        rf_info("trainer", "run %s is %s: stopping its training", run.id,
                rf_run_state_name(run.state));
        atomic_store(&s->job->run_cancelled, true);
        s->job->cancel = 1;
    }
    return rc == RF_ERR_NOT_FOUND ? RF_OK : rc;
}

int rf_trainer_service_tick(rf_trainer_service *s) {
    double now = rf_now();
    int rc = RF_OK;
    if (s->job && atomic_load(&s->job->done)) reap(s);
    if (atomic_load(&s->group_failed))
        return rf_fail(RF_ERR_IO, "the trainer group failed (see above): exiting so that the "
                                  "whole group restarts and resumes from the last checkpoint");
    if (s->job && now >= s->next_cancel_poll) {
        s->next_cancel_poll = now + (s->o.cancel_poll_s > 0 ? s->o.cancel_poll_s : 2);
        rc = poll_cancel(s);
    }
    if (!rc && !s->job && now >= s->next_scan) {
        s->next_scan = now + SCAN_S;
        bool stop = false;
        /* the group's heartbeat: the service's thread owns the communicator
         * only while no training runs */
        if (s->world > 1 && (rc = rf_tgroup_heartbeat(s->o.comm, rf_svc_stopping(), &stop))) {
            atomic_store(&s->group_failed, true);
            return rf_fail_ctx(rc, "trainer group heartbeat");
        }
        if (stop) {
            rf_info("trainer", "group: a rank is stopping: the group stops");
            rf_svc_request_stop();
            return RF_OK;
        }
        rc = scan(s);
    }
    return rc;
}

bool rf_trainer_service_group_ok(const rf_trainer_service *s) {
    return !s || !atomic_load(&s->group_failed);
}
