/* Server lifecycle, the worker pool and per-method dispatch. */
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/obs.h"
#include "common/sys.h"
#include "runtime/rpc/internal.h"
#include "runtime/rpc/wire.h"

static char *dup_or_null(const char *s) {
    return s ? strdup(s) : NULL;
}

int rf_rpc_server_new(const rf_rpc_server_opts *opts, rf_rpc_server **out) {
    *out = NULL;
    if (!opts->listen || !*opts->listen) return rf_fail(RF_ERR_INVALID, "rpc: no listen address");
    rf_rpc_server *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    rf_rpc_log_install();
    grpc_init();
    pthread_mutex_init(&s->health_mu, NULL);
    pthread_cond_init(&s->health_cv, NULL);
    s->nworkers = opts->workers > 0 ? opts->workers : 4;
    s->max_message = opts->max_message ? opts->max_message : RF_RPC_DEFAULT_MAX_MESSAGE;
    s->listen = strdup(opts->listen);
    s->tls.cert_file = dup_or_null(opts->tls.cert_file);
    s->tls.key_file = dup_or_null(opts->tls.key_file);
    s->tls.ca_file = dup_or_null(opts->tls.ca_file);
    s->stats = rf_stats_new();
    *out = s;
    if (!s->listen || !s->stats || (opts->tls.cert_file && !s->tls.cert_file) ||
        (opts->tls.key_file && !s->tls.key_file) || (opts->tls.ca_file && !s->tls.ca_file)) {
        rf_rpc_server_free(s);
        *out = NULL;
        return RF_ERR_NOMEM;
    }
    int rc = rpc_health_register(s);
    if (rc < 0) {
        rf_rpc_server_free(s);
        *out = NULL;
    }
    return rc;
}

int rf_rpc_server_add(rf_rpc_server *s, const rf_rpc_method *m) {
    if (s->started) return rf_fail(RF_ERR_INVALID, "rpc: %s added after start", m->path);
    if (!m->path || m->path[0] != '/' || !m->handler || !m->request)
        return rf_fail(RF_ERR_INVALID, "rpc: incomplete method definition");
    for (size_t i = 0; i < s->nmethods; i++)
        if (strcmp(s->methods[i].path, m->path) == 0)
            return rf_fail(RF_ERR_INVALID, "rpc: %s added twice", m->path);
    rf_rpc_method *grown = realloc(s->methods, (s->nmethods + 1) * sizeof *grown);
    if (!grown) return RF_ERR_NOMEM;
    s->methods = grown;
    rf_rpc_method *slot = &s->methods[s->nmethods];
    *slot = *m;
    if (!(slot->path = strdup(m->path))) return RF_ERR_NOMEM;
    s->nmethods++;
    return RF_OK;
}

static const rf_rpc_method *find_method(const rf_rpc_server *s, grpc_slice path) {
    size_t n = GRPC_SLICE_LENGTH(path);
    const char *p = (const char *)GRPC_SLICE_START_PTR(path);
    for (size_t i = 0; i < s->nmethods; i++)
        if (strlen(s->methods[i].path) == n && memcmp(s->methods[i].path, p, n) == 0)
            return &s->methods[i];
    return NULL;
}

/* "/refinery.v1.Ingest/Push" is counted as "rpc.Ingest.Push.<STATUS>": the
 * stats tree splits names on dots, so the package is left out. */
static void count_status(rf_rpc_server *s, const char *path, grpc_status_code code) {
    const char *slash = strrchr(path, '/');
    const char *service = slash ? slash : path;
    while (service > path && service[-1] != '.' && service[-1] != '/')
        service--;
    char name[320];
    if (slash)
        snprintf(name, sizeof name, "rpc.%.*s.%s.%s", (int)(slash - service), service, slash + 1,
                 rf_rpc_status_name(code));
    else
        snprintf(name, sizeof name, "rpc.%s.%s", path, rf_rpc_status_name(code));
    rf_stats_add(s->stats, name, 1);
}

