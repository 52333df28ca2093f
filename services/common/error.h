/* Error codes shared by every library. Functions return 0 (RF_OK) or a negative
 * rf_err; a human-readable detail for the last failure on this thread is kept by
 * rf_fail() and read with rf_errmsg(). Library code never calls exit(). */
#ifndef RF_ERROR_H
#define RF_ERROR_H

#ifdef __cplusplus /* included by CUDA and C++ shims */
extern "C" {
#endif

typedef enum rf_err {
    RF_OK = 0,
    RF_ERR_NOMEM = -1,       /* allocation failed */
    RF_ERR_IO = -2,          /* read/write/open failed */
    RF_ERR_PARSE = -3,       /* malformed input text (JSON, YAML, CSV, ...) */
    RF_ERR_INVALID = -4,     /* bad argument or configuration value */
    RF_ERR_CORRUPT = -5,     /* a file failed its integrity checks */
    RF_ERR_NOT_FOUND = -6,   /* missing file, key or name */
    RF_ERR_UNSUPPORTED = -7, /* valid but not handled (format version, dtype) */
    RF_ERR_RANGE = -8,       /* value or size out of bounds */
    RF_ERR_CANCELED = -9,    /* stopped on request (queue closed, SIGTERM) */
    RF_ERR_INTERNAL = -10,   /* a bug: an invariant did not hold */
} rf_err;

/* Short stable name, e.g. "parse". */
const char *rf_err_name(int err);

/* Records a formatted detail for this thread and returns err, so that a caller
 * can write `return rf_fail(RF_ERR_PARSE, "line %zu: ...", n);`. The arguments
 * may include rf_errmsg() itself, to prefix context to the previous detail. */
int rf_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes context to the current detail: "<formatted>: <previous detail>". */
int rf_fail_ctx(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The detail of the last rf_fail() on this thread ("" if none). */
const char *rf_errmsg(void);

#ifdef __cplusplus
}
#endif

#endif
