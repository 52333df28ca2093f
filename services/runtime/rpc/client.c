/* Blocking client calls: each stream has its own pluck completion queue. */
#include "runtime/rpc/client.h"

#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "runtime/rpc/wire.h"

struct rf_rpc_client {
    grpc_channel *channel;
};

struct rf_rpc_stream {
    grpc_call *call;
    grpc_completion_queue *cq;
    grpc_metadata_array initial_md;
    int got_initial_md;
};

int rf_rpc_client_new(const char *target, const rf_rpc_tls *tls, size_t max_message,
                      rf_rpc_client **out) {
    *out = NULL;
    if (!max_message) max_message = RF_RPC_DEFAULT_MAX_MESSAGE;
    if (max_message > (size_t)INT32_MAX)
        return rf_fail(RF_ERR_RANGE, "rpc: max_message %zu too large", max_message);
    rf_rpc_client *c = calloc(1, sizeof *c);
    if (!c) return RF_ERR_NOMEM;
    rf_rpc_log_install();
    grpc_init();
    grpc_channel_credentials *creds;
    int rc = rf_rpc_channel_creds(tls, &creds);
    if (rc < 0) {
        free(c);
        grpc_shutdown();
        return rc;
    }
    grpc_arg a[3] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH},
        {.type = GRPC_ARG_STRING, .key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG},
    };
    a[0].value.integer = a[1].value.integer = (int)max_message;
    size_t nargs = 2;
    if (tls && tls->server_name) a[nargs++].value.string = (char *)tls->server_name;
    grpc_channel_args args = {.num_args = nargs, .args = a};
    c->channel = grpc_channel_create(target, creds, &args);
    grpc_channel_credentials_release(creds);
    *out = c;
    return RF_OK;
}

void rf_rpc_client_free(rf_rpc_client *c) {
    if (!c) return;
    grpc_channel_destroy(c->channel);
    free(c);
    grpc_shutdown();
}

