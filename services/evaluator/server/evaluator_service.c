#include "evaluator/server/evaluator_service.h"

#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/utf8.h"
#include "common/obs.h"
#include "evaluator/evaluate.h"
#include "refinery.pb-c.h"
#include "evaluator/classifier.h"
#include "evaluator/generate.h"
#include "evaluator/lm.h"
#include "runtime/intake.h"
#include "runtime/svc.h"

#define OPEN_INTAKES 8 /* intake files kept open by the consume thread */

typedef struct open_intake {
    char run_id[128];
    rf_intake *in;
    uint64_t used;
} open_intake;

struct rf_evaluator_service {
    rf_evaluator_service_opts o;
    rf_stats *stats;
    /* intake: the stage loop's thread only */
    open_intake intakes[OPEN_INTAKES];
    uint64_t tick;
    /* Classify: any worker */
    pthread_mutex_t store_lock;
    rf_store *store;
    rf_classifier_cache *cache;
    /* Generate: any worker */
    rf_lm_cache *lms;
};

int rf_evaluator_service_new(const rf_evaluator_service_opts *o, rf_evaluator_service **out) {
    rf_evaluator_service *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->o = *o;
    if (!s->o.max_len) s->o.max_len = 128;
    if (!s->o.batch_size) s->o.batch_size = 32;
    if (!s->o.max_texts) s->o.max_texts = 256;
    if (!s->o.cache) s->o.cache = 2;
    if (!(s->o.poll_s > 0)) s->o.poll_s = 0.5;
    if (s->o.max_new_tokens <= 0) s->o.max_new_tokens = 512;
    if (s->o.lm_cache <= 0) s->o.lm_cache = 1;
    pthread_mutex_init(&s->store_lock, NULL);
    int rc = (s->stats = rf_stats_new()) ? RF_OK : RF_ERR_NOMEM;
    if (!rc) rc = rf_classifier_cache_new(s->o.cache, s->o.max_len, &s->cache);
    if (!rc) rc = rf_lm_cache_new(s->o.lm_cache, &s->lms);
    if (!rc && o->pg) {
        rf_store_opts so = {.conninfo = o->pg};
        rc = rf_store_open(&so, &s->store);
    }
    if (rc) {
        rf_evaluator_service_free(s);
        return rc;
    }
    *out = s;
    return RF_OK;
}

void rf_evaluator_service_free(rf_evaluator_service *s) {
    if (!s) return;
    for (int i = 0; i < OPEN_INTAKES; i++)
        rf_intake_close(s->intakes[i].in);
    rf_classifier_cache_free(s->cache);
    rf_lm_cache_free(s->lms);
    rf_store_close(s->store);
    pthread_mutex_destroy(&s->store_lock);
    rf_stats_free(s->stats);
    free(s);
}

rf_stats *rf_evaluator_service_stats(rf_evaluator_service *s) {
    return s->stats;
}

/* STATE/<run dir>/eval.intake; the run dir is the run id when it is made of
 * [A-Za-z0-9._-] (not starting with '.'), else "run-" and a hash (records
 * carry the id, so a collision would be detected when loading). */
static void intake_path(const rf_evaluator_service *s, const char *run_id, char *out, size_t size) {
    size_t len = strlen(run_id), i = 0;
    while (i < len && (isalnum((unsigned char)run_id[i]) || strchr("._-", run_id[i])))
        i++;
    if (len && i == len && run_id[0] != '.')
        snprintf(out, size, "%s/%s/eval.intake", s->o.state_dir, run_id);
    else
        snprintf(out, size, "%s/run-%016" PRIx64 "/eval.intake", s->o.state_dir,
                 rf_hash64(run_id, len, 0));
}

/* ---- intake ---- */

/* The open intake of run_id, opening it (and closing the least recently
 * used one) when needed. */
