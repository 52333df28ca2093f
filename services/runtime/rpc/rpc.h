/* gRPC server on the gRPC C core with protobuf-c messages.
 *
 * A server owns a pool of worker threads. Each worker has its own completion
 * queue pair, asks the core for the next call, runs that call's handler to the
 * end with blocking operations, then asks for the next one: at most `workers`
 * calls run at once and further calls wait in the core (backpressure).
 * Methods are looked up by their full path ("/refinery.v1.Ingest/Push") in a
 * table filled before start. Every server also answers the standard
 * /grpc.health.v1.Health/Check.
 *
 * Status codes the framework produces by itself:
 *   UNIMPLEMENTED       unknown method path
 *   INVALID_ARGUMENT    a request that is not a valid protobuf of the method's type
 *   RESOURCE_EXHAUSTED  a request larger than max_message
 *   DEADLINE_EXCEEDED   the client's deadline passed (enforced by the core)
 * Each finished call is counted in the server's stats as
 * "rpc.<Service>.<Method>.<STATUS_NAME>" (e.g. "rpc.Ingest.Push.OK"; calls to
 * unknown methods as "rpc.unknown.UNIMPLEMENTED"). */
#ifndef RF_RPC_H
#define RF_RPC_H

#include <grpc/grpc.h>
#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

#include "common/stats.h"

typedef struct rf_rpc_server rf_rpc_server;
typedef struct rf_rpc_call rf_rpc_call;

typedef enum rf_rpc_kind {
    RF_RPC_UNARY,         /* one request, one response */
    RF_RPC_CLIENT_STREAM, /* handler reads requests with rf_rpc_recv, sends one response */
    RF_RPC_SERVER_STREAM, /* one request, handler sends any number of responses */
} rf_rpc_kind;

/* A handler returns the call's status: GRPC_STATUS_OK after sending its
 * response(s), or the value of rf_rpc_fail(). For UNARY and SERVER_STREAM the
 * decoded request is in req (owned by the framework); for CLIENT_STREAM req is
 * NULL. */
typedef grpc_status_code (*rf_rpc_handler)(rf_rpc_call *call, const ProtobufCMessage *req,
                                           void *user);

typedef struct rf_rpc_method {
    const char *path; /* copied by rf_rpc_server_add */
    rf_rpc_kind kind;
    const ProtobufCMessageDescriptor *request;
    rf_rpc_handler handler;
    void *user;
} rf_rpc_method;

/* TLS files (PEM). Server: cert+key enable TLS; ca additionally requires and
 * verifies client certificates (mutual TLS). Client: ca verifies the server
 * (system roots when NULL); cert+key present a client certificate.
 * All NULL: plaintext. */
typedef struct rf_rpc_tls {
    const char *cert_file;
    const char *key_file;
    const char *ca_file;
    const char *server_name; /* client only: name to verify instead of the target host */
} rf_rpc_tls;

typedef struct rf_rpc_server_opts {
    const char *listen; /* "127.0.0.1:0" picks a free port */
    int workers;        /* concurrent calls; <= 0 means 4 */
    size_t max_message; /* bytes, both directions; 0 means 4 MiB */
    rf_rpc_tls tls;
} rf_rpc_server_opts;

#define RF_RPC_DEFAULT_MAX_MESSAGE (4u << 20)

/* Routes gRPC core's log through common/log.h (component "grpc"; DEBUG,
 * INFO, ERROR map to debug, info, error). Idempotent; rf_rpc_server_new and
 * rf_rpc_client_new call it. rf_rpc_log_hook is the gpr_log_func itself. */
void rf_rpc_log_install(void);
struct gpr_log_func_args;
void rf_rpc_log_hook(struct gpr_log_func_args *args);

int rf_rpc_server_new(const rf_rpc_server_opts *opts, rf_rpc_server **out);
/* Adds a method; only before rf_rpc_server_start. */
int rf_rpc_server_add(rf_rpc_server *s, const rf_rpc_method *m);
/* Binds, starts the workers. */
int rf_rpc_server_start(rf_rpc_server *s);
/* The bound port (after start). */
int rf_rpc_server_port(const rf_rpc_server *s);
/* Health of a named service ("" is the whole server, SERVING after start).
 * serving=0 reports NOT_SERVING. Unknown names answer NOT_FOUND. */
int rf_rpc_server_set_health(rf_rpc_server *s, const char *service, int serving);
/* Counters of finished calls; owned by the server. */
rf_stats *rf_rpc_server_stats(rf_rpc_server *s);
/* Stops accepting calls, lets running calls finish for up to grace_s seconds,
 * then cancels the rest and joins the workers. Idempotent. */
void rf_rpc_server_stop(rf_rpc_server *s, double grace_s);
/* Stops (grace 0) if needed and frees. */
void rf_rpc_server_free(rf_rpc_server *s);

/* --- inside a handler --- */

/* Next request of a CLIENT_STREAM call: 1 and *msg (free with
 * protobuf_c_message_free_unpacked(*msg, NULL)), 0 at the end of the stream,
 * or < 0 when the call broke or the message did not decode; the call's status
 * is then set, and the handler should return rf_rpc_call_status(call). */
int rf_rpc_recv(rf_rpc_call *call, ProtobufCMessage **msg);
/* Sends a response. UNARY and CLIENT_STREAM calls take exactly one, sent with
 * the status; SERVER_STREAM sends go out at once and block under flow control.
 * < 0 when the call is gone (cancelled, deadline passed). */
int rf_rpc_send(rf_rpc_call *call, const ProtobufCMessage *msg);
/* Sets the call's status and detail; returns code. */
grpc_status_code rf_rpc_fail(rf_rpc_call *call, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
grpc_status_code rf_rpc_call_status(const rf_rpc_call *call);
/* Seconds left before the client's deadline (a large number when none). */
double rf_rpc_time_left(const rf_rpc_call *call);
/* 1 once the call is over for the client (cancelled, deadline passed): a
 * long-running handler polls this to stop early. */
int rf_rpc_call_done(rf_rpc_call *call);
/* The value of the client's metadata key (lowercase, e.g. "refinery-run-id")
 * copied into buf (truncated to size), or NULL when absent. */
const char *rf_rpc_metadata(const rf_rpc_call *call, const char *key, char *buf, size_t size);
const char *rf_rpc_method_path(const rf_rpc_call *call);

/* "OK", "INVALID_ARGUMENT", ... */
const char *rf_rpc_status_name(grpc_status_code code);

#endif