/* Runs one call to its end: request, handler, status. */
static void serve_call(rf_rpc_server *s, rpc_worker *w, grpc_call *gc, const grpc_call_details *det,
                       const grpc_metadata_array *md) {
    double t0 = rf_now();
    rf_rpc_method unknown = {.path = "unknown"};
    const rf_rpc_method *m = find_method(s, det->method);
    rf_rpc_call call = {.grpc = gc,
                        .cq = w->call_cq,
                        .method = m ? m : &unknown,
                        .metadata = md,
                        .deadline = det->deadline,
                        .max_message = s->max_message,
                        .code = GRPC_STATUS_OK};

    /* Completes when the call is over; tells whether it was cancelled. */
    grpc_op close_op = {.op = GRPC_OP_RECV_CLOSE_ON_SERVER};
    close_op.data.recv_close_on_server.cancelled = &call.cancelled;
    call.close_started =
        grpc_call_start_batch(gc, &close_op, 1, &call.close_tag, NULL) == GRPC_CALL_OK;

    ProtobufCMessage *req = NULL;
    if (!m) {
        int n = (int)GRPC_SLICE_LENGTH(det->method);
        rf_rpc_fail(&call, GRPC_STATUS_UNIMPLEMENTED, "unknown method %.*s", n,
                    (const char *)GRPC_SLICE_START_PTR(det->method));
    } else if (m->kind != RF_RPC_CLIENT_STREAM) {
        int r = rf_rpc_recv(&call, &req);
        if (r == 0)
            rf_rpc_fail(&call, GRPC_STATUS_INVALID_ARGUMENT, "%s: no request message", m->path);
    }
    if (call.code == GRPC_STATUS_OK) {
        grpc_status_code code = m->handler(&call, req, m->user);
        if (code != GRPC_STATUS_OK && call.code == GRPC_STATUS_OK)
            rf_rpc_fail(&call, code, "%s", rf_rpc_status_name(code));
        else if (code == GRPC_STATUS_OK && call.code == GRPC_STATUS_OK && !call.reply &&
                 m->kind != RF_RPC_SERVER_STREAM)
            rf_rpc_fail(&call, GRPC_STATUS_INTERNAL, "%s: handler sent no response", m->path);
    }
    if (req) protobuf_c_message_free_unpacked(req, NULL);

    grpc_op ops[3];
    size_t n = 0;
    if (!call.initial_md_sent) ops[n++] = (grpc_op){.op = GRPC_OP_SEND_INITIAL_METADATA};
    if (call.reply && call.code == GRPC_STATUS_OK) {
        ops[n] = (grpc_op){.op = GRPC_OP_SEND_MESSAGE};
        ops[n++].data.send_message.send_message = call.reply;
    }
    grpc_slice detail = grpc_slice_from_copied_string(call.detail);
    ops[n] = (grpc_op){.op = GRPC_OP_SEND_STATUS_FROM_SERVER};
    ops[n].data.send_status_from_server.status = call.code;
    ops[n++].data.send_status_from_server.status_details = call.code ? &detail : NULL;
    rpc_call_batch(&call, ops, n);
    grpc_slice_unref(detail);
    if (call.reply) grpc_byte_buffer_destroy(call.reply);
    if (call.close_started && !call.closed)
        grpc_completion_queue_pluck(w->call_cq, &call.close_tag, gpr_inf_future(GPR_CLOCK_REALTIME),
                                    NULL);
    /* A call the client cancelled or that ran past its deadline reports that,
     * whatever the handler returned. */
    grpc_status_code final = call.code;
    if (call.cancelled && final == GRPC_STATUS_OK) final = GRPC_STATUS_CANCELLED;
    if (call.cancelled && rf_rpc_time_left(&call) <= 0) final = GRPC_STATUS_DEADLINE_EXCEEDED;
    count_status(s, call.method->path, final);
    rf_obs_grpc(call.method->path, rf_rpc_status_name(final), rf_now() - t0);
    if (final != GRPC_STATUS_OK)
        rf_debug("rpc", "%s -> %s: %s", call.method->path, rf_rpc_status_name(final), call.detail);
}