static int intake_for(rf_evaluator_service *s, const char *run_id, rf_intake **out) {
    open_intake *slot = &s->intakes[0];
    for (int i = 0; i < OPEN_INTAKES; i++) {
        open_intake *e = &s->intakes[i];
        if (e->in && !strcmp(e->run_id, run_id)) {
            e->used = ++s->tick;
            *out = e->in;
            return RF_OK;
        }
        if (!e->in || (slot->in && e->used < slot->used)) slot = e;
    }
    char path[4096];
    intake_path(s, run_id, path, sizeof path);
    rf_intake_close(slot->in);
    memset(slot, 0, sizeof *slot);
    int rc = rf_intake_open(path, &slot->in);
    if (rc) return rc;
    snprintf(slot->run_id, sizeof slot->run_id, "%s", run_id);
    slot->used = ++s->tick;
    *out = slot->in;
    return RF_OK;
}

int rf_evaluator_service_intake(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                                rf_kafka_tracker *t, rf_store_counts *counts) {
    rf_evaluator_service *s = user;
    Refinery__V1__TokenBatch *b =
        refinery__v1__token_batch__unpack(NULL, m->len, (const uint8_t *)m->value);
    if (!b) {
        rf_warn("evaluator", "run %s batch %" PRIu64 ": not a TokenBatch; recorded as rejected",
                id->run_id, id->seq);
        *counts = (rf_store_counts){.rejected = 1};
        rf_stats_add(s->stats, "evaluator.intake.bad_batches", 1);
        return RF_OK;
    }
    rf_intake *in;
    int rc = intake_for(s, b->run_id, &in);
    if (!rc) rc = rf_intake_append(in, b);
    if (!rc) {
        *counts = (rf_store_counts){.in = (int64_t)b->n_seqs, .out = (int64_t)b->n_seqs};
        rf_stats_add(s->stats, "evaluator.intake.sequences", (int64_t)b->n_seqs);
    }
    refinery__v1__token_batch__free_unpacked(b, NULL);
    return rc;
}

/* ---- checkpoints ---- */

static const char *const eval_chain[] = {"ingest", "dedup", "tokenizer", "evaluator"};

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Writes every metric of mt for (run, step); n last (it marks "done"). */
static int write_metrics(rf_store *store, const char *run, int64_t step, const rf_metrics *mt) {
    rf_class_scores macro = rf_metrics_macro(mt);
    struct {
        const char *name;
        double v;
    } top[] = {{"accuracy", rf_metrics_accuracy(mt)},
               {"loss", rf_metrics_loss(mt)},
               {"macro_precision", macro.precision},
               {"macro_recall", macro.recall},
               {"macro_f1", macro.f1}};
    int rc = RF_OK;
    for (size_t i = 0; i < sizeof top / sizeof top[0] && !rc; i++)
        rc = rf_store_eval_add(store, run, step, top[i].name, top[i].v);
    for (int c = 0; c < mt->k && !rc; c++) {
        rf_class_scores cs = rf_metrics_class(mt, c);
        const char *names[] = {"precision", "recall", "f1", "support"};
        double v[] = {cs.precision, cs.recall, cs.f1, (double)cs.support};
        for (int j = 0; j < 4 && !rc; j++) {
            char name[64];
            snprintf(name, sizeof name, "%s.%d", names[j], c);
            rc = rf_store_eval_add(store, run, step, name, v[j]);
        }
    }
    if (!rc) rc = rf_store_eval_add(store, run, step, "n", (double)mt->n);
    return rc;
}

/* max_len and batch_size of the run's `evaluator:` section (as `refinery run`
 * reads them), the service's options where the spec has none. */
