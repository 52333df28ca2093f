/* The gRPC options the services share (svc.h). */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "common/sys.h"
#include "runtime/svc.h"

int rf_svc_grpc_check(const rf_svc_grpc *g) {
    if (g->workers < 1 || g->workers > 1024)
        return rf_fail(RF_ERR_INVALID, "--workers must be in 1..1024, not %lld",
                       (long long)g->workers);
    if (g->max_message < 1024 || g->max_message > (1ll << 30))
        return rf_fail(RF_ERR_INVALID, "--max-message must be in 1024..2^30, not %lld",
                       (long long)g->max_message);
    if (g->grace_s < 0) return rf_fail(RF_ERR_INVALID, "--grace must not be negative");
    if (!g->tls_cert != !g->tls_key)
        return rf_fail(RF_ERR_INVALID, "--tls-cert and --tls-key go together");
    if (g->tls_ca && !g->tls_cert)
        return rf_fail(RF_ERR_INVALID, "--tls-ca (mutual TLS) needs --tls-cert and --tls-key");
    return RF_OK;
}

rf_rpc_server_opts rf_svc_grpc_server_opts(const rf_svc_grpc *g) {
    return (rf_rpc_server_opts){.listen = g->listen,
                                .workers = (int)g->workers,
                                .max_message = (size_t)g->max_message,
                                .tls = {g->tls_cert, g->tls_key, g->tls_ca, NULL}};
}

int rf_svc_grpc_write_port(const rf_svc_grpc *g, const rf_rpc_server *s) {
    if (!g->port_file) return RF_OK;
    char text[16];
    int n = snprintf(text, sizeof text, "%d\n", rf_rpc_server_port(s));
    return rf_write_file_atomic(g->port_file, text, (size_t)n);
}
