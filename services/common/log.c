#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include "common/buf.h"

static rf_log_level log_level = RF_LOG_INFO;
static FILE *log_out;
static FILE *log_tee;
static int log_text;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void rf_log_init_from_env(void) {
    const char *lvl = getenv("REFINERY_LOG_LEVEL");
    if (lvl) {
        for (int i = 0; i < 4; i++)
            if (strcasecmp(lvl, level_names[i]) == 0) log_level = (rf_log_level)i;
    }
    const char *fmt = getenv("REFINERY_LOG_FORMAT");
    log_text = fmt && strcasecmp(fmt, "text") == 0;
}

void rf_log_set_level(rf_log_level level) {
    log_level = level;
}

void rf_log_set_output(FILE *out) {
    log_out = out;
}

void rf_log_set_tee(FILE *tee) {
    pthread_mutex_lock(&log_lock);
    log_tee = tee;
    pthread_mutex_unlock(&log_lock);
}

int rf_log_enabled(rf_log_level level) {
    return level >= log_level;
}

void rf_log(rf_log_level level, const char *comp, const char *fmt, ...) {
    if (level < log_level) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);

    rf_buf line = RF_BUF_INIT;
    if (log_text) {
        rf_buf_printf(&line, "%s.%03dZ %-5s %s: %s\n", ts, (int)(tv.tv_usec / 1000),
                      level_names[level], comp, msg);
    } else {
        rf_buf_printf(&line, "{\"ts\":\"%s.%03dZ\",\"level\":\"%s\",\"comp\":", ts,
                      (int)(tv.tv_usec / 1000), level_names[level]);
        rf_buf_append_json_str(&line, comp, strlen(comp));
        rf_buf_puts(&line, ",\"msg\":");
        rf_buf_append_json_str(&line, msg, strlen(msg));
        rf_buf_puts(&line, "}\n");
    }
    if (line.data) {
        pthread_mutex_lock(&log_lock);
        FILE *out = log_out ? log_out : stderr;
        fwrite(line.data, 1, line.len, out);
        fflush(out);
        if (log_tee) {
            fwrite(line.data, 1, line.len, log_tee);
            fflush(log_tee);
        }
        pthread_mutex_unlock(&log_lock);
    }
    rf_buf_free(&line);
}