static int spec_opts(rf_evaluator_service *s, rf_store *store, const char *run, int *max_len,
                     int *batch) {
    char *spec = NULL;
    rf_cfg *root = NULL;
    int64_t ml = s->o.max_len, bs = s->o.batch_size;
    int rc = rf_store_run_spec(store, run, &spec);
    if (rc) return rc;
    if (rf_cfg_load_string(spec, strlen(spec), "spec", &root) != RF_OK) {
        rf_warn("evaluator", "run %s: spec does not parse (%s); using max_len %d, batch_size %d",
                run, rf_errmsg(), s->o.max_len, s->o.batch_size);
    } else {
        const rf_cfg *sec = rf_cfg_get(root, "evaluator");
        if (rf_cfg_int(sec, "max_len", ml, 2, 65536, &ml) ||
            rf_cfg_int(sec, "batch_size", bs, 1, 4096, &bs)) {
            rf_warn("evaluator", "run %s: %s; using max_len %d, batch_size %d", run, rf_errmsg(),
                    s->o.max_len, s->o.batch_size);
            ml = s->o.max_len;
            bs = s->o.batch_size;
        }
    }
    *max_len = (int)ml;
    *batch = (int)bs;
    rf_cfg_free(root);
    free(spec);
    return RF_OK;
}

/* The run's eval intake as the evaluator driver's data. */
typedef struct intake_src {
    const char *path, *run;
    rf_intake_info info;
} intake_src;

static int load_intake(void *user, int max_len, rf_dataset *d) {
    intake_src *src = user;
    int rc = rf_intake_load(src->path, src->run, max_len, d, &src->info);
    if (rc == RF_ERR_NOT_FOUND) return RF_OK; /* no eval batch ever came: an empty split */
    return rc ? rf_fail_ctx(rc, "eval intake") : RF_OK;
}

/* Evaluates the folder on the run's intake through the evaluator driver
 * (rf_evaluate_model, as `refinery run` and `refinery eval`). RF_OK with
 * *why empty on success; a problem of the data or folder is returned in why
 * (the run fails), a store error as the result. */
static int evaluate(rf_evaluator_service *s, rf_store *store, const char *run, int64_t step,
                    const char *dir, char *why, size_t why_size) {
    char path[4096];
    intake_path(s, run, path, sizeof path);
    rf_dataset d = {0};
    rf_metrics mt = {0};
    intake_src src = {path, run, {0}};
    int max_len, batch, store_rc = spec_opts(s, store, run, &max_len, &batch);
    if (store_rc) return store_rc;
    int rc = rf_evaluate_model(dir, max_len, batch, load_intake, &src, NULL, &d, &mt);
    if (rc) {
        snprintf(why, why_size, "%s", rf_errmsg()); /* names the folder or the intake */
    } else if (mt.n == 0) {
        rf_warn("evaluator",
                "run %s checkpoint %" PRId64 ": the eval split has no labelled sequences "
                "(%" PRIu64 " sequences in %" PRIu64 " batches): recording n = 0, no metrics",
                run, step, src.info.sequences, src.info.batches);
        store_rc = rf_store_eval_add(store, run, step, "n", 0);
    } else {
        store_rc = write_metrics(store, run, step, &mt);
        rf_obs_eval_done(rf_metrics_accuracy(&mt), rf_metrics_macro(&mt).f1, (double)mt.n);
        rf_info("evaluator",
                "run %s checkpoint %" PRId64 ": accuracy %.4f macro-F1 %.4f loss %.4f on %" PRIu64
                " sequences (%" PRIu64 " batches, %" PRIu64 " replays ignored)",
                run, step, rf_metrics_accuracy(&mt), rf_metrics_macro(&mt).f1, rf_metrics_loss(&mt),
                mt.n, src.info.batches, src.info.replays);
    }
    rf_metrics_free(&mt);
    rf_dataset_free(&d);
    return store_rc;
}

/* Waits until the run's eval intake is complete: *go = false when the run
 * was cancelled or failed meanwhile. */
