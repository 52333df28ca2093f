#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_msg[1024];

const char *rf_err_name(int err) {
    switch (err) {
    case RF_OK:
        return "ok";
    case RF_ERR_NOMEM:
        return "out_of_memory";
    case RF_ERR_IO:
        return "io";
    case RF_ERR_PARSE:
        return "parse";
    case RF_ERR_INVALID:
        return "invalid";
    case RF_ERR_CORRUPT:
        return "corrupt";
    case RF_ERR_NOT_FOUND:
        return "not_found";
    case RF_ERR_UNSUPPORTED:
        return "unsupported";
    case RF_ERR_RANGE:
        return "range";
    case RF_ERR_CANCELED:
        return "canceled";
    case RF_ERR_INTERNAL:
        return "internal";
    default:
        return "unknown";
    }
}

int rf_fail(int err, const char *fmt, ...) {
    /* Format into a scratch buffer first: callers may pass rf_errmsg() as an
     * argument to add context to the previous message. */
    char msg[sizeof last_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_msg, msg, sizeof msg);
    return err;
}

int rf_fail_ctx(int err, const char *fmt, ...) {
    char ctx[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    return rf_fail(err, "%s: %s", ctx, last_msg);
}

const char *rf_errmsg(void) {
    return last_msg;
}
