/* The refinery.v1.Control handlers: run lifecycle over the store. */
#include "control/control_service.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "refinery.pb-c.h"
#include "control/spec_check.h"

#define LIST_DEFAULT 50
#define LIST_MAX     1000

struct rf_control_service {
    rf_control_service_opts o;
    pthread_mutex_t store_mu; /* a store handle is used by one thread at a time */
    rf_stats *stats;
    atomic_int watches;
    atomic_bool stopping;
};

int rf_control_service_new(const rf_control_service_opts *o, rf_control_service **out) {
    *out = NULL;
    if (!o->store) return rf_fail(RF_ERR_INVALID, "control service: a store is required");
    rf_control_service *svc = calloc(1, sizeof *svc);
    if (!svc || !(svc->stats = rf_stats_new())) {
        free(svc);
        return RF_ERR_NOMEM;
    }
    svc->o = *o;
    if (svc->o.max_watches <= 0) svc->o.max_watches = 1;
    if (svc->o.poll_s <= 0) svc->o.poll_s = 0.5;
    if (svc->o.down_after_s <= 0) svc->o.down_after_s = 15;
    if (svc->o.stall_after_s <= 0) svc->o.stall_after_s = 120;
    pthread_mutex_init(&svc->store_mu, NULL);
    atomic_init(&svc->watches, 0);
    atomic_init(&svc->stopping, false);
    *out = svc;
    return RF_OK;
}

void rf_control_service_free(rf_control_service *svc) {
    if (!svc) return;
    pthread_mutex_destroy(&svc->store_mu);
    rf_stats_free(svc->stats);
    free(svc);
}

void rf_control_service_shutdown(rf_control_service *svc) {
    atomic_store(&svc->stopping, true);
}

rf_stats *rf_control_service_stats(rf_control_service *svc) {
    return svc->stats;
}

/* ---- RunStatus assembly ---- */

#define NSTAGES 5
static const char *const stage_names[NSTAGES] = {"ingest", "dedup", "tokenizer", "trainer",
                                                 "evaluator"};
/* Stage i of the first four completes over stage_names[0..i]; the evaluator
 * follows the tokenizer directly (it reads tokens.eval). */
static const char *const eval_chain[] = {"ingest", "dedup", "tokenizer", "evaluator"};
/* The stage each consumes from (its backlog). */
static const char *const upstream[NSTAGES] = {NULL, "ingest", "dedup", "tokenizer", "tokenizer"};

/* A RunStatus whose strings point into its own fields. */
typedef struct run_status {
    Refinery__V1__RunStatus msg;
    rf_store_run run;
    Refinery__V1__StageCounts stages[NSTAGES];
    Refinery__V1__StageCounts *stage_ptrs[NSTAGES];
    char reasons[NSTAGES][400];
    rf_store_metric *metrics;
    Refinery__V1__Metric *metric_msgs;
    Refinery__V1__Metric **metric_ptrs;
} run_status;

static void status_free(run_status *st) {
    free(st->metrics);
    free(st->metric_msgs);
    free(st->metric_ptrs);
    memset(st, 0, sizeof *st);
}

static uint64_t nonneg(int64_t v) {
    return v > 0 ? (uint64_t)v : 0;
}

/* Unix seconds as 2026-11-25T02:10:00Z. */
static void utc(double t, char *out, size_t n) {
    time_t tt = (time_t)t;
    struct tm tm;
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&tt, &tm));
}

/* Fills c's liveness from lv (see control_service.h). */
static void classify(const rf_control_service *svc, const rf_store_liveness *lv, bool ended,
                     Refinery__V1__StageCounts *c, char *reason, size_t n) {
    char at[32];
    reason[0] = 0;
    c->liveness_reason = reason;
    c->last_progress_at = lv->progress_at;
    if (ended) {
        c->liveness = "ended";
        return;
    }
    double down_after = svc->o.down_after_s, stall_after = svc->o.stall_after_s;
    if (lv->heartbeat_at <= 0 || lv->now - lv->heartbeat_at > down_after) {
        c->liveness = "down";
        c->last_heartbeat_at = lv->heartbeat_at;
        if (lv->heartbeat_at <= 0) {
            snprintf(reason, n, "no heartbeat of refinery-%s recorded", c->stage);
        } else {
            utc(lv->heartbeat_at, at, sizeof at);
            snprintf(reason, n,
                     "no heartbeat of refinery-%s for %.0f s, since %s (down after %g s)", c->stage,
                     lv->now - lv->heartbeat_at, at, down_after);
        }
        return;
    }
    if (!lv->ready) {
        c->liveness = "unready";
        snprintf(reason, n, "%s", lv->reason[0] ? lv->reason : "its dependencies do not answer");
        return;
    }
    if (c->complete) {
        c->liveness = "complete";
        return;
    }
    if (lv->backlog <= 0) {
        c->liveness = "waiting";
        return;
    }
    /* Progress, or since the oldest waiting batch arrived when newer. */
    double since = lv->progress_at > lv->backlog_since ? lv->progress_at : lv->backlog_since;
    if (lv->now - since > stall_after) {
        c->liveness = "stalled";
        utc(since, at, sizeof at);
        snprintf(reason, n,
                 "%lld batch(es) wait for it and it made no progress for %.0f s, since %s "
                 "(stalled after %g s)",
                 (long long)lv->backlog, lv->now - since, at, stall_after);
        return;
    }
    c->liveness = "working";
}

static int load_stages(rf_control_service *svc, rf_store *s, run_status *st) {
    rf_store_counts totals[NSTAGES];
    int rc = rf_store_progress_totals(s, st->run.id, stage_names, NSTAGES, totals);
    for (size_t i = 0; i < NSTAGES && rc == RF_OK; i++) {
        Refinery__V1__StageCounts *c = &st->stages[i];
        refinery__v1__stage_counts__init(c);
        c->stage = (char *)stage_names[i];
        c->batches = nonneg(totals[i].batches);
        c->docs_in = nonneg(totals[i].in);
        c->docs_out = nonneg(totals[i].out);
        c->rejected = nonneg(totals[i].rejected);
        c->duplicate = nonneg(totals[i].duplicate);
        bool complete = false;
        const char *const *chain = i + 1 < NSTAGES ? stage_names : eval_chain;
        size_t n = i + 1 < NSTAGES ? i + 1 : 4;
        rc = rf_store_stage_complete(s, st->run.id, chain, n, &complete);
        c->complete = complete;
        rf_store_liveness lv;
        if (rc == RF_OK)
            rc = rf_store_liveness_get(s, st->run.id, stage_names[i], upstream[i], &lv);
        if (rc == RF_OK)
            classify(svc, &lv, rf_run_state_ended(st->run.state), c, st->reasons[i],
                     sizeof st->reasons[i]);
        st->stage_ptrs[i] = c;
    }
    st->msg.stages = st->stage_ptrs;
    st->msg.n_stages = NSTAGES;
    return rc;
}

static int load_eval(rf_store *s, run_status *st) {
    size_t n;
    int64_t step;
    int rc = rf_store_eval_latest(s, st->run.id, &step, &st->metrics, &n);
    if (rc == RF_ERR_NOT_FOUND) return RF_OK;
    if (rc < 0) return rc;
    st->metric_msgs = calloc(n, sizeof *st->metric_msgs);
    st->metric_ptrs = calloc(n, sizeof *st->metric_ptrs);
    if (!st->metric_msgs || !st->metric_ptrs) return RF_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        refinery__v1__metric__init(&st->metric_msgs[i]);
        st->metric_msgs[i].name = st->metrics[i].name;
        st->metric_msgs[i].value = st->metrics[i].value;
        st->metric_ptrs[i] = &st->metric_msgs[i];
    }
    st->msg.eval = st->metric_ptrs;
    st->msg.n_eval = n;
    st->msg.eval_step = step;
    return RF_OK;
}

/* Fills st for run_id (RF_ERR_NOT_FOUND when unknown); status_free after. */
static int status_load(rf_control_service *svc, const char *run_id, run_status *st) {
    memset(st, 0, sizeof *st);
    refinery__v1__run_status__init(&st->msg);
    st->msg.checkpoint_step = -1;
    st->msg.eval_step = -1;
    rf_store *s = svc->o.store;
    pthread_mutex_lock(&svc->store_mu);
    int rc = rf_store_run_get(s, run_id, &st->run);
    if (rc == RF_OK) rc = load_stages(svc, s, st);
    if (rc == RF_OK) {
        rc = rf_store_checkpoint_last(s, run_id, &st->msg.checkpoint_step, &st->msg.train_loss);
        if (rc == RF_ERR_NOT_FOUND) {
            st->msg.checkpoint_step = -1;
            rc = RF_OK;
        }
    }
    if (rc == RF_OK) rc = load_eval(s, st);
    pthread_mutex_unlock(&svc->store_mu);
    if (rc < 0) {
        status_free(st);
        return rc;
    }
    st->msg.run_id = st->run.id;
    st->msg.state = (char *)rf_run_state_name(st->run.state);
    st->msg.error = st->run.error;
    st->msg.sealed = st->run.sealed;
    st->msg.created_at = st->run.created_at;
    st->msg.updated_at = st->run.updated_at;
    return RF_OK;
}

/* ---- handlers ---- */

static grpc_status_code store_failed(rf_rpc_call *call, int rc, const char *run_id) {
    if (rc == RF_ERR_NOT_FOUND)
        return rf_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "unknown run '%s'", run_id);
    return rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "store: %s", rf_errmsg());
}

/* Sends run_id's status as the call's response. */
static grpc_status_code reply_status(rf_rpc_call *call, rf_control_service *svc,
                                     const char *run_id) {
    run_status st;
    int rc = status_load(svc, run_id, &st);
    if (rc < 0) return store_failed(call, rc, run_id);
    grpc_status_code code =
        rf_rpc_send(call, &st.msg.base) < 0 ? rf_rpc_call_status(call) : GRPC_STATUS_OK;
    status_free(&st);
    return code;
}

static bool valid_run_id(const char *id) {
    size_t n = strlen(id);
    if (n == 0 || n > 127 ||
        !((id[0] >= 'a' && id[0] <= 'z') || (id[0] >= 'A' && id[0] <= 'Z') ||
          (id[0] >= '0' && id[0] <= '9')))
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static void generate_run_id(char *out, size_t size) {
    uint32_t r;
    if (getrandom(&r, sizeof r, 0) != sizeof r)
        r = (uint32_t)(rf_now() * 1e9) ^ ((uint32_t)getpid() << 16);
    time_t now = time(NULL);
    struct tm tm;
    char ts[32];
    strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", gmtime_r(&now, &tm));
    snprintf(out, size, "run-%s-%08x", ts, (unsigned)r);
}

/* The run id of a RunRef, or a failed status. */
static const char *ref_id(rf_rpc_call *call, const ProtobufCMessage *req, grpc_status_code *code) {
    const Refinery__V1__RunRef *ref = (const Refinery__V1__RunRef *)req;
    *code = GRPC_STATUS_OK;
    if (!ref->run_id[0]) *code = rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "run_id is empty");
    return ref->run_id;
}

static grpc_status_code submit(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    rf_control_service *svc = user;
    const Refinery__V1__SubmitRequest *r = (const Refinery__V1__SubmitRequest *)req;
    char id[128];
    if (r->run_id[0]) {
        if (!valid_run_id(r->run_id))
            return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                               "run_id '%.200s': expected 1 to 127 of [A-Za-z0-9._-], starting "
                               "with a letter or digit",
                               r->run_id);
        snprintf(id, sizeof id, "%s", r->run_id);
    } else {
        generate_run_id(id, sizeof id);
    }
    if (rf_spec_check(r->spec_yaml, strlen(r->spec_yaml), "spec") < 0)
        return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s", rf_errmsg());
    bool created = false;
    pthread_mutex_lock(&svc->store_mu);
    int rc = rf_store_run_create(svc->o.store, id, r->spec_yaml, &created);
    pthread_mutex_unlock(&svc->store_mu);
    if (rc < 0) return store_failed(call, rc, id);
    if (!created) return rf_rpc_fail(call, GRPC_STATUS_ALREADY_EXISTS, "run '%s' exists", id);
    rf_stats_add(svc->stats, "control.submitted", 1);
    rf_info("control", "run %s submitted", id);
    return reply_status(call, svc, id);
}

static grpc_status_code seal(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    rf_control_service *svc = user;
    grpc_status_code code;
    const char *id = ref_id(call, req, &code);
    if (code != GRPC_STATUS_OK) return code;
    pthread_mutex_lock(&svc->store_mu);
    int rc = rf_store_run_seal(svc->o.store, id);
    pthread_mutex_unlock(&svc->store_mu);
    if (rc < 0) return store_failed(call, rc, id);
    rf_stats_add(svc->stats, "control.sealed", 1);
    return reply_status(call, svc, id);
}

static grpc_status_code get(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    grpc_status_code code;
    const char *id = ref_id(call, req, &code);
    return code != GRPC_STATUS_OK ? code : reply_status(call, user, id);
}

static grpc_status_code cancel(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    rf_control_service *svc = user;
    grpc_status_code code;
    const char *id = ref_id(call, req, &code);
    if (code != GRPC_STATUS_OK) return code;
    bool cancelled = false;
    pthread_mutex_lock(&svc->store_mu);
    int rc = rf_store_run_cancel(svc->o.store, id, &cancelled);
    pthread_mutex_unlock(&svc->store_mu);
    if (rc < 0) return store_failed(call, rc, id);
    if (!cancelled)
        return rf_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "run '%s' has already ended", id);
    rf_stats_add(svc->stats, "control.cancelled", 1);
    rf_info("control", "run %s cancelled", id);
    return reply_status(call, svc, id);
}

static grpc_status_code list(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    rf_control_service *svc = user;
    const Refinery__V1__ListRunsRequest *r = (const Refinery__V1__ListRunsRequest *)req;
    size_t limit = r->limit == 0 ? LIST_DEFAULT : r->limit > LIST_MAX ? LIST_MAX : r->limit;
    rf_store_run *runs = calloc(limit, sizeof *runs);
    run_status *sts = calloc(limit, sizeof *sts);
    Refinery__V1__RunStatus **ptrs = calloc(limit, sizeof *ptrs);
    size_t n = 0, loaded = 0;
    int rc = runs && sts && ptrs ? RF_OK : RF_ERR_NOMEM;
    if (rc == RF_OK) {
        pthread_mutex_lock(&svc->store_mu);
        rc = rf_store_run_list(svc->o.store, limit, runs, &n);
        pthread_mutex_unlock(&svc->store_mu);
    }
    for (size_t i = 0; i < n && rc == RF_OK; i++) {
        rc = status_load(svc, runs[i].id, &sts[loaded]);
        if (rc == RF_ERR_NOT_FOUND) { /* deleted since the listing */
            rc = RF_OK;
            continue;
        }
        if (rc == RF_OK) {
            ptrs[loaded] = &sts[loaded].msg;
            loaded++;
        }
    }
    grpc_status_code code;
    if (rc < 0) {
        code = rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "store: %s", rf_errmsg());
    } else {
        Refinery__V1__RunList out = REFINERY__V1__RUN_LIST__INIT;
        out.runs = ptrs;
        out.n_runs = loaded;
        code = rf_rpc_send(call, &out.base) < 0 ? rf_rpc_call_status(call) : GRPC_STATUS_OK;
    }
    for (size_t i = 0; i < loaded; i++)
        status_free(&sts[i]);
    free(runs);
    free(sts);
    free(ptrs);
    return code;
}

