/* Shared client plumbing of the service commands (see remote.h). */
#include "cli/remote.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/sys.h"

/* While it trains the trainer shows progress only at checkpoints (with
 * checkpoint_every 0: the last one only); examples/amazon.yaml trains for
 * several minutes on 2 cores. The default leaves room for that. */
#define STALL_DEFAULT_S       900.0
#define UNREACHABLE_DEFAULT_S 30.0
#define PAUSE_MIN_S           0.25  /* first pause before asking a silent server again, */
#define PAUSE_MAX_S           5.0   /* doubling up to this */
#define POLL_S                1.0   /* Control.Get period when polling */
#define RENEW_S               300.0 /* a Watch call lasts at most this long, then Get checks */

const char rf_remote_usage[] =
    "server:    --server HOST:PORT (REFINERY_SERVER, default 127.0.0.1:7101)\n"
    "           --evaluator HOST:PORT (REFINERY_EVALUATOR, default 127.0.0.1:7105)\n"
    "           --tls-ca PEM  --tls-cert PEM  --tls-key PEM  --tls-server-name NAME\n"
    "           --timeout SECONDS (each unary call, default 30)\n";

const char rf_watch_usage[] =
    "watch:     --stall-timeout SECONDS (REFINERY_STALL_TIMEOUT, default 900; 0: never)\n"
    "             give up when neither the run's state nor any stage's counts, its\n"
    "             checkpoint or its evaluation changed for this long (while it trains,\n"
    "             the trainer shows progress only at checkpoints: trainer.checkpoint_every)\n"
    "           --unreachable-timeout SECONDS (REFINERY_UNREACHABLE_TIMEOUT, default 30;\n"
    "             0: never) give up when the server gave no status for this long\n"
    "             (unreachable, or UNAVAILABLE); meanwhile it is asked again after\n"
    "             0.25 s, then twice as long each time, up to 5 s\n"
    "exit:      0 the run succeeded; 1 it failed or was cancelled, or the watch\n"
    "           broke; 2 usage error or invalid argument; 3 stalled (no progress for\n"
    "           --stall-timeout); 4 the server gave no status for --unreachable-timeout\n";

/* A timeout in seconds: a finite number >= 0. */
static int parse_timeout(const char *what, const char *arg, double *out) {
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (end == arg || *end || errno || !isfinite(v) || v < 0 || v > 1e9) {
        fprintf(stderr, "refinery: %s expects a number of seconds >= 0, got '%s'\n", what, arg);
        return -1;
    }
    *out = v;
    return 0;
}

int rf_watch_opts_init(rf_watch_opts *w) {
    memset(w, 0, sizeof *w);
    w->stall_s = STALL_DEFAULT_S;
    w->unreachable_s = UNREACHABLE_DEFAULT_S;
    const char *s = getenv("REFINERY_STALL_TIMEOUT"), *u = getenv("REFINERY_UNREACHABLE_TIMEOUT");
    if (s && *s && parse_timeout("REFINERY_STALL_TIMEOUT", s, &w->stall_s) < 0) return -1;
    if (u && *u && parse_timeout("REFINERY_UNREACHABLE_TIMEOUT", u, &w->unreachable_s) < 0)
        return -1;
    return 0;
}

int rf_watch_option(rf_watch_opts *w, int c, const char *arg) {
    switch (c) {
    case RF_WATCH_OPT_STALL:
        return parse_timeout("--stall-timeout", arg, &w->stall_s) < 0 ? -1 : 1;
    case RF_WATCH_OPT_UNREACHABLE:
        return parse_timeout("--unreachable-timeout", arg, &w->unreachable_s) < 0 ? -1 : 1;
    default:
        return 0;
    }
}

void rf_remote_init(rf_remote *r) {
    memset(r, 0, sizeof *r);
    const char *s = getenv("REFINERY_SERVER"), *e = getenv("REFINERY_EVALUATOR");
    r->server = s && *s ? s : "127.0.0.1:7101";
    r->evaluator = e && *e ? e : "127.0.0.1:7105";
    r->timeout_s = 30;
}

