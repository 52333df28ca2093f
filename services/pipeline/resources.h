/* Per-stage resources (`resources: {cpu, memory, gpu}` in a stage section), in
 * Kubernetes quantities: cpu "2" or "500m"; memory "512Mi", "2Gi", "1G" or
 * bytes; gpu a count. The embedded runner gives a stage ceil(cpu) threads
 * (its own `threads:` key still wins), bounds the bytes of documents queued
 * for it to a quarter of its memory, and watches the process's resident memory
 * while it runs: a stage (batch stages alone; the streaming stages together,
 * against the sum of their budgets) that grows it past its budget is stopped
 * and fails with RF_ERR_RANGE naming the budget. gpu is carried to deployment
 * values only (`refinery values`). */
#ifndef RF_PIPELINE_RESOURCES_H
#define RF_PIPELINE_RESOURCES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/config.h"

typedef struct rf_resources {
    double cpu;                         /* cores, 0 when unset */
    int64_t memory;                     /* bytes, 0 when unset */
    int64_t gpu;                        /* devices */
    const char *cpu_text, *memory_text; /* as written (in the spec tree) */
} rf_resources;

int rf_quantity_cpu(const char *s, double *out);
int rf_quantity_bytes(const char *s, int64_t *out);
/* Reads section.resources (absent: all zero). Errors name the key. */
int rf_resources_parse(const rf_cfg *section, rf_resources *r);
/* "512 MiB" */
void rf_bytes_text(int64_t bytes, char *out, size_t n);

/* Resident memory of this process now, in bytes (0 where unknown). */
int64_t rf_rss_bytes(void);

/* Watches resident memory growth over its value at start, sampled every 10 ms,
 * against budget bytes; past it, sets *exceeded and *cancel. */
typedef struct rf_memwatch rf_memwatch;
int rf_memwatch_start(int64_t budget, volatile int *cancel, rf_memwatch **out);
/* Stops (a last sample first) and frees; returns the largest growth seen
 * and whether it passed the budget. */
int64_t rf_memwatch_stop(rf_memwatch *w, bool *exceeded);

/* Prints Helm values (charts/refinery/values.yaml) with each stage's
 * resources as the service's requests and limits; 0 or an rf_err. */
int rf_resources_values(const rf_cfg *spec, const char *const *stages, size_t n, FILE *out);

#endif
