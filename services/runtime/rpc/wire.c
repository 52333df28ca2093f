/* Byte buffers <-> protobuf-c messages, TLS credentials, deadlines. */
#include "runtime/rpc/wire.h"

#include <grpc/support/time.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"

grpc_byte_buffer *rf_rpc_pack(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

grpc_byte_buffer *rf_rpc_pack_raw(const void *data, size_t len) {
    grpc_slice s = grpc_slice_from_copied_buffer(data, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

int rf_rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d,
                  ProtobufCMessage **out) {
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return rf_fail(RF_ERR_PARSE, "%s: undecodable (compressed?) message", d->name);
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    *out = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    size_t n = GRPC_SLICE_LENGTH(s);
    grpc_slice_unref(s);
    if (!*out) return rf_fail(RF_ERR_PARSE, "%zu bytes are not a valid %s", n, d->name);
    return RF_OK;
}

gpr_timespec rf_rpc_deadline_in(double timeout_s) {
    if (timeout_s <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_micros((int64_t)(timeout_s * 1e6), GPR_TIMESPAN));
}

/* PEM files are small; 1 MiB bounds a wrong path pointing at something big. */
static int read_pem(const char *path, char **out) {
    *out = NULL;
    if (!path) return RF_OK;
    size_t len;
    int rc = rf_read_file(path, 1u << 20, out, &len);
    if (rc < 0) return rf_fail(rc, "tls: cannot read %s: %s", path, rf_errmsg());
    return RF_OK;
}

typedef struct pem_set {
    char *cert, *key, *ca;
} pem_set;

static void pem_free(pem_set *p) {
    free(p->cert);
    free(p->key);
    free(p->ca);
}

static int pem_load(const rf_rpc_tls *tls, pem_set *p) {
    memset(p, 0, sizeof *p);
    if ((tls->cert_file == NULL) != (tls->key_file == NULL))
        return rf_fail(RF_ERR_INVALID, "tls: a certificate needs its key (and the reverse)");
    int rc;
    if ((rc = read_pem(tls->cert_file, &p->cert)) < 0 ||
        (rc = read_pem(tls->key_file, &p->key)) < 0 || (rc = read_pem(tls->ca_file, &p->ca)) < 0) {
        pem_free(p);
        return rc;
    }
    return RF_OK;
}

int rf_rpc_server_creds(const rf_rpc_tls *tls, grpc_server_credentials **out) {
    if (!tls || !tls->cert_file) {
        if (tls && tls->ca_file)
            return rf_fail(RF_ERR_INVALID, "tls: a CA file without a server certificate");
        *out = grpc_insecure_server_credentials_create();
        return RF_OK;
    }
    pem_set p;
    int rc = pem_load(tls, &p);
    if (rc < 0) return rc;
    grpc_ssl_pem_key_cert_pair pair = {p.key, p.cert};
    /* With a CA: mutual TLS, a client without a valid certificate is refused. */
    *out = grpc_ssl_server_credentials_create_ex(
        p.ca, &pair, 1,
        p.ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    pem_free(&p);
    return *out ? RF_OK : rf_fail(RF_ERR_INVALID, "tls: grpc rejected the server credentials");
}

int rf_rpc_channel_creds(const rf_rpc_tls *tls, grpc_channel_credentials **out) {
    if (!tls || (!tls->cert_file && !tls->ca_file)) {
        *out = grpc_insecure_credentials_create();
        return RF_OK;
    }
    pem_set p;
    int rc = pem_load(tls, &p);
    if (rc < 0) return rc;
    grpc_ssl_pem_key_cert_pair pair = {p.key, p.cert};
    *out = grpc_ssl_credentials_create(p.ca, p.cert ? &pair : NULL, NULL, NULL);
    pem_free(&p);
    return *out ? RF_OK : rf_fail(RF_ERR_INVALID, "tls: grpc rejected the client credentials");
}