int rf_remote_option(rf_remote *r, int c, const char *arg) {
    switch (c) {
    case RF_REMOTE_OPT_SERVER:
        r->server = arg;
        return 1;
    case RF_REMOTE_OPT_EVALUATOR:
        r->evaluator = arg;
        return 1;
    case RF_REMOTE_OPT_TLS_CA:
        r->tls.ca_file = arg;
        return 1;
    case RF_REMOTE_OPT_TLS_CERT:
        r->tls.cert_file = arg;
        return 1;
    case RF_REMOTE_OPT_TLS_KEY:
        r->tls.key_file = arg;
        return 1;
    case RF_REMOTE_OPT_TLS_NAME:
        r->tls.server_name = arg;
        return 1;
    case RF_REMOTE_OPT_TIMEOUT: {
        char *end;
        r->timeout_s = strtod(arg, &end);
        if (*end || !(r->timeout_s > 0)) {
            fprintf(stderr, "refinery: --timeout expects a positive number of seconds, got '%s'\n",
                    arg);
            return -1;
        }
        return 1;
    }
    default:
        return 0;
    }
}

int rf_remote_connect(const rf_remote *r, const char *target, const char *cmd,
                      rf_rpc_client **out) {
    if ((r->tls.cert_file != NULL) != (r->tls.key_file != NULL)) {
        fprintf(stderr, "refinery %s: --tls-cert and --tls-key go together\n", cmd);
        return RF_ERR_INVALID;
    }
    bool tls = r->tls.ca_file || r->tls.cert_file;
    int rc = rf_rpc_client_new(target, tls ? &r->tls : NULL, 0, out);
    if (rc < 0) fprintf(stderr, "refinery %s: %s: %s\n", cmd, target, rf_errmsg());
    return rc;
}

int rf_remote_run_call(rf_rpc_client *c, const rf_remote *r, const char *method, const char *run_id,
                       Refinery__V1__RunStatus **out, rf_rpc_status *st) {
    char path[64];
    snprintf(path, sizeof path, "/refinery.v1.Control/%s", method);
    Refinery__V1__RunRef ref = REFINERY__V1__RUN_REF__INIT;
    ref.run_id = (char *)run_id;
    ProtobufCMessage *m = NULL;
    int rc = rf_rpc_unary(c, path, &ref.base, &refinery__v1__run_status__descriptor, &m,
                          r->timeout_s, st);
    *out = (Refinery__V1__RunStatus *)m;
    return rc;
}

int rf_remote_report(const char *cmd, const rf_rpc_status *st) {
    fprintf(stderr, "refinery %s: %s: %s\n", cmd, rf_rpc_status_name(st->code), st->message);
    return st->code == GRPC_STATUS_INVALID_ARGUMENT ? 2 : 1;
}

static void put_str(rf_buf *b, const char *key, const char *v) {
    rf_buf_printf(b, "\"%s\":", key);
    rf_buf_append_json_str(b, v, strlen(v));
}

static bool ended(const char *state);

/* Unix seconds as a JSON string in UTC ("2026-11-25T02:10:00Z"); null for 0. */
static void put_time(rf_buf *b, double t) {
    if (t <= 0) {
        rf_buf_puts(b, "null");
        return;
    }
    time_t tt = (time_t)t;
    struct tm tm;
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&tt, &tm));
    rf_buf_printf(b, "\"%s\"", ts);
}

/* A stage whose liveness an operator must see: down, unready or stalled. */
static bool flagged(const Refinery__V1__StageCounts *c) {
    return !strcmp(c->liveness, "down") || !strcmp(c->liveness, "unready") ||
           !strcmp(c->liveness, "stalled");
}