static int wait_complete(rf_evaluator_service *s, rf_store *store, const char *run, int64_t step,
                         bool *go) {
    bool logged = false;
    for (;;) {
        rf_store_run r;
        bool complete;
        int rc = rf_store_run_get(store, run, &r);
        if (rc) return rc;
        if (r.state == RF_RUN_CANCELLED || r.state == RF_RUN_FAILED) {
            rf_info("evaluator", "run %s is %s: checkpoint %" PRId64 " not evaluated", run,
                    rf_run_state_name(r.state), step);
            *go = false;
            return RF_OK;
        }
        rc = rf_store_stage_complete(store, run, eval_chain, 4, &complete);
        if (rc) return rc;
        if (complete) {
            *go = true;
            return RF_OK;
        }
        if (!logged)
            rf_info("evaluator", "run %s checkpoint %" PRId64 ": waiting for its eval intake", run,
                    step);
        logged = true;
        if (rf_svc_stopping()) return rf_fail(RF_ERR_CANCELED, "stopping");
        sleep_s(s->o.poll_s);
    }
}

static int handle(rf_evaluator_service *s, rf_store *store,
                  const Refinery__V1__CheckpointAnnounce *a) {
    const char *run = a->run_id;
    rf_store_run r;
    int rc = rf_store_run_get(store, run, &r);
    if (rc == RF_ERR_NOT_FOUND) {
        rf_warn("evaluator", "checkpoint %" PRId64 " of unknown run '%s': skipped", a->step, run);
        rf_stats_add(s->stats, "evaluator.checkpoints.skipped", 1);
        return RF_OK;
    }
    if (rc) return rc;
    /* The trainer records it before announcing; recording it again is a no-op,
     * and eval_results need the row. */
    if ((rc = rf_store_checkpoint_add(store, run, a->step, a->path, a->train_loss))) return rc;
    double n;
    rc = rf_store_eval_get(store, run, a->step, "n", &n);
    bool done = rc == RF_OK;
    if (rc && rc != RF_ERR_NOT_FOUND) return rc;
    bool go = false;
    if (!done && (rc = wait_complete(s, store, run, a->step, &go))) return rc;
    if (!done && !go) {
        rf_stats_add(s->stats, "evaluator.checkpoints.skipped", 1);
        return RF_OK;
    }
    char why[1024] = "";
    if (done)
        rf_info("evaluator", "run %s checkpoint %" PRId64 " already evaluated", run, a->step);
    else if ((rc = evaluate(s, store, run, a->step, a->path, why, sizeof why)))
        return rc;
    if (why[0]) {
        rf_error("evaluator", "run %s checkpoint %" PRId64 ": %s: run failed", run, a->step, why);
        rf_stats_add(s->stats, "evaluator.checkpoints.failed", 1);
        char msg[1100];
        snprintf(msg, sizeof msg, "evaluator: checkpoint %" PRId64 ": %s", a->step, why);
        return rf_store_run_set_state(store, run, RF_RUN_FAILED, msg);
    }
    if (!done) rf_stats_add(s->stats, "evaluator.checkpoints.evaluated", 1);
    if (!a->final) return RF_OK;
    if ((rc = rf_store_run_get(store, run, &r))) return rc;
    if (r.state != RF_RUN_PENDING && r.state != RF_RUN_RUNNING) return RF_OK;
    rf_info("evaluator", "run %s: final checkpoint %" PRId64 " evaluated: succeeded", run, a->step);
    return rf_store_run_set_state(store, run, RF_RUN_SUCCEEDED, NULL);
}

int rf_evaluator_service_checkpoint(rf_evaluator_service *s, rf_store *store, const uint8_t *msg,
                                    size_t len) {
    Refinery__V1__CheckpointAnnounce *a = refinery__v1__checkpoint_announce__unpack(NULL, len, msg);
    if (!a || !a->run_id[0] || a->step < 0 || !a->path[0]) {
        rf_warn("evaluator", "a message on the checkpoints topic is not a valid "
                             "CheckpointAnnounce (run id, step >= 0, path): skipped");
        rf_stats_add(s->stats, "evaluator.checkpoints.bad", 1);
        if (a) refinery__v1__checkpoint_announce__free_unpacked(a, NULL);
        return RF_OK;
    }
    int rc = handle(s, store, a);
    refinery__v1__checkpoint_announce__free_unpacked(a, NULL);
    return rc;
}