static int batch(rf_rpc_stream *st, const grpc_op *ops, size_t n) {
    int tag;
    if (grpc_call_start_batch(st->call, ops, n, &tag, NULL) != GRPC_CALL_OK) return 0;
    grpc_event ev =
        grpc_completion_queue_pluck(st->cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

int rf_rpc_stream_open_md(rf_rpc_client *c, const char *method, double timeout_s,
                          const char *const *metadata, rf_rpc_stream **out) {
    *out = NULL;
    size_t nmd = 0;
    while (metadata && metadata[2 * nmd])
        nmd++;
    if (nmd > 16) return rf_fail(RF_ERR_RANGE, "rpc: more than 16 metadata entries");
    rf_rpc_stream *st = calloc(1, sizeof *st);
    if (!st) return RF_ERR_NOMEM;
    st->cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_metadata_array_init(&st->initial_md);
    grpc_slice m = grpc_slice_from_copied_string(method);
    st->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, st->cq, m, NULL,
                                        rf_rpc_deadline_in(timeout_s), NULL);
    grpc_slice_unref(m);
    *out = st;
    grpc_metadata md[16];
    for (size_t i = 0; i < nmd; i++) {
        md[i] = (grpc_metadata){0};
        md[i].key = grpc_slice_from_copied_string(metadata[2 * i]);
        md[i].value = grpc_slice_from_copied_string(metadata[2 * i + 1] ? metadata[2 * i + 1] : "");
    }
    grpc_op op = {.op = GRPC_OP_SEND_INITIAL_METADATA};
    op.data.send_initial_metadata.count = nmd;
    op.data.send_initial_metadata.metadata = nmd ? md : NULL;
    /* A failure here (e.g. deadline already past) shows in finish's status. */
    batch(st, &op, 1);
    for (size_t i = 0; i < nmd; i++) {
        grpc_slice_unref(md[i].key);
        grpc_slice_unref(md[i].value);
    }
    return RF_OK;
}

int rf_rpc_stream_open(rf_rpc_client *c, const char *method, double timeout_s,
                       rf_rpc_stream **out) {
    return rf_rpc_stream_open_md(c, method, timeout_s, NULL, out);
}

static int send_bb(rf_rpc_stream *st, grpc_byte_buffer *bb) {
    grpc_op op = {.op = GRPC_OP_SEND_MESSAGE};
    op.data.send_message.send_message = bb;
    int ok = batch(st, &op, 1);
    grpc_byte_buffer_destroy(bb);
    return ok ? RF_OK : rf_fail(RF_ERR_IO, "rpc: send failed: the call has ended");
}

int rf_rpc_stream_send(rf_rpc_stream *st, const ProtobufCMessage *msg) {
    return send_bb(st, rf_rpc_pack(msg));
}

int rf_rpc_stream_send_raw(rf_rpc_stream *st, const void *data, size_t len) {
    return send_bb(st, rf_rpc_pack_raw(data, len));
}

int rf_rpc_stream_close_send(rf_rpc_stream *st) {
    grpc_op op = {.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT};
    return batch(st, &op, 1) ? RF_OK : rf_fail(RF_ERR_IO, "rpc: close failed: the call has ended");
}

int rf_rpc_stream_recv(rf_rpc_stream *st, const ProtobufCMessageDescriptor *d,
                       ProtobufCMessage **msg) {
    *msg = NULL;
    grpc_byte_buffer *bb = NULL;
    grpc_op ops[2] = {{.op = GRPC_OP_RECV_INITIAL_METADATA}, {.op = GRPC_OP_RECV_MESSAGE}};
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &st->initial_md;
    ops[1].data.recv_message.recv_message = &bb;
    size_t first = st->got_initial_md ? 1 : 0;
    int ok = batch(st, ops + first, 2 - first);
    st->got_initial_md = 1;
    if (!ok) return rf_fail(RF_ERR_IO, "rpc: receive failed: the call has ended");
    if (!bb) return 0;
    int rc = rf_rpc_unpack(bb, d, msg);
    grpc_byte_buffer_destroy(bb);
    return rc < 0 ? rc : 1;
}

int rf_rpc_stream_finish(rf_rpc_stream *st, rf_rpc_status *status) {
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_metadata_array trailing;
    grpc_metadata_array_init(&trailing);
    grpc_op ops[2] = {{.op = GRPC_OP_RECV_INITIAL_METADATA}, {.op = GRPC_OP_RECV_STATUS_ON_CLIENT}};
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &st->initial_md;
    ops[1].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[1].data.recv_status_on_client.status = &code;
    ops[1].data.recv_status_on_client.status_details = &details;
    size_t first = st->got_initial_md ? 1 : 0;
    if (!batch(st, ops + first, 2 - first)) code = GRPC_STATUS_INTERNAL;
    if (status) {
        status->code = code;
        int n = (int)GRPC_SLICE_LENGTH(details);
        snprintf(status->message, sizeof status->message, "%.*s", n,
                 (const char *)GRPC_SLICE_START_PTR(details));
    }
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&trailing);
    grpc_metadata_array_destroy(&st->initial_md);
    grpc_call_unref(st->call);
    grpc_completion_queue_shutdown(st->cq);
    grpc_completion_queue_pluck(st->cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_completion_queue_destroy(st->cq);
    free(st);
    return code == GRPC_STATUS_OK ? RF_OK : RF_ERR_IO;
}

/* One batch with every op of the call, so a unary call costs one completion
 * (one wakeup) rather than one per step as through the stream functions. */
int rf_rpc_unary(rf_rpc_client *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                 double timeout_s, rf_rpc_status *status) {
    *resp = NULL;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m,
                                               NULL, rf_rpc_deadline_in(timeout_s), NULL);
    grpc_slice_unref(m);
    grpc_byte_buffer *out = rf_rpc_pack(req), *in = NULL;
    grpc_metadata_array initial_md, trailing;
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6] = {
        {.op = GRPC_OP_SEND_INITIAL_METADATA},  {.op = GRPC_OP_SEND_MESSAGE},
        {.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT}, {.op = GRPC_OP_RECV_INITIAL_METADATA},
        {.op = GRPC_OP_RECV_MESSAGE},           {.op = GRPC_OP_RECV_STATUS_ON_CLIENT}};
    ops[1].data.send_message.send_message = out;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].data.recv_message.recv_message = &in;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    int tag;
    if (grpc_call_start_batch(call, ops, 6, &tag, NULL) == GRPC_CALL_OK) {
        grpc_event ev =
            grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE || (!ev.success && code == GRPC_STATUS_OK))
            code = GRPC_STATUS_INTERNAL;
    } else {
        code = GRPC_STATUS_INTERNAL;
    }
    char message[256];
    int n = (int)GRPC_SLICE_LENGTH(details);
    snprintf(message, sizeof message, "%.*s", n, (const char *)GRPC_SLICE_START_PTR(details));
    int rc = RF_OK;
    if (code != GRPC_STATUS_OK) {
        rc = rf_fail(RF_ERR_IO, "rpc: %s: %s: %s", method, rf_rpc_status_name(code), message);
    } else if (!in || rf_rpc_unpack(in, resp_desc, resp) < 0) {
        *resp = NULL;
        code = GRPC_STATUS_INTERNAL;
        snprintf(message, sizeof message, "no or undecodable response");
        rc = rf_fail(RF_ERR_PARSE, "rpc: %s: no or undecodable response", method);
    }
    if (status) {
        status->code = code;
        snprintf(status->message, sizeof status->message, "%s", message);
    }
    grpc_byte_buffer_destroy(out);
    if (in) grpc_byte_buffer_destroy(in);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_completion_queue_destroy(cq);
    return rc;
}
