/* Shared client plumbing of the service commands (see remote.h). */
#include "cli/remote.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/error.h"

#define WATCH_RETRIES 60 /* reconnections of a broken watch, one second apart */

const char rf_remote_usage[] =
    "server:    --server HOST:PORT (REFINERY_SERVER, default 127.0.0.1:7101)\n"
    "           --evaluator HOST:PORT (REFINERY_EVALUATOR, default 127.0.0.1:7105)\n"
    "           --tls-ca PEM  --tls-cert PEM  --tls-key PEM  --tls-server-name NAME\n"
    "           --timeout SECONDS (each unary call, default 30)\n";

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
                      "\"duplicate\":%llu,\"complete\":%s}",
                      (unsigned long long)c->batches, (unsigned long long)c->docs_in,
                      (unsigned long long)c->docs_out, (unsigned long long)c->rejected,
                      (unsigned long long)c->duplicate, c->complete ? "true" : "false");
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
    }
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

/* One Watch call: prints every status; *state gets the last one's state. */
static int watch_once(rf_rpc_client *c, const char *run_id, bool json, char *state, size_t size,
                      rf_rpc_status *st) {
    Refinery__V1__RunRef ref = REFINERY__V1__RUN_REF__INIT;
    ref.run_id = (char *)run_id;
    rf_rpc_stream *ws;
    int rc = rf_rpc_stream_open(c, "/refinery.v1.Control/Watch", 0, &ws);
    if (rc < 0) {
        st->code = GRPC_STATUS_UNAVAILABLE;
        snprintf(st->message, sizeof st->message, "%s", rf_errmsg());
        return rc;
    }
    if (rf_rpc_stream_send(ws, &ref.base) == RF_OK) rf_rpc_stream_close_send(ws);
    ProtobufCMessage *m;
    while (rf_rpc_stream_recv(ws, &refinery__v1__run_status__descriptor, &m) == 1) {
        const Refinery__V1__RunStatus *s = (const Refinery__V1__RunStatus *)m;
        snprintf(state, size, "%s", s->state);
        if (json)
            rf_remote_print_json(stdout, s);
        else
            rf_remote_print_line(stdout, s);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    return rf_rpc_stream_finish(ws, st);
}

static bool ended(const char *state) {
    return !strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled");
}

/* When the server has no room for another watch: Control.Get once a second,
 * printing the status when it changes. */
static int poll_status(rf_rpc_client *c, const char *run_id, bool json, char *state, size_t size,
                       rf_rpc_status *st) {
    rf_remote r;
    rf_remote_init(&r);
    uint8_t *last = NULL;
    size_t last_len = 0;
    int rc = RF_OK;
    while (!ended(state)) {
        Refinery__V1__RunStatus *s;
        if ((rc = rf_remote_run_call(c, &r, "Get", run_id, &s, st)) < 0) break;
        size_t len = refinery__v1__run_status__get_packed_size(s);
        uint8_t *now = malloc(len ? len : 1);
        if (!now) {
            protobuf_c_message_free_unpacked(&s->base, NULL);
            rc = RF_ERR_NOMEM;
            break;
        }
        refinery__v1__run_status__pack(s, now);
        if (!last || len != last_len || memcmp(now, last, len) != 0) {
            snprintf(state, size, "%s", s->state);
            if (json)
                rf_remote_print_json(stdout, s);
            else
                rf_remote_print_line(stdout, s);
        }
        free(last);
        last = now;
        last_len = len;
        protobuf_c_message_free_unpacked(&s->base, NULL);
        if (!ended(state)) sleep(1);
    }
    free(last);
    return rc;
}

int rf_remote_watch(rf_rpc_client *c, const char *cmd, const char *run_id, bool json) {
    char state[32] = "";
    rf_rpc_status st = {0};
    for (int attempt = 0;; attempt++) {
        int rc = watch_once(c, run_id, json, state, sizeof state, &st);
        if (rc < 0 && st.code == GRPC_STATUS_RESOURCE_EXHAUSTED) {
            fprintf(stderr, "refinery %s: %s; polling instead\n", cmd, st.message);
            rc = poll_status(c, run_id, json, state, sizeof state, &st);
        }
        if (ended(state)) break;
        /* Only an unavailable server (restarting, store down) is worth waiting for. */
        bool retry = (rc == RF_OK || st.code == GRPC_STATUS_UNAVAILABLE) && attempt < WATCH_RETRIES;
        if (!retry) return rc < 0 ? rf_remote_report(cmd, &st) : 1;
        if (rc < 0) fprintf(stderr, "refinery %s: %s; watching again\n", cmd, st.message);
        sleep(1);
    }
    if (!strcmp(state, "succeeded")) return 0;
    fprintf(stderr, "refinery %s: run %s %s\n", cmd, run_id, state);
    return 1;
}