void rf_remote_print_json(FILE *out, const Refinery__V1__RunStatus *s) {
    rf_buf b = RF_BUF_INIT;
    rf_buf_putc(&b, '{');
    put_str(&b, "run_id", s->run_id);
    rf_buf_putc(&b, ',');
    put_str(&b, "state", s->state);
    rf_buf_putc(&b, ',');
    put_str(&b, "error", s->error);
    rf_buf_printf(&b, ",\"sealed\":%s,\"created_at\":%.3f,\"updated_at\":%.3f,\"stages\":{",
                  s->sealed ? "true" : "false", s->created_at, s->updated_at);
    for (size_t i = 0; i < s->n_stages; i++) {
        const Refinery__V1__StageCounts *c = s->stages[i];
        if (i) rf_buf_putc(&b, ',');
        rf_buf_append_json_str(&b, c->stage, strlen(c->stage));
        rf_buf_printf(&b,
                      ":{\"batches\":%llu,\"docs_in\":%llu,\"docs_out\":%llu,\"rejected\":%llu,"
                      "\"duplicate\":%llu,\"complete\":%s,",
                      (unsigned long long)c->batches, (unsigned long long)c->docs_in,
                      (unsigned long long)c->docs_out, (unsigned long long)c->rejected,
                      (unsigned long long)c->duplicate, c->complete ? "true" : "false");
        put_str(&b, "liveness", c->liveness);
        rf_buf_putc(&b, ',');
        put_str(&b, "liveness_reason", c->liveness_reason);
        rf_buf_puts(&b, ",\"last_progress\":");
        put_time(&b, c->last_progress_at);
        rf_buf_puts(&b, ",\"last_heartbeat\":");
        put_time(&b, c->last_heartbeat_at);
        rf_buf_putc(&b, '}');
    }
    rf_buf_printf(&b,
                  "},\"checkpoint_step\":%lld,\"train_loss\":%.6g,\"eval_step\":%lld,\"eval\":{",
                  (long long)s->checkpoint_step, s->train_loss, (long long)s->eval_step);
    for (size_t i = 0; i < s->n_eval; i++) {
        if (i) rf_buf_putc(&b, ',');
        rf_buf_append_json_str(&b, s->eval[i]->name, strlen(s->eval[i]->name));
        rf_buf_printf(&b, ":%.6g", s->eval[i]->value);
    }
    rf_buf_puts(&b, "}}\n");
    if (b.data) fputs(b.data, out);
    fflush(out);
    rf_buf_free(&b);
}

void rf_remote_print_line(FILE *out, const Refinery__V1__RunStatus *s) {
    time_t now = time(NULL);
    struct tm tm;
    char ts[16];
    strftime(ts, sizeof ts, "%H:%M:%S", localtime_r(&now, &tm));
    fprintf(out, "%s %s %s%s", ts, s->run_id, s->state, s->sealed ? " sealed" : "");
    for (size_t i = 0; i < s->n_stages; i++) {
        const Refinery__V1__StageCounts *c = s->stages[i];
        fprintf(out, " | %s %llu>%llu", c->stage, (unsigned long long)c->docs_in,
                (unsigned long long)c->docs_out);
        if (c->rejected) fprintf(out, " rej %llu", (unsigned long long)c->rejected);
        if (c->duplicate) fprintf(out, " dup %llu", (unsigned long long)c->duplicate);
        if (c->complete) fputs(" done", out);
        if (flagged(c)) {
            fputc(' ', out);
            for (const char *p = c->liveness; *p; p++)
                fputc(*p - 'a' + 'A', out);
        } else if (c->last_progress_at > 0 && !c->complete && !ended(s->state)) {
            time_t at = (time_t)c->last_progress_at;
            char lt[16];
            strftime(lt, sizeof lt, "%H:%M:%S", localtime_r(&at, &tm));
            fprintf(out, " @%s", lt);
        }
    }
    for (size_t i = 0; i < s->n_stages; i++)
        if (flagged(s->stages[i]))
            fprintf(out, " | %s %s: %s", s->stages[i]->stage, s->stages[i]->liveness,
                    s->stages[i]->liveness_reason);
    if (s->checkpoint_step >= 0)
        fprintf(out, " | step %lld loss %.4f", (long long)s->checkpoint_step, s->train_loss);
    if (s->eval_step >= 0) {
        fprintf(out, " | eval@%lld", (long long)s->eval_step);
        for (size_t i = 0; i < s->n_eval; i++)
            if (!strcmp(s->eval[i]->name, "accuracy") || !strcmp(s->eval[i]->name, "macro_f1") ||
                !strcmp(s->eval[i]->name, "loss"))
                fprintf(out, " %s %.4f", s->eval[i]->name, s->eval[i]->value);
    }
    if (s->error[0]) fprintf(out, " | error: %s", s->error);
    fputc('\n', out);
    fflush(out);
}

/* ---- following a run ---- */

typedef struct watcher {
    rf_rpc_client *c; /* owned: replaced while the server gives no status */
    const rf_remote *r;
    const rf_watch_opts *w;
    const char *cmd, *run_id;
    Refinery__V1__RunStatus *last; /* the last status seen (owned), NULL before one */
    uint8_t *last_packed;          /* and packed, to print only changes */
    size_t last_len;
    char *last_line;    /* the last progress line printed, from after its time (owned) */
    double progress_at; /* rf_now() of the last progress (or of the start) */
    double down_since;  /* rf_now() since which the server gives no status; < 0: it does */
    double pause;       /* before asking a silent server again */
    rf_rpc_status err;  /* why it gave none, the last time */
    bool poll;          /* no room for a watch on the server: Get every POLL_S */
} watcher;

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static bool ended(const char *state) {
    return !strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled");
}