int rf_evaluator_checkpoint_loop(rf_evaluator_service *s, rf_kafka_consumer *c, rf_store *store) {
    while (!rf_svc_stopping()) {
        rf_kafka_batch b;
        int rc = rf_kafka_poll_batch(c, 1, 0.5, &b);
        if (rc < 0) return rc;
        for (size_t i = 0; i < b.n; i++) {
            while ((rc = rf_evaluator_service_checkpoint(s, store, b.msgs[i].value,
                                                         b.msgs[i].len)) < 0 &&
                   rc != RF_ERR_CANCELED && !rf_svc_stopping()) {
                rf_error("evaluator", "checkpoint announcement: %s; retrying", rf_errmsg());
                sleep_s(1);
            }
            if (rc < 0) break;
        }
        if (rc == RF_OK && b.n) rc = rf_kafka_commit_batch(c, &b);
        if (rc == RF_OK) rf_kafka_consumer_observe_lag(c, "evaluator_checkpoints", &b);
        rf_kafka_batch_release(&b);
        if (rc == RF_ERR_CANCELED) return RF_OK;
        if (rc < 0 && !rf_svc_stopping()) return rc;
    }
    return RF_OK;
}

/* ---- gRPC ---- */

/* The checkpoint folder Classify uses, or a failed status. */
static grpc_status_code find_checkpoint(rf_evaluator_service *s, rf_rpc_call *call, const char *run,
                                        int64_t *step, char *path, size_t path_size) {
    if (!s->store) return rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "no PostgreSQL configured");
    grpc_status_code code = GRPC_STATUS_OK;
    pthread_mutex_lock(&s->store_lock);
    rf_store_run r;
    int rc = rf_store_run_get(s->store, run, &r);
    if (rc == RF_ERR_NOT_FOUND) {
        code = rf_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "unknown run '%s'", run);
    } else if (rc) {
        code = rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "store: %s", rf_errmsg());
    } else if (*step <= 0) {
        rc = rf_store_checkpoint_latest(s->store, run, step, path, path_size);
        if (rc == RF_ERR_NOT_FOUND)
            code = rf_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                               "run '%s' has no checkpoint yet", run);
        else if (rc)
            code = rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "store: %s", rf_errmsg());
    } else {
        char st[24];
        snprintf(st, sizeof st, "%" PRId64, *step);
        const char *p[] = {run, st};
        PGresult *res = NULL;
        rc = rf_store_exec(s->store, "SELECT path FROM checkpoints WHERE run_id = $1 AND step = $2",
                           2, p, &res);
        if (rc)
            code = rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "store: %s", rf_errmsg());
        else if (PQntuples(res) != 1)
            code = rf_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "run '%s' has no checkpoint %" PRId64,
                               run, *step);
        else
            snprintf(path, path_size, "%s", PQgetvalue(res, 0, 0));
        PQclear(res);
    }
    pthread_mutex_unlock(&s->store_lock);
    return code;
}

