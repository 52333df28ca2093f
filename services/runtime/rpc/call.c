/* Operations a handler runs on its call, each a blocking batch on the worker's
 * pluck queue. */
#include <grpc/support/time.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "runtime/rpc/internal.h"
#include "runtime/rpc/wire.h"

int rpc_call_batch(rf_rpc_call *call, const grpc_op *ops, size_t n) {
    int tag; /* any unique address */
    if (grpc_call_start_batch(call->grpc, ops, n, &tag, NULL) != GRPC_CALL_OK) return 0;
    grpc_event ev =
        grpc_completion_queue_pluck(call->cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

int rf_rpc_recv(rf_rpc_call *call, ProtobufCMessage **msg) {
    *msg = NULL;
    grpc_byte_buffer *bb = NULL;
    grpc_op op = {.op = GRPC_OP_RECV_MESSAGE};
    op.data.recv_message.recv_message = &bb;
    if (!rpc_call_batch(call, &op, 1)) {
        rf_rpc_fail(call, GRPC_STATUS_CANCELLED, "call ended while receiving");
        return RF_ERR_CANCELED;
    }
    if (!bb) return 0; /* the client closed its side */
    size_t len = grpc_byte_buffer_length(bb);
    if (len > call->max_message) {
        grpc_byte_buffer_destroy(bb);
        rf_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "message of %zu bytes, the limit is %zu",
                    len, call->max_message);
        return RF_ERR_RANGE;
    }
    int rc = rf_rpc_unpack(bb, call->method->request, msg);
    grpc_byte_buffer_destroy(bb);
    if (rc < 0) {
        rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s", rf_errmsg());
        return rc;
    }
    return 1;
}

int rf_rpc_send(rf_rpc_call *call, const ProtobufCMessage *msg) {
    if (call->method->kind != RF_RPC_SERVER_STREAM) {
        /* Held back and sent together with the status. */
        if (call->reply) {
            rf_rpc_fail(call, GRPC_STATUS_INTERNAL, "handler sent two responses");
            return RF_ERR_INTERNAL;
        }
        call->reply = rf_rpc_pack(msg);
        return RF_OK;
    }
    grpc_op ops[2] = {{.op = GRPC_OP_SEND_INITIAL_METADATA}, {.op = GRPC_OP_SEND_MESSAGE}};
    grpc_byte_buffer *bb = rf_rpc_pack(msg);
    ops[1].data.send_message.send_message = bb;
    size_t first = call->initial_md_sent ? 1 : 0;
    int ok = rpc_call_batch(call, ops + first, 2 - first);
    grpc_byte_buffer_destroy(bb);
    call->initial_md_sent = 1;
    if (!ok) {
        rf_rpc_fail(call, GRPC_STATUS_CANCELLED, "call ended while sending");
        return RF_ERR_CANCELED;
    }
    return RF_OK;
}

grpc_status_code rf_rpc_fail(rf_rpc_call *call, grpc_status_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call->detail, sizeof call->detail, fmt, ap);
    va_end(ap);
    call->code = code;
    return code;
}

grpc_status_code rf_rpc_call_status(const rf_rpc_call *call) {
    return call->code;
}

double rf_rpc_time_left(const rf_rpc_call *call) {
    gpr_timespec now = gpr_now(call->deadline.clock_type);
    if (gpr_time_cmp(call->deadline, gpr_inf_future(call->deadline.clock_type)) == 0) return 1e9;
    gpr_timespec left = gpr_time_sub(call->deadline, now);
    return (double)left.tv_sec + left.tv_nsec * 1e-9;
}

int rf_rpc_call_done(rf_rpc_call *call) {
    if (!call->closed && call->close_started) {
        grpc_event ev = grpc_completion_queue_pluck(call->cq, &call->close_tag,
                                                    gpr_time_0(GPR_CLOCK_REALTIME), NULL);
        call->closed = ev.type == GRPC_OP_COMPLETE;
    }
    return call->closed;
}

const char *rf_rpc_metadata(const rf_rpc_call *call, const char *key, char *buf, size_t size) {
    size_t klen = strlen(key);
    for (size_t i = 0; i < call->metadata->count; i++) {
        const grpc_metadata *m = &call->metadata->metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) != klen || memcmp(GRPC_SLICE_START_PTR(m->key), key, klen))
            continue;
        snprintf(buf, size, "%.*s", (int)GRPC_SLICE_LENGTH(m->value),
                 (const char *)GRPC_SLICE_START_PTR(m->value));
        return buf;
    }
    return NULL;
}

const char *rf_rpc_method_path(const rf_rpc_call *call) {
    return call->method->path;
}

const char *rf_rpc_status_name(grpc_status_code code) {
    static const char *const names[] = {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if ((unsigned)code < sizeof names / sizeof names[0]) return names[code];
    return "UNKNOWN";
}
