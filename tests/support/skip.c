#include "skip.h"

#include <stdarg.h>
#include <stdio.h>

void rf_skip_reason(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("SKIP: ", stdout);
    vprintf(fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
}