static void *worker_main(void *arg) {
    rpc_worker *w = arg;
    for (;;) {
        grpc_call *gc = NULL;
        grpc_call_details det;
        grpc_metadata_array md;
        grpc_call_details_init(&det);
        grpc_metadata_array_init(&md);
        int got = 0;
        if (grpc_server_request_call(w->server->grpc, &gc, &det, &md, w->call_cq, w->notify_cq,
                                     w) == GRPC_CALL_OK) {
            grpc_event ev =
                grpc_completion_queue_next(w->notify_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            got = ev.type == GRPC_OP_COMPLETE && ev.success;
        }
        if (got) serve_call(w->server, w, gc, &det, &md);
        if (gc) grpc_call_unref(gc);
        grpc_call_details_destroy(&det);
        grpc_metadata_array_destroy(&md);
        if (!got) break; /* the server is shutting down */
    }
    return NULL;
}

int rf_rpc_server_start(rf_rpc_server *s) {
    if (s->started) return rf_fail(RF_ERR_INVALID, "rpc: server already started");
    if (s->max_message > (size_t)INT32_MAX)
        return rf_fail(RF_ERR_RANGE, "rpc: max_message %zu too large", s->max_message);
    /* Messages up to 4x the limit reach rf_rpc_recv, which refuses them with
     * RESOURCE_EXHAUSTED and counts them; the core drops larger ones itself
     * (also RESOURCE_EXHAUSTED for the client, counted here as CANCELLED). */
    size_t hard = s->max_message > (size_t)INT32_MAX / 4 ? (size_t)INT32_MAX : 4 * s->max_message;
    /* gRPC core sets SO_REUSEPORT by default: a second server on a busy port
     * would then bind too and split the traffic. Off, binding fails. */
    grpc_arg a[3] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT},
    };
    a[0].value.integer = (int)hard;
    a[1].value.integer = (int)s->max_message;
    a[2].value.integer = 0;
    grpc_channel_args args = {.num_args = 3, .args = a};
    s->grpc = grpc_server_create(&args, NULL);
    s->workers = calloc((size_t)s->nworkers, sizeof *s->workers);
    if (!s->grpc || !s->workers) return RF_ERR_NOMEM;
    for (int i = 0; i < s->nworkers; i++) {
        rpc_worker *w = &s->workers[i];
        w->server = s;
        w->notify_cq = grpc_completion_queue_create_for_next(NULL);
        w->call_cq = grpc_completion_queue_create_for_pluck(NULL);
        grpc_server_register_completion_queue(s->grpc, w->notify_cq, NULL);
    }
    grpc_server_credentials *creds;
    int rc = rf_rpc_server_creds(&s->tls, &creds);
    if (rc < 0) return rc;
    s->port = grpc_server_add_http2_port(s->grpc, s->listen, creds);
    grpc_server_credentials_release(creds);
    if (s->port <= 0)
        return rf_fail(RF_ERR_IO,
                       "rpc: cannot listen on %s (address already in use, or not a local address)",
                       s->listen);
    grpc_server_start(s->grpc);
    s->started = 1;
    s->nthreads = s->nworkers;
    for (int i = 0; i < s->nworkers; i++) {
        if (pthread_create(&s->workers[i].thread, NULL, worker_main, &s->workers[i]) != 0) {
            s->nthreads = i;
            rf_rpc_server_stop(s, 0);
            return rf_fail(RF_ERR_INTERNAL, "rpc: cannot start worker threads");
        }
    }
    rf_info("rpc", "listening on port %d (%s, %d workers, max message %zu bytes)", s->port,
            s->tls.cert_file ? (s->tls.ca_file ? "mutual TLS" : "TLS") : "plaintext", s->nworkers,
            s->max_message);
    return RF_OK;
}

int rf_rpc_server_port(const rf_rpc_server *s) {
    return s->port;
}

rf_stats *rf_rpc_server_stats(rf_rpc_server *s) {
    return s->stats;
}

void rf_rpc_server_stop(rf_rpc_server *s, double grace_s) {
    if (!s->started || s->stopped) return;
    s->stopped = 1;
    rf_rpc_server_set_health(s, "", 0);
    rpc_health_close(s);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    int tag;
    grpc_server_shutdown_and_notify(s->grpc, cq, &tag);
    grpc_event ev = grpc_completion_queue_pluck(cq, &tag, rf_rpc_deadline_in(grace_s), NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        grpc_server_cancel_all_calls(s->grpc);
        grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    }
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_completion_queue_destroy(cq);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->workers[i].thread, NULL);
}

static void drain_destroy(grpc_completion_queue *cq, int pluck) {
    if (!cq) return;
    grpc_completion_queue_shutdown(cq);
    gpr_timespec inf = gpr_inf_future(GPR_CLOCK_REALTIME);
    if (pluck) {
        grpc_completion_queue_pluck(cq, NULL, inf, NULL);
    } else {
        while (grpc_completion_queue_next(cq, inf, NULL).type != GRPC_QUEUE_SHUTDOWN) {
        }
    }
    grpc_completion_queue_destroy(cq);
}

void rf_rpc_server_free(rf_rpc_server *s) {
    if (!s) return;
    rf_rpc_server_stop(s, 0);
    if (s->grpc) grpc_server_destroy(s->grpc);
    if (s->workers) {
        for (int i = 0; i < s->nworkers; i++) {
            drain_destroy(s->workers[i].notify_cq, 0);
            drain_destroy(s->workers[i].call_cq, 1);
        }
    }
    free(s->workers);
    for (size_t i = 0; i < s->nmethods; i++)
        free((char *)s->methods[i].path);
    free(s->methods);
    rpc_health_free(s);
    pthread_mutex_destroy(&s->health_mu);
    pthread_cond_destroy(&s->health_cv);
    rf_stats_free(s->stats);
    free(s->listen);
    free((char *)s->tls.cert_file);
    free((char *)s->tls.key_file);
    free((char *)s->tls.ca_file);
    free(s);
    grpc_shutdown();
}
