/* Internal to services/runtime/rpc: message (de)serialization into gRPC byte buffers,
 * TLS credentials from PEM files, and time conversion. */
#ifndef RF_RPC_WIRE_H
#define RF_RPC_WIRE_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <protobuf-c/protobuf-c.h>

#include "runtime/rpc/rpc.h"

/* New byte buffer holding the packed message (caller destroys it). */
grpc_byte_buffer *rf_rpc_pack(const ProtobufCMessage *m);
grpc_byte_buffer *rf_rpc_pack_raw(const void *data, size_t len);
/* Decodes bb as d: 0, or RF_ERR_PARSE for bytes that are not a valid d. */
int rf_rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d,
                  ProtobufCMessage **out);

/* Credentials from tls (plaintext ones when tls is NULL or has no files). */
int rf_rpc_server_creds(const rf_rpc_tls *tls, grpc_server_credentials **out);
int rf_rpc_channel_creds(const rf_rpc_tls *tls, grpc_channel_credentials **out);

/* Absolute deadline timeout_s from now; infinite when timeout_s <= 0. */
gpr_timespec rf_rpc_deadline_in(double timeout_s);

#endif