static bool counts_equal(const Refinery__V1__StageCounts *a, const Refinery__V1__StageCounts *b) {
    return !strcmp(a->stage, b->stage) && a->batches == b->batches && a->docs_in == b->docs_in &&
           a->docs_out == b->docs_out && a->rejected == b->rejected &&
           a->duplicate == b->duplicate && a->complete == b->complete;
}

/* Progress from a to b: the run's state, sealing or error, a stage's counts,
 * its checkpoint or evaluation changed (timestamps alone are not progress). */
static bool progressed(const Refinery__V1__RunStatus *a, const Refinery__V1__RunStatus *b) {
    if (strcmp(a->state, b->state) || strcmp(a->error, b->error) || a->sealed != b->sealed ||
        a->checkpoint_step != b->checkpoint_step || a->eval_step != b->eval_step ||
        a->n_stages != b->n_stages)
        return true;
    for (size_t i = 0; i < a->n_stages; i++)
        if (!counts_equal(a->stages[i], b->stages[i])) return true;
    return false;
}

/* The progress line, unless it reads as the last one did (a change of
 * liveness between working and waiting, say, shows in JSON only). */
static void print_changed_line(watcher *wt, const Refinery__V1__RunStatus *s) {
    char *line = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&line, &n);
    if (!m) {
        rf_remote_print_line(stdout, s);
        return;
    }
    rf_remote_print_line(m, s);
    fclose(m);
    const char *body = strchr(line, ' '); /* after the time */
    body = body ? body : line;
    if (!wt->last_line || strcmp(body, wt->last_line) != 0) {
        fputs(line, stdout);
        fflush(stdout);
        free(wt->last_line);
        wt->last_line = strdup(body);
    }
    free(line);
}

/* Takes s: notes progress, prints it when it differs from the last one. */
static int observe(watcher *wt, Refinery__V1__RunStatus *s) {
    size_t len = refinery__v1__run_status__get_packed_size(s);
    uint8_t *packed = malloc(len ? len : 1);
    if (!packed) {
        protobuf_c_message_free_unpacked(&s->base, NULL);
        return RF_ERR_NOMEM;
    }
    refinery__v1__run_status__pack(s, packed);
    if (!wt->last || progressed(wt->last, s)) wt->progress_at = rf_now();
    if (!wt->last || len != wt->last_len || memcmp(packed, wt->last_packed, len) != 0) {
        if (wt->w->json)
            rf_remote_print_json(stdout, s);
        else
            print_changed_line(wt, s);
    }
    if (wt->last) protobuf_c_message_free_unpacked(&wt->last->base, NULL);
    free(wt->last_packed);
    wt->last = s;
    wt->last_packed = packed;
    wt->last_len = len;
    return RF_OK;
}

static bool run_ended(const watcher *wt) {
    return wt->last && ended(wt->last->state);
}

/* The server gave no status (since t, if it did until now). */
static void went_silent(watcher *wt, double t, const rf_rpc_status *st) {
    wt->err = *st;
    if (wt->down_since >= 0) return;
    wt->down_since = t;
    fprintf(stderr, "refinery %s: no status from %s: %s: %s; asking again", wt->cmd, wt->r->server,
            rf_rpc_status_name(st->code), st->message);
    if (wt->w->unreachable_s > 0)
        fprintf(stderr, " for up to %g s\n", wt->w->unreachable_s);
    else
        fputs(" until it answers\n", stderr);
}

/* A new channel in place of the old one. While the server is away gRPC
 * waits longer and longer (up to 2 minutes) before it tries to connect
 * again, and calls fail at once meanwhile: a server back after 15 s was seen
 * 12 s late. A new channel (the old one gone, and with it the connection it
 * shared) connects when asked. */
static int reconnect(watcher *wt, rf_rpc_status *st) {
    rf_rpc_client *fresh;
    if (rf_remote_connect(wt->r, wt->r->server, wt->cmd, &fresh) < 0) {
        st->code = GRPC_STATUS_UNAVAILABLE;
        snprintf(st->message, sizeof st->message, "%s", rf_errmsg());
        return RF_ERR_IO;
    }
    rf_rpc_client_free(wt->c);
    wt->c = fresh;
    return RF_OK;
}