static grpc_status_code classify(rf_rpc_call *call, const ProtobufCMessage *msg, void *user) {
    rf_evaluator_service *s = user;
    const Refinery__V1__ClassifyRequest *req = (const Refinery__V1__ClassifyRequest *)msg;
    if (!req->run_id[0]) return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "run_id is empty");
    if (req->n_texts > (size_t)s->o.max_texts)
        return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "%zu texts in one request; at most %d", req->n_texts, s->o.max_texts);
    for (size_t i = 0; i < req->n_texts; i++) {
        size_t len = strlen(req->texts[i]);
        if (!rf_utf8_valid(req->texts[i], len))
            return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                               "texts[%zu] is not valid UTF-8 (first bad byte at %zu)", i,
                               rf_utf8_first_invalid(req->texts[i], len));
    }
    int64_t step = req->checkpoint_step;
    char path[4096];
    grpc_status_code code = find_checkpoint(s, call, req->run_id, &step, path, sizeof path);
    if (code != GRPC_STATUS_OK) return code;
    rf_classifier *c = NULL;
    if (rf_classifier_cache_get(s->cache, path, &c))
        return rf_rpc_fail(call, GRPC_STATUS_INTERNAL, "checkpoint %" PRId64 " of run '%s': %s",
                           step, req->run_id, rf_errmsg());
    size_t n = req->n_texts, K = (size_t)rf_classifier_num_labels(c);
    int32_t *labels = malloc(n * sizeof *labels + 1);
    float *probs = malloc(n * K * sizeof *probs + 1);
    Refinery__V1__Prediction *preds = calloc(n + 1, sizeof *preds);
    Refinery__V1__Prediction **ptrs = calloc(n + 1, sizeof *ptrs);
    if (!labels || !probs || !preds || !ptrs)
        code = rf_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "no memory");
    else if (rf_classifier_run(c, (const char *const *)req->texts, n, s->o.batch_size, labels,
                               probs))
        code = rf_rpc_fail(call, GRPC_STATUS_INTERNAL, "checkpoint %" PRId64 " of run '%s': %s",
                           step, req->run_id, rf_errmsg());
    rf_classifier_cache_release(s->cache, c);
    if (code == GRPC_STATUS_OK) {
        for (size_t i = 0; i < n; i++) {
            refinery__v1__prediction__init(&preds[i]);
            preds[i].label = labels[i];
            preds[i].probs = probs + i * K;
            preds[i].n_probs = K;
            ptrs[i] = &preds[i];
        }
        Refinery__V1__ClassifyResponse resp = REFINERY__V1__CLASSIFY_RESPONSE__INIT;
        resp.run_id = req->run_id;
        resp.checkpoint_step = step;
        resp.predictions = ptrs;
        resp.n_predictions = n;
        if (rf_rpc_send(call, &resp.base) < 0) code = rf_rpc_call_status(call);
    }
    free(labels);
    free(probs);
    free(preds);
    free(ptrs);
    return code;
}

/* ---- Generate ---- */

typedef struct gen_stream {
    rf_rpc_call *call;
    int index, prompt_tokens;
} gen_stream;

/* Sends one token (the last with its finish reason). */
static int send_token(void *user, int32_t id, const char *piece, size_t len, const char *finish) {
    gen_stream *g = user;
    if (rf_rpc_call_done(g->call)) return RF_ERR_CANCELED;
    char *text = strndup(piece, len);
    if (!text) return RF_ERR_NOMEM;
    Refinery__V1__GeneratedToken t = REFINERY__V1__GENERATED_TOKEN__INIT;
    t.id = id;
    t.text = text;
    t.index = g->index;
    if (g->index == 0) t.prompt_tokens = g->prompt_tokens;
    t.finish = (char *)(finish ? finish : "");
    int rc = rf_rpc_send(g->call, &t.base) < 0 ? RF_ERR_CANCELED : RF_OK;
    free(text);
    g->index++;
    return rc;
}

/* models_dir/model, refusing absolute paths and ".." components. */
static grpc_status_code model_path(rf_evaluator_service *s, rf_rpc_call *call, const char *model,
                                   char *out, size_t size) {
    if (!s->o.models_dir)
        return rf_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                           "this evaluator serves no models (start it with --models DIR)");
    if (!model[0]) return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "model is empty");
    if (model[0] == '/')
        return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "model '%s': a path relative to the models directory is expected",
                           model);
    for (const char *p = model; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                               "model '%s': '..' is not allowed", model);
        p += n + (p[n] == '/');
    }
    if ((size_t)snprintf(out, size, "%s/%s", s->o.models_dir, model) >= size)
        return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "model path too long");
    return GRPC_STATUS_OK;
}

