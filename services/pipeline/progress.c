/* Progress display (progress.h). */
#include "pipeline/progress.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"

#define MAX_ROWS 16

struct rf_progress {
    FILE *tty;
    double every;
    rf_prog_rows_fn rows;
    void *user;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    size_t drawn; /* bar lines on the screen */
    int pipe_r;   /* the log's output while bars are shown */
    FILE *log_w;
};

static void clock_text(double s, char *out, size_t n) {
    if (s < 0 || s > 360000) {
        snprintf(out, n, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(out, n, "%ld:%02ld", t / 60, t % 60);
}

void rf_progress_format(const rf_prog_row *r, int width, char *out, size_t n) {
    char bar[64], eta[32] = "", rate[48] = "", count[64] = "", took[32];
    int bw = width > 0 && width < 62 ? width : width <= 0 ? 0 : 20;
    double frac = r->total ? (double)r->count / (double)r->total : 0;
    if (frac > 1) frac = 1;
    bool running = !strcmp(r->state, "running");
    bool finished = !strcmp(r->state, "done") || !strcmp(r->state, "cached");
    if (finished) frac = 1;
    int fill = (int)(frac * bw + 0.5);
    if (!r->total && !finished) fill = 0;
    bar[0] = '[';
    for (int i = 0; i < bw; i++)
        bar[1 + i] = i < fill                                                    ? '#'
                     : (running && !r->total && i == (int)(r->seconds * 5) % bw) ? '>'
                                                                                 : '-';
    bar[bw + 1] = ']';
    bar[bw + 2] = 0;
    if (r->unit) {
        if (r->total)
            snprintf(count, sizeof count, "%llu/%llu %s", (unsigned long long)r->count,
                     (unsigned long long)r->total, r->unit);
        else
            snprintf(count, sizeof count, "%llu %s", (unsigned long long)r->count, r->unit);
        double per_s = r->seconds > 0 ? (double)r->count / r->seconds : 0;
        if (r->count && per_s >= 10)
            snprintf(rate, sizeof rate, "  %.0f/s", per_s);
        else if (r->count)
            snprintf(rate, sizeof rate, "  %.2f/s", per_s);
    }
    if (running) {
        char t[24];
        if (r->total && r->count && r->count < r->total)
            clock_text(r->seconds * (double)(r->total - r->count) / (double)r->count, t, sizeof t);
        else
            snprintf(t, sizeof t, "?");
        snprintf(eta, sizeof eta, "  ETA %s", t);
    }
    clock_text(r->seconds, took, sizeof took);
    if (width <= 0) /* no bar (log lines) */
        snprintf(out, n, "%s %s %s%s%s%s%s", r->name, r->state, running || finished ? took : "",
                 count[0] ? ", " : "", count, rate, r->unit ? eta : "");
    else
        snprintf(out, n, "%-10s %s %s%s%s  %s %s", r->name, bar, count, rate, eta, r->state,
                 running || finished ? took : "");
}

/* Prints what the run logged since the last call (above the bars). */
static void drain_log(rf_progress *p) {
    char buf[8192];
    for (;;) {
        ssize_t k = read(p->pipe_r, buf, sizeof buf);
        if (k <= 0) break;
        fwrite(buf, 1, (size_t)k, p->tty);
    }
}

static void draw_tty(rf_progress *p, bool last) {
    rf_prog_row rows[MAX_ROWS];
    size_t n = p->rows(p->user, rows, MAX_ROWS);
    if (p->drawn) fprintf(p->tty, "\033[%zuA", p->drawn); /* back to the first bar */
    fputs("\r\033[J", p->tty);                            /* and clear them */
    if (last && p->log_w) { /* the log goes back to the terminal first */
        fflush(p->log_w);
    }
    if (p->pipe_r >= 0) drain_log(p);
    for (size_t i = 0; i < n; i++) {
        char line[256];
        rf_progress_format(&rows[i], 20, line, sizeof line);
        fprintf(p->tty, "%s\n", line);
    }
    p->drawn = n;
    fflush(p->tty);
}

static void log_plain(rf_progress *p) {
    rf_prog_row rows[MAX_ROWS];
    size_t n = p->rows(p->user, rows, MAX_ROWS);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(rows[i].state, "running")) continue;
        char line[256];
        rf_progress_format(&rows[i], 0, line, sizeof line);
        rf_info("progress", "%s", line);
    }
}

static void *loop(void *arg) {
    rf_progress *p = arg;
    pthread_mutex_lock(&p->lock);
    double period = p->tty ? 0.2 : p->every;
    while (!p->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)((period - (double)(long)period) * 1e9);
        ts.tv_sec += (time_t)period + ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&p->cond, &p->lock, &ts);
        if (p->stop) break;
        if (p->tty)
            draw_tty(p, false);
        else
            log_plain(p);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int rf_progress_start(FILE *tty, double every, rf_prog_rows_fn rows, void *user,
                      rf_progress **out) {
    *out = NULL;
    if (!tty && every <= 0) return RF_OK;
    rf_progress *p = calloc(1, sizeof *p);
    if (!p) return RF_ERR_NOMEM;
    p->tty = tty;
    p->every = every;
    p->rows = rows;
    p->user = user;
    p->pipe_r = -1;
    int fds[2];
    if (tty && pipe(fds) == 0) {
        fcntl(fds[0], F_SETFL, O_NONBLOCK);
        fcntl(fds[0], F_SETFD, FD_CLOEXEC);
        fcntl(fds[1], F_SETFD, FD_CLOEXEC);
        p->log_w = fdopen(fds[1], "w");
        if (p->log_w) {
            p->pipe_r = fds[0];
            rf_log_set_output(p->log_w);
        } else {
            close(fds[0]);
            close(fds[1]);
        }
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    if (pthread_create(&p->thread, NULL, loop, p)) {
        p->stop = 1;
        rf_progress_stop(p);
        return RF_OK; /* progress is optional */
    }
    *out = p;
    return RF_OK;
}

void rf_progress_stop(rf_progress *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    int running = !p->stop;
    p->stop = 1;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
    if (running) pthread_join(p->thread, NULL);
    if (p->tty) draw_tty(p, true);
    if (p->log_w) {
        rf_log_set_output(NULL);
        fclose(p->log_w);
        drain_log(p);
        close(p->pipe_r);
    }
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    free(p);
}