/* Control.Get: observes the status; < 0 with *st on failure. */
static int get_status(watcher *wt, rf_rpc_status *st) {
    if (wt->down_since >= 0 && reconnect(wt, st) < 0) return RF_ERR_IO;
    rf_remote r = *wt->r;
    /* The call's deadline also bounds a connection that hangs (no refusal). */
    if (wt->w->unreachable_s > 0) {
        double left = wt->w->unreachable_s;
        if (wt->down_since >= 0) left -= rf_now() - wt->down_since;
        if (left < 0.1) left = 0.1;
        if (left < r.timeout_s) r.timeout_s = left;
    }
    Refinery__V1__RunStatus *s = NULL;
    int rc = rf_remote_run_call(wt->c, &r, "Get", wt->run_id, &s, st);
    if (rc < 0) return rc;
    if (wt->down_since >= 0) {
        fprintf(stderr, "refinery %s: %s answers again\n", wt->cmd, wt->r->server);
        wt->pause = PAUSE_MIN_S;
    }
    wt->down_since = -1;
    if ((rc = observe(wt, s)) < 0) {
        st->code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(st->message, sizeof st->message, "out of memory");
    }
    return rc;
}

/* One Control.Watch call of at most timeout_s (0: no deadline): observes
 * every status until the run ends or the call does. */
static int watch_call(watcher *wt, double timeout_s, rf_rpc_status *st) {
    Refinery__V1__RunRef ref = REFINERY__V1__RUN_REF__INIT;
    ref.run_id = (char *)wt->run_id;
    rf_rpc_stream *ws;
    int rc = rf_rpc_stream_open(wt->c, "/refinery.v1.Control/Watch", timeout_s, &ws);
    if (rc < 0) {
        st->code = GRPC_STATUS_UNAVAILABLE;
        snprintf(st->message, sizeof st->message, "%s", rf_errmsg());
        return rc;
    }
    if (rf_rpc_stream_send(ws, &ref.base) == RF_OK) rf_rpc_stream_close_send(ws);
    ProtobufCMessage *m;
    rc = RF_OK;
    while (rc == RF_OK && rf_rpc_stream_recv(ws, &refinery__v1__run_status__descriptor, &m) == 1) {
        wt->pause = PAUSE_MIN_S; /* the watch works */
        rc = observe(wt, (Refinery__V1__RunStatus *)m);
    }
    int done = rf_rpc_stream_finish(ws, st);
    if (rc < 0) {
        st->code = GRPC_STATUS_INTERNAL; /* not RESOURCE_EXHAUSTED: that means polling */
        snprintf(st->message, sizeof st->message, "out of memory");
        return rc;
    }
    return run_ended(wt) ? RF_OK : done;
}

static int give_up_silent(const watcher *wt, double now) {
    fprintf(stderr,
            "refinery %s: giving up: no status from the Control server at %s for %.1f s "
            "(--unreachable-timeout %g); last error: %s: %s\n",
            wt->cmd, wt->r->server, now - wt->down_since, wt->w->unreachable_s,
            rf_rpc_status_name(wt->err.code), wt->err.message);
    return RF_WATCH_UNREACHABLE;
}

static void put_counts(rf_buf *b, const Refinery__V1__StageCounts *c) {
    rf_buf_printf(b, "%s %llu>%llu (batches %llu)", c->stage, (unsigned long long)c->docs_in,
                  (unsigned long long)c->docs_out, (unsigned long long)c->batches);
    if (flagged(c)) rf_buf_printf(b, " [%s: %s]", c->liveness, c->liveness_reason);
}

