/* gRPC core's own log lines (bind failures, transport errors, ...) go through
 * the JSON logger (common/log.h) as component "grpc", instead of gRPC's
 * plain "E1124 23:55:30.07 ... chttp2_server.cc:1045] ..." lines on stderr.
 * gRPC's own GRPC_VERBOSITY threshold (default ERROR) still applies first. */
#include <grpc/grpc.h>
#include <grpc/support/log.h>
#include <pthread.h>
#include <string.h>

#include "common/log.h"
#include "runtime/rpc/rpc.h"

void rf_rpc_log_hook(gpr_log_func_args *args) {
    rf_log_level level = args->severity == GPR_LOG_SEVERITY_DEBUG  ? RF_LOG_DEBUG
                         : args->severity == GPR_LOG_SEVERITY_INFO ? RF_LOG_INFO
                                                                   : RF_LOG_ERROR;
    if (!rf_log_enabled(level)) return;
    const char *file = args->file ? args->file : "?";
    const char *base = strrchr(file, '/');
    rf_log(level, "grpc", "%s (%s:%d)", args->message ? args->message : "", base ? base + 1 : file,
           args->line);
}

static pthread_once_t hook_once = PTHREAD_ONCE_INIT;
static void install(void) {
    gpr_set_log_function(rf_rpc_log_hook);
}

void rf_rpc_log_install(void) {
    pthread_once(&hook_once, install);
}
