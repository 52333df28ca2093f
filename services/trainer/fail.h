/* rf_fail() with context: prefixes the current error message. rf_fail(rc,
 * "...: %s", rf_errmsg()) would format the message buffer into itself; this
 * copies it first. */
#ifndef RF_TR_FAIL_H
#define RF_TR_FAIL_H

/* Sets the message to "<formatted>: <previous message>" and returns rc. */
int rf_tr_fail_ctx(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
