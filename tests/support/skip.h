/* RF_SKIP(fmt, ...): skip the current cmocka test and say why.
 *
 * Prints "SKIP: <reason>" on stdout (flushed, so it lands between cmocka's
 * "[ RUN      ] case" and "[  SKIPPED ] case" lines, which CMOCKA_MESSAGE_OUTPUT=stdout
 * also sends to stdout), then calls cmocka's skip(). tests/run.sh reads that line
 * and prints "SKIP <binary>:<case> — <reason>"; a skip() without one shows as
 * "(no reason given)". Include after <cmocka.h>. */
#ifndef REFINERY_TESTS_SUPPORT_SKIP_H
#define REFINERY_TESTS_SUPPORT_SKIP_H

/* Prints "SKIP: " and the formatted reason, a newline, and flushes stdout. */
void rf_skip_reason(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define RF_SKIP(...)                                                                               \
    do {                                                                                           \
        rf_skip_reason(__VA_ARGS__);                                                               \
        skip();                                                                                    \
    } while (0)

#endif
