/* Minimal blocking gRPC client over the C core, for the CLI and tests.
 *
 * A client holds one channel; each call (a "stream", also for unary calls) has
 * its own completion queue, so calls may run from several threads at once.
 *
 *   rf_rpc_stream_open -> rf_rpc_stream_send* -> rf_rpc_stream_close_send
 *     -> rf_rpc_stream_recv* -> rf_rpc_stream_finish (frees the stream)
 *
 * A failed send or recv usually means the server ended the call: finish then
 * tells why. */
#ifndef RF_RPC_CLIENT_H
#define RF_RPC_CLIENT_H

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

#include "runtime/rpc/rpc.h"

typedef struct rf_rpc_client rf_rpc_client;
typedef struct rf_rpc_stream rf_rpc_stream;

typedef struct rf_rpc_status {
    grpc_status_code code;
    char message[256];
} rf_rpc_status;

/* target is "host:port"; tls may be NULL (plaintext); max_message 0 = 4 MiB. */
int rf_rpc_client_new(const char *target, const rf_rpc_tls *tls, size_t max_message,
                      rf_rpc_client **out);
void rf_rpc_client_free(rf_rpc_client *c);

/* timeout_s <= 0: no deadline. */
int rf_rpc_stream_open(rf_rpc_client *c, const char *method, double timeout_s, rf_rpc_stream **out);
/* The same with request metadata: NULL-terminated key, value pairs, keys in
 * lowercase (e.g. {"refinery-run-id", "r1", NULL}); at most 16. */
int rf_rpc_stream_open_md(rf_rpc_client *c, const char *method, double timeout_s,
                          const char *const *metadata, rf_rpc_stream **out);
int rf_rpc_stream_send(rf_rpc_stream *st, const ProtobufCMessage *msg);
/* Sends bytes as one message as they are (tests send invalid protobuf with it). */
int rf_rpc_stream_send_raw(rf_rpc_stream *st, const void *data, size_t len);
int rf_rpc_stream_close_send(rf_rpc_stream *st);
/* 1 and *msg (free with protobuf_c_message_free_unpacked(*msg, NULL)), 0 at the
 * end of the responses, < 0 on a broken call or a response that does not
 * decode as d. */
int rf_rpc_stream_recv(rf_rpc_stream *st, const ProtobufCMessageDescriptor *d,
                       ProtobufCMessage **msg);
/* Waits for the call's status, frees the stream. 0 when the status is OK,
 * RF_ERR_IO otherwise (details in *status, which may be NULL). */
int rf_rpc_stream_finish(rf_rpc_stream *st, rf_rpc_status *status);

/* One request, one response. */
int rf_rpc_unary(rf_rpc_client *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                 double timeout_s, rf_rpc_status *status);

#endif
