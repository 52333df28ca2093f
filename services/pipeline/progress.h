/* Progress of `refinery run`. On a terminal: one bar a stage, redrawn five
 * times a second, with the count, rate and ETA; log lines the run writes
 * meanwhile are printed above the bars instead of through them. Elsewhere
 * (a file, a pipe): one plain log line a running stage every `every` seconds.
 * The runner supplies the rows through a callback. */
#ifndef RF_PIPELINE_PROGRESS_H
#define RF_PIPELINE_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct rf_prog_row {
    const char *name;
    const char *state; /* "waiting", "running", "done", "cached", "failed", ... */
    const char *unit;  /* "docs"; NULL for a stage without a count */
    uint64_t count;
    uint64_t total; /* 0 when not known (yet) */
    double seconds; /* running time so far */
} rf_prog_row;

/* Fills up to max rows; returns how many. Called from the progress thread. */
typedef size_t (*rf_prog_rows_fn)(void *user, rf_prog_row *rows, size_t max);

typedef struct rf_progress rf_progress;

/* tty: bars on it (NULL: plain log lines every `every` seconds, 0: none). */
int rf_progress_start(FILE *tty, double every, rf_prog_rows_fn rows, void *user, rf_progress **out);
/* Draws the last state and stops. NULL is a no-op. */
void rf_progress_stop(rf_progress *p);

/* One row as text: with a bar of width characters, "dedup [####----] 120/240 docs
 * 60/s  ETA 0:02  running 0:02"; width 0, no bar: "dedup running 0:02, 120/240
 * docs  60/s  ETA 0:02" (the log lines). */
void rf_progress_format(const rf_prog_row *r, int width, char *out, size_t n);

#endif
