/* Structured logging: one JSON object per line on stderr (or a chosen stream):
 *   {"ts":"2026-11-22T09:11:41.123Z","level":"info","comp":"ingest","msg":"..."}
 * REFINERY_LOG_LEVEL=debug|info|warn|error sets the threshold (default info);
 * REFINERY_LOG_FORMAT=text switches to a plain "LEVEL comp: msg" form. */
#ifndef RF_LOG_H
#define RF_LOG_H

#include <stdio.h>

#ifdef __cplusplus /* included by CUDA */
extern "C" {
#endif

typedef enum rf_log_level {
    RF_LOG_DEBUG = 0,
    RF_LOG_INFO = 1,
    RF_LOG_WARN = 2,
    RF_LOG_ERROR = 3,
} rf_log_level;

void rf_log_init_from_env(void);
void rf_log_set_level(rf_log_level level);
void rf_log_set_output(FILE *out); /* NULL restores stderr; caller owns `out` */
/* Also writes every line to `tee` (e.g. a run's log file); NULL stops. */
void rf_log_set_tee(FILE *tee);
int rf_log_enabled(rf_log_level level);
void rf_log(rf_log_level level, const char *comp, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define rf_debug(comp, ...) rf_log(RF_LOG_DEBUG, comp, __VA_ARGS__)
#define rf_info(comp, ...)  rf_log(RF_LOG_INFO, comp, __VA_ARGS__)
#define rf_warn(comp, ...)  rf_log(RF_LOG_WARN, comp, __VA_ARGS__)
#define rf_error(comp, ...) rf_log(RF_LOG_ERROR, comp, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif
