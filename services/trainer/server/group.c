/* The trainer service's group protocol: see group.h. */
#include "trainer/server/group.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "runtime/svc.h"
#include "trainer/driver.h"
#include "trainer/server/trainer_service.h"

enum { CMD_IDLE = 1, CMD_TRAIN = 2, CMD_STOP = 3 };
#define HDR     6
#define POLL_NS 20000000L /* a follower's poll of the header: 20 ms */

int rf_tgroup_parse_spec(const char *text, const char *run_id, const char *model, int world,
                         rf_cfg **root, rf_trainer_spec *spec) {
    char name[160];
    snprintf(name, sizeof name, "spec of run %s", run_id);
    int rc = rf_cfg_load_string(text, strlen(text), name, root);
    if (rc) return rc;
    if (rf_cfg_kind_of(*root) != RF_CFG_MAP)
        return rf_fail(RF_ERR_INVALID, "%s: not a map of sections", name);
    if (model && !rf_cfg_get(*root, "trainer.model") &&
        (rc = rf_cfg_set(*root, "trainer.model", model)))
        return rc;
    if ((rc = rf_trainer_spec_parse(rf_cfg_get(*root, "trainer"), spec))) return rc;
    if (!rf_cfg_get(*root, "trainer.parallel.dp")) { /* the group's ranks over the tp x pp mesh */
        int mp = (spec->opts.tp > 1 ? spec->opts.tp : 1) * (spec->opts.pp > 1 ? spec->opts.pp : 1);
        spec->dp = world % mp ? world : world / mp;
    }
    return RF_OK;
}

/* ---- rank 0 ---- */

static int send_header(rf_comm *c, int64_t kind, int64_t a, int64_t b, int64_t n, int64_t ntok) {
    int64_t h[HDR] = {kind, a, b, n, ntok, 0};
    return rf_comm_broadcast(c, h, HDR, RF_COMM_I64, 0);
}

int rf_tgroup_heartbeat(rf_comm *c, bool stopping, bool *any_stop) {
    uint8_t flag = stopping;
    int rc = send_header(c, CMD_IDLE, 0, 0, 0, 0);
    if (!rc) rc = rf_comm_allreduce(c, &flag, &flag, 1, RF_COMM_U8, RF_COMM_MAX);
    *any_stop = flag != 0;
    return rc;
}

int rf_tgroup_stop(rf_comm *c) {
    return send_header(c, CMD_STOP, 0, 0, 0, 0);
}

/* The dataset's lengths and labels as i32 columns (tokens are sent as they
 * are: a broadcast moves bits, the type only sizes them). */
int rf_tgroup_send_job(rf_comm *c, const char *run_id, const char *spec, const rf_dataset *d,
                       int local_rc, bool *all_ok) {
    size_t lr = strlen(run_id), ls = strlen(spec);
    *all_ok = false;
    if (d->ntokens > INT_MAX || d->n > INT_MAX || lr + ls > INT_MAX)
        return rf_fail(RF_ERR_RANGE, "trainer group: run %s is too large to send in one message",
                       run_id);
    char *text = malloc(lr + ls + 1);
    int32_t *cols = malloc(2 * (d->n ? d->n : 1) * sizeof *cols);
    /* the tokens must be contiguous in sequence order: rebuild them if the
     * dataset's starts are not (rf_dataset_add appends, so they are) */
    int rc = text && cols ? RF_OK : RF_ERR_NOMEM;
    size_t off = 0;
    for (size_t i = 0; !rc && i < d->n; i++) {
        if (d->start[i] != off)
            rc = rf_fail(RF_ERR_INTERNAL, "trainer group: dataset tokens are not contiguous");
        off += d->len[i];
        cols[i] = (int32_t)d->len[i];
        cols[d->n + i] = d->label[i];
    }
    if (!rc && off != d->ntokens)
        rc = rf_fail(RF_ERR_INTERNAL, "trainer group: dataset tokens are not contiguous");
    if (!rc) {
        memcpy(text, run_id, lr);
        memcpy(text + lr, spec, ls);
        rc =
            send_header(c, CMD_TRAIN, (int64_t)lr, (int64_t)ls, (int64_t)d->n, (int64_t)d->ntokens);
    }
    if (!rc && lr + ls) rc = rf_comm_broadcast(c, text, lr + ls, RF_COMM_U8, 0);
    if (!rc && d->ntokens) rc = rf_comm_broadcast(c, d->tokens, d->ntokens, RF_COMM_I32, 0);
    if (!rc && d->n) rc = rf_comm_broadcast(c, cols, 2 * d->n, RF_COMM_I32, 0);
    int32_t failed = local_rc != 0;
    if (!rc) rc = rf_comm_allreduce(c, &failed, &failed, 1, RF_COMM_I32, RF_COMM_MAX);
    if (!rc) *all_ok = failed == 0;
    free(text);
    free(cols);
    return rc;
}

/* ---- followers ---- */

static double comm_timeout(void) {
    const char *s = getenv("REFINERY_COMM_TIMEOUT");
    char *end;
    double d = s && *s ? strtod(s, &end) : 0;
    return s && *s && !*end && d > 0 ? d : rf_comm_opts_default().timeout_s;
}

/* The next header, polled without spinning (see group.h). */
static int wait_header(rf_comm *c, int64_t *h, double timeout_s) {
    rf_comm_req *req;
    int rc = rf_comm_ibroadcast(c, h, HDR, RF_COMM_I64, 0, &req);
    if (rc) return rc;
    double deadline = rf_now() + timeout_s;
    int done = 0;
    while (!rc && !done && rf_now() < deadline) {
        rc = rf_comm_test(req, &done);
        if (!rc && !done) nanosleep(&(struct timespec){0, POLL_NS}, NULL);
    }
    if (!rc && !done)
        rf_warn("trainer", "group: no word from rank 0 for %.0f s; waiting once more", timeout_s);
    int wrc = rf_comm_wait(req);
    return rc ? rc : wrc;
}

typedef struct follower_job {
    const rf_trainer_spec *spec;
    const rf_dataset *data;
    rf_comm *comm;
    volatile int cancel;
    rf_train_result res;
    int rc;
    char err[512];
    atomic_bool done;
} follower_job;

static void *drive_thread(void *arg) {
    follower_job *j = arg;
    rf_trainer_hooks h = {.cancel = &j->cancel, .comm = j->comm};
    j->rc = rf_trainer_drive(j->spec, j->data, &h, &j->res);
    if (j->rc) snprintf(j->err, sizeof j->err, "%s", rf_errmsg());
    atomic_store(&j->done, true);
    return NULL;
}

/* TRAIN on a follower: receive, prepare, agree, train. Non-zero only when the
 * group can no longer be trusted (a comm failure or a training error). */
static int follow_job(rf_comm *c, const rf_tgroup_follower_opts *o, const int64_t *h) {
    size_t lr = (size_t)h[1], ls = (size_t)h[2], n = (size_t)h[3], ntok = (size_t)h[4];
    char *text = malloc(lr + ls + 1);
    int32_t *cols = malloc(2 * (n ? n : 1) * sizeof *cols);
    uint32_t *tokens = malloc((ntok ? ntok : 1) * sizeof *tokens);
    if (!text || !cols || !tokens) {
        free(text);
        free(cols);
        free(tokens);
        return rf_fail(RF_ERR_NOMEM, "trainer group: receiving a run of %zu sequences", n);
    }
    int rc = lr + ls ? rf_comm_broadcast(c, text, lr + ls, RF_COMM_U8, 0) : RF_OK;
    if (!rc && ntok) rc = rf_comm_broadcast(c, tokens, ntok, RF_COMM_I32, 0);
    if (!rc && n) rc = rf_comm_broadcast(c, cols, 2 * n, RF_COMM_I32, 0);
    if (rc) {
        free(text);
        free(cols);
        free(tokens);
        return rc;
    }
    char run_id[160];
    snprintf(run_id, sizeof run_id, "%.*s", (int)(lr < 128 ? lr : 128), text);
    memmove(text, text + lr, ls);
    text[ls] = 0;

    /* prepare: the same spec, data and checks as rank 0 */
    rf_cfg *root = NULL;
    rf_trainer_spec spec;
    rf_dataset data = {0};
    char dirname[160], out_dir[4096];
    int prep = rf_tgroup_parse_spec(text, run_id, o->model, rf_comm_world(c), &root, &spec);
    size_t off = 0;
    for (size_t i = 0; !prep && i < n; i++) {
        if (cols[i] < 0 || off + (size_t)cols[i] > ntok) {
            prep = rf_fail(RF_ERR_CORRUPT, "trainer group: bad sequence length from rank 0");
            break;
        }
        prep = rf_dataset_add(&data, tokens + off, (size_t)cols[i], cols[n + i]);
        off += (size_t)cols[i];
    }
    if (!prep) prep = rf_trainer_check(&spec, &data, c);
    if (prep)
        rf_error("trainer", "group: rank %d cannot prepare run %s: %s", rf_comm_rank(c), run_id,
                 rf_errmsg());
    int32_t failed = prep != 0;
    rc = rf_comm_allreduce(c, &failed, &failed, 1, RF_COMM_I32, RF_COMM_MAX);
    if (!rc && !failed) {
        rf_trainer_run_dirname(run_id, dirname, sizeof dirname);
        snprintf(out_dir, sizeof out_dir, "%s/%s/train", o->state_dir, dirname);
        spec.threads = o->threads > 0 ? o->threads : spec.threads > 0 ? spec.threads : 1;
        spec.export_dir = NULL;
        spec.opts.out_dir = out_dir;
        spec.opts.resume = true;
        rf_info("trainer", "group: rank %d trains run %s (%zu sequences)", rf_comm_rank(c), run_id,
                data.n);
        follower_job j = {.spec = &spec, .data = &data, .comm = c};
        atomic_init(&j.done, false);
        pthread_t t;
        if (pthread_create(&t, NULL, drive_thread, &j)) {
            rc = rf_fail(RF_ERR_INTERNAL, "trainer group: cannot start a training thread");
        } else {
            /* a stop request of this rank cancels the group's training at a
             * saved state (rf_train all-reduces the cancel flag) */
            while (!atomic_load(&j.done)) {
                if (!j.cancel && rf_svc_stopping()) j.cancel = 1;
                nanosleep(&(struct timespec){0, 50000000L}, NULL);
            }
            pthread_join(t, NULL);
            if (j.rc)
                rc = rf_fail(j.rc, "trainer group: rank %d, run %s: %s", rf_comm_rank(c), run_id,
                             j.err);
            else
                rf_info("trainer", "group: rank %d: run %s %s at step %ld", rf_comm_rank(c), run_id,
                        j.res.finished ? "trained" : "stopped", j.res.steps);
        }
    } else if (!rc) {
        rf_info("trainer", "group: run %s not trained: a rank could not prepare it", run_id);
    }
    rf_dataset_free(&data);
    rf_cfg_free(root);
    free(text);
    free(cols);
    free(tokens);
    return rc;
}

int rf_tgroup_follow(rf_comm *c, const rf_tgroup_follower_opts *o) {
    double timeout = o->timeout_s > 0 ? o->timeout_s : comm_timeout();
    rf_info("trainer", "group: rank %d of %d follows rank 0 (state %s)", rf_comm_rank(c),
            rf_comm_world(c), o->state_dir);
    for (;;) {
        int64_t h[HDR];
        int rc = wait_header(c, h, timeout);
        if (rc) return rc;
        switch (h[0]) {
        case CMD_IDLE: {
            uint8_t flag = rf_svc_stopping();
            if ((rc = rf_comm_allreduce(c, &flag, &flag, 1, RF_COMM_U8, RF_COMM_MAX))) return rc;
            break;
        }
        case CMD_TRAIN:
            if (h[1] < 0 || h[2] < 0 || h[3] < 0 || h[4] < 0 || h[1] + h[2] > INT_MAX ||
                h[3] > INT_MAX || h[4] > INT_MAX)
                return rf_fail(RF_ERR_CORRUPT, "trainer group: bad TRAIN header from rank 0");
            if ((rc = follow_job(c, o, h))) return rc;
            break;
        case CMD_STOP:
            rf_info("trainer", "group: rank %d stops (rank 0 said so)", rf_comm_rank(c));
            return RF_OK;
        default:
            return rf_fail(RF_ERR_CORRUPT, "trainer group: unknown command %lld from rank 0",
                           (long long)h[0]);
        }
    }
}