/* Packs st into *buf (grown as needed); returns the length. */
static size_t pack_status(const run_status *st, uint8_t **buf, size_t *cap) {
    size_t len = refinery__v1__run_status__get_packed_size(&st->msg);
    if (len > *cap) {
        uint8_t *grown = realloc(*buf, len);
        if (!grown) return 0;
        *buf = grown;
        *cap = len;
    }
    return refinery__v1__run_status__pack(&st->msg, *buf);
}

/* Sleeps up to s seconds; false when the call or the service is ending. */
static bool wait_poll(rf_control_service *svc, rf_rpc_call *call, double s) {
    double end = rf_now() + s;
    while (rf_now() < end) {
        if (atomic_load(&svc->stopping) || rf_rpc_call_done(call)) return false;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return !atomic_load(&svc->stopping) && !rf_rpc_call_done(call);
}

static grpc_status_code watch_loop(rf_rpc_call *call, rf_control_service *svc, const char *id) {
    uint8_t *last = NULL, *now = NULL;
    size_t last_len = 0, last_cap = 0, now_cap = 0;
    grpc_status_code code = GRPC_STATUS_OK;
    bool first = true, ended = false;
    while (code == GRPC_STATUS_OK && !ended) {
        if (!first && !wait_poll(svc, call, svc->o.poll_s)) {
            code = atomic_load(&svc->stopping)
                       ? rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "service stopping")
                       : rf_rpc_fail(call, GRPC_STATUS_CANCELLED, "client left");
            break;
        }
        run_status st;
        int rc = status_load(svc, id, &st);
        if (rc < 0) {
            code = store_failed(call, rc, id);
            break;
        }
        ended = rf_run_state_ended(st.run.state);
        size_t len = pack_status(&st, &now, &now_cap);
        if (len == 0) {
            code = rf_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        } else if (first || len != last_len || memcmp(now, last, len) != 0) {
            if (rf_rpc_send(call, &st.msg.base) < 0) code = rf_rpc_call_status(call);
            uint8_t *t = last; /* the new status becomes the last one sent */
            size_t tc = last_cap;
            last = now, last_cap = now_cap, last_len = len;
            now = t, now_cap = tc;
        }
        status_free(&st);
        first = false;
    }
    free(last);
    free(now);
    return code;
}

static grpc_status_code watch(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    rf_control_service *svc = user;
    grpc_status_code code;
    const char *id = ref_id(call, req, &code);
    if (code != GRPC_STATUS_OK) return code;
    if (atomic_load(&svc->stopping))
        return rf_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "service stopping");
    if (atomic_fetch_add(&svc->watches, 1) >= svc->o.max_watches) {
        atomic_fetch_sub(&svc->watches, 1);
        return rf_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "too many watches (at most %d at once); poll with Get",
                           svc->o.max_watches);
    }
    rf_stats_add(svc->stats, "control.watches", 1);
    code = watch_loop(call, svc, id);
    atomic_fetch_sub(&svc->watches, 1);
    return code;
}

int rf_control_service_register(rf_control_service *svc, rf_rpc_server *s) {
    const rf_rpc_method methods[] = {
        {"/refinery.v1.Control/Submit", RF_RPC_UNARY, &refinery__v1__submit_request__descriptor,
         submit, svc},
        {"/refinery.v1.Control/Seal", RF_RPC_UNARY, &refinery__v1__run_ref__descriptor, seal, svc},
        {"/refinery.v1.Control/Get", RF_RPC_UNARY, &refinery__v1__run_ref__descriptor, get, svc},
        {"/refinery.v1.Control/List", RF_RPC_UNARY, &refinery__v1__list_runs_request__descriptor,
         list, svc},
        {"/refinery.v1.Control/Watch", RF_RPC_SERVER_STREAM, &refinery__v1__run_ref__descriptor,
         watch, svc},
        {"/refinery.v1.Control/Cancel", RF_RPC_UNARY, &refinery__v1__run_ref__descriptor, cancel,
         svc},
    };
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        int rc = rf_rpc_server_add(s, &methods[i]);
        if (rc < 0) return rc;
    }
    return rf_rpc_server_set_health(s, "refinery.v1.Control", 1);
}
