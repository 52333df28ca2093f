#include "trainer/fail.h"

#include <stdarg.h>
#include <stdio.h>

#include "common/error.h"

int rf_tr_fail_ctx(int rc, const char *fmt, ...) {
    char ctx[512], prev[1024];
    snprintf(prev, sizeof prev, "%s", rf_errmsg());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    return rf_fail(rc, "%s: %s", ctx, prev);
}
