/* Service process plumbing: options from flags and environment, and signals.
 *
 * One option table serves the command line, the environment and --help:
 * a value comes from --flag=VALUE (or --flag VALUE), else from the option's
 * environment variable, else from its default; later sources never override
 * earlier ones. Strings point into argv, environ or the table (not copied).
 *
 * Signals: rf_svc_signals_init() blocks SIGTERM, SIGINT and SIGHUP in the
 * calling thread before any other thread starts, so every thread inherits the
 * mask and only rf_svc_wait_signal() sees them: a service's main thread waits
 * there, then drains its work (graceful stop) and exits 0. */
#ifndef RF_SVC_H
#define RF_SVC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/stats.h"

typedef enum rf_opt_type { RF_OPT_STR, RF_OPT_INT, RF_OPT_REAL, RF_OPT_BOOL } rf_opt_type;

typedef struct rf_opt {
    const char *flag; /* "listen" for --listen */
    const char *env;  /* "REFINERY_LISTEN", or NULL */
    rf_opt_type type;
    void *dest;      /* const char **, int64_t *, double *, bool * */
    const char *def; /* default as text; NULL leaves a string NULL (unset) */
    const char *help;
} rf_opt;

/* Fills every dest. 0 on success; 1 after printing usage for --help (the
 * caller exits 0); RF_ERR_INVALID naming the flag or variable otherwise. */
int rf_svc_parse(const char *prog, const char *summary, const rf_opt *opts, size_t n, int argc,
                 char **argv);

/* Splits "name=value;name=value" (librdkafka properties from --kafka-props /
 * KAFKA_PROPERTIES) into a NULL-terminated name, value array for
 * rf_kafka_opts.extra. *out points into *storage; the caller frees both.
 * RF_ERR_INVALID names an entry without '='. NULL or "" gives an empty list. */
int rf_svc_split_props(const char *spec, char **storage, const char ***out);

int rf_svc_signals_init(void);
/* The signal received, or 0 when timeout_s passed (timeout_s < 0: wait forever). */
int rf_svc_wait_signal(double timeout_s);

/* A process-wide stop flag for loops; rf_svc_stopping() also takes a pending
 * termination signal (they are blocked after rf_svc_signals_init). */
void rf_svc_request_stop(void);
/* Logs "stopped: <stats as JSON>" for component comp, as services do on exit. */
void rf_svc_log_stats(const char *comp, const rf_stats *stats);
bool rf_svc_stopping(void);

#endif