static grpc_status_code generate(rf_rpc_call *call, const ProtobufCMessage *msg, void *user) {
    rf_evaluator_service *s = user;
    const Refinery__V1__GenerateRequest *req = (const Refinery__V1__GenerateRequest *)msg;
    char path[4096];
    grpc_status_code code = model_path(s, call, req->model, path, sizeof path);
    if (code != GRPC_STATUS_OK) return code;
    size_t plen = strlen(req->prompt);
    if (!rf_utf8_valid(req->prompt, plen))
        return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "prompt is not valid UTF-8 (first bad byte at %zu)",
                           rf_utf8_first_invalid(req->prompt, plen));
    rf_gen_opts go = {.max_new_tokens = req->max_new_tokens > 0 ? req->max_new_tokens : 64,
                      .sampling = {req->temperature, req->top_k, req->top_p, req->seed},
                      .chat = req->chat};
    if (go.max_new_tokens > s->o.max_new_tokens)
        return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "max_new_tokens %d; this evaluator allows at most %d", go.max_new_tokens,
                           s->o.max_new_tokens);
    if (rf_sampling_check(&go.sampling))
        return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s", rf_errmsg());
    char apath[4096];
    bool with_adapter = req->adapter && req->adapter[0];
    if (with_adapter &&
        (code = model_path(s, call, req->adapter, apath, sizeof apath)) != GRPC_STATUS_OK)
        return code;
    if (access(path, F_OK) != 0)
        return rf_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "no model '%s'", req->model);
    if (with_adapter && access(apath, F_OK) != 0)
        return rf_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "no adapter '%s'", req->adapter);
    rf_lm *lm = NULL;
    int rc = rf_lm_cache_get_adapter(s->lms, path, with_adapter ? apath : NULL, &lm);
    /* an adapter that does not fit the model (shape, targets, type) is the
     * request's fault; a model that does not load is the server's */
    if (rc && with_adapter &&
        (rc == RF_ERR_INVALID || rc == RF_ERR_UNSUPPORTED || rc == RF_ERR_NOT_FOUND ||
         rc == RF_ERR_PARSE))
        return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s", rf_errmsg());
    if (rc) return rf_rpc_fail(call, GRPC_STATUS_INTERNAL, "%s", rf_errmsg());
    int32_t *ids = NULL;
    int n = 0;
    rc = rf_gen_prompt_ids(lm, req->prompt, req->chat, &ids, &n);
    if (rc == RF_ERR_NOT_FOUND || rc == RF_ERR_UNSUPPORTED)
        code = rf_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "%s", rf_errmsg());
    else if (rc)
        code = rf_rpc_fail(call, GRPC_STATUS_INTERNAL, "%s", rf_errmsg());
    else if (n < 1 || n >= lm->dims.max_pos)
        code = rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "the prompt has %d tokens; the model takes 1 to %d", n,
                           lm->dims.max_pos - 1);
    if (code == GRPC_STATUS_OK) {
        gen_stream g = {call, 0, n};
        rc = rf_generate_ids(lm, ids, n, &go, send_token, &g, NULL);
        if (rc == RF_ERR_CANCELED)
            code = rf_rpc_call_status(call) != GRPC_STATUS_OK
                       ? rf_rpc_call_status(call)
                       : rf_rpc_fail(call, GRPC_STATUS_CANCELLED, "the client went away");
        else if (rc)
            code = rf_rpc_fail(call, GRPC_STATUS_INTERNAL, "%s", rf_errmsg());
        rf_stats_add(s->stats, "evaluator.generate.tokens", g.index);
    }
    free(ids);
    rf_lm_cache_release(s->lms, lm);
    return code;
}

int rf_evaluator_service_register(rf_evaluator_service *s, rf_rpc_server *server) {
    rf_rpc_method m = {.path = "/refinery.v1.Evaluator/Classify",
                       .kind = RF_RPC_UNARY,
                       .request = &refinery__v1__classify_request__descriptor,
                       .handler = classify,
                       .user = s};
    int rc = rf_rpc_server_add(server, &m);
    rf_rpc_method g = {.path = "/refinery.v1.Evaluator/Generate",
                       .kind = RF_RPC_SERVER_STREAM,
                       .request = &refinery__v1__generate_request__descriptor,
                       .handler = generate,
                       .user = s};
    return rc ? rc : rf_rpc_server_add(server, &g);
}