static int give_up_stalled(const watcher *wt, double now) {
    const Refinery__V1__RunStatus *s = wt->last;
    rf_buf stuck = RF_BUF_INIT, done = RF_BUF_INIT;
    for (size_t i = 0; i < s->n_stages; i++) {
        rf_buf *b = s->stages[i]->complete ? &done : &stuck;
        if (b->len) rf_buf_puts(b, ", ");
        put_counts(b, s->stages[i]);
    }
    time_t at = time(NULL) - (time_t)(now - wt->progress_at);
    struct tm tm;
    char ts[16];
    strftime(ts, sizeof ts, "%H:%M:%S", localtime_r(&at, &tm));
    /* Caught up but not ended: the trainer is training (or died doing so). */
    bool training = false;
    for (size_t i = 0; i < s->n_stages; i++)
        if (!strcmp(s->stages[i]->stage, "trainer")) training = s->stages[i]->complete;
    fprintf(stderr,
            "refinery %s: giving up: run %s (%s%s) made no progress for %.1f s "
            "(--stall-timeout %g), since %s; not moving: %s; complete: %s%s\n",
            wt->cmd, wt->run_id, s->state, s->sealed ? ", sealed" : ", not sealed",
            now - wt->progress_at, wt->w->stall_s, ts,
            stuck.len ? stuck.data : "no stage (the run has not ended)",
            done.len ? done.data : "none",
            training ? "; the trainer has all its input and shows progress only at checkpoints "
                       "(trainer.checkpoint_every): a longer --stall-timeout may be needed"
                     : "");
    rf_buf_free(&stuck);
    rf_buf_free(&done);
    return RF_WATCH_STALLED;
}

static bool transient(grpc_status_code code) {
    return code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_DEADLINE_EXCEEDED;
}

/* The loop: Get (the status now, and whether the server answers), then give
 * up or wait, then Watch until the stall deadline (or Get once a second). */
static int follow(watcher *wt) {
    const rf_watch_opts *w = wt->w;
    for (;;) {
        rf_rpc_status st = {0};
        double t0 = rf_now();
        if (get_status(wt, &st) < 0) {
            if (!transient(st.code)) return rf_remote_report(wt->cmd, &st);
            went_silent(wt, t0, &st);
        }
        if (run_ended(wt)) return RF_OK;
        double now = rf_now();
        if (wt->down_since >= 0) {
            double left = w->unreachable_s - (now - wt->down_since);
            if (w->unreachable_s > 0 && left <= 0) return give_up_silent(wt, now);
            sleep_s(w->unreachable_s > 0 && left < wt->pause ? left : wt->pause);
            wt->pause = fmin(wt->pause * 2, PAUSE_MAX_S);
            continue;
        }
        double stall_left = w->stall_s > 0 ? w->stall_s - (now - wt->progress_at) : RENEW_S;
        if (stall_left <= 0) return give_up_stalled(wt, now);
        if (wt->poll) {
            sleep_s(fmin(POLL_S, stall_left));
            continue;
        }
        int rc = watch_call(wt, fmin(stall_left, RENEW_S), &st);
        if (run_ended(wt)) return RF_OK;
        if (rc < 0 && st.code == GRPC_STATUS_RESOURCE_EXHAUSTED) {
            fprintf(stderr, "refinery %s: %s; polling instead\n", wt->cmd, st.message);
            wt->poll = true;
        } else if (rc == RF_OK || st.code == GRPC_STATUS_UNAVAILABLE) {
            /* Ended early (restarting, its store down, ...): Get says whether it
             * answers. The pause grows until a watch delivers again, so a server
             * that takes Gets but ends each Watch at once is not asked in a loop. */
            sleep_s(wt->pause);
            wt->pause = fmin(wt->pause * 2, PAUSE_MAX_S);
        } else if (st.code != GRPC_STATUS_DEADLINE_EXCEEDED) { /* the deadline: Get checks */
            return rf_remote_report(wt->cmd, &st);
        }
    }
}

int rf_remote_watch(const rf_remote *r, const char *cmd, const char *run_id,
                    const rf_watch_opts *w) {
    watcher wt = {.r = r, .w = w, .cmd = cmd, .run_id = run_id};
    if (rf_remote_connect(r, r->server, cmd, &wt.c) < 0) return RF_WATCH_ENDED_BADLY;
    wt.progress_at = rf_now();
    wt.down_since = -1;
    wt.pause = PAUSE_MIN_S;
    int rc = follow(&wt);
    if (rc == RF_OK) {
        if (strcmp(wt.last->state, "succeeded") != 0) {
            fprintf(stderr, "refinery %s: run %s %s%s%s\n", cmd, run_id, wt.last->state,
                    wt.last->error[0] ? ": " : "", wt.last->error);
            rc = RF_WATCH_ENDED_BADLY;
        }
    }
    if (wt.last) protobuf_c_message_free_unpacked(&wt.last->base, NULL);
    free(wt.last_packed);
    free(wt.last_line);
    rf_rpc_client_free(wt.c);
    return rc;
}
