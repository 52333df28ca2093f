/* A Prometheus metrics registry: counters, gauges and histograms with labels,
 * written out in the text exposition format 0.0.4
 * (https://prometheus.io/docs/instrumenting/exposition_formats/).
 *
 * Plain memory, no network: the stage libraries update it, the runtime serves
 * it over HTTP (runtime/metrics_http.h). The names of Refinery's own metrics
 * and the calls that update them are in common/obs.h.
 *
 * Threads: every call is safe from any thread. A series (one combination of
 * label values) is found under its family's mutex and then updated with
 * atomic operations; exposition reads each value atomically (a scrape may
 * see one histogram observation in _count but not yet in a bucket, which
 * Prometheus tolerates).
 *
 * Ownership: a family belongs to its registry and lives until rf_prom_free;
 * label values are copied. A family is looked up by name, so registering the
 * same name twice gives the same family (the type and label names must match).
 * NULL families are accepted by every update call and ignored, so a failed
 * registration (out of memory) never crashes an instrumented path.
 *
 * Cardinality: a family holds at most RF_PROM_MAX_SERIES series; updates of
 * further label combinations are dropped and counted in
 * refinery_metrics_dropped_series_total. */
#ifndef RF_PROM_H
#define RF_PROM_H

#include <stddef.h>

#include "common/buf.h"

#define RF_PROM_MAX_LABELS  4
#define RF_PROM_MAX_SERIES  512
#define RF_PROM_MAX_BUCKETS 32

typedef enum rf_prom_type { RF_PROM_COUNTER, RF_PROM_GAUGE, RF_PROM_HISTOGRAM } rf_prom_type;

typedef struct rf_prom rf_prom;
typedef struct rf_prom_family rf_prom_family;

rf_prom *rf_prom_new(void);
void rf_prom_free(rf_prom *r);
/* The process-wide registry every instrumented path uses; never freed. */
rf_prom *rf_prom_default(void);

/* Finds or adds a family. name: [a-zA-Z_:][a-zA-Z0-9_:]*; labels: label names
 * separated by commas ("stage,reason"; NULL or "" for none, at most
 * RF_PROM_MAX_LABELS, never "le" for a histogram); buckets: the histogram's
 * upper bounds in increasing order (+Inf is implied; NULL for the others).
 * NULL with rf_errmsg() on a bad name, a clash with an earlier family of the
 * same name, or no memory. */
rf_prom_family *rf_prom_family_get(rf_prom *r, rf_prom_type type, const char *name,
                                   const char *help, const char *labels, const double *buckets,
                                   size_t nbuckets);

/* Updates the series of the given label values (exactly as many const char *
 * arguments as the family has labels; NULL is taken as ""). add: counters and
 * gauges (a counter ignores negative deltas); set: gauges, and counters that
 * mirror a total kept elsewhere (CPU time); observe: histograms. A call that does not fit the
 * family's type is ignored. */
void rf_prom_add(rf_prom_family *f, double v, ...);
void rf_prom_set(rf_prom_family *f, double v, ...);
void rf_prom_observe(rf_prom_family *f, double v, ...);
/* The current value (counter, gauge) or observation count (histogram) of a
 * series; 0 when the series does not exist. For tests and reports. */
double rf_prom_value(rf_prom_family *f, ...);

/* Called at the start of every rf_prom_expose (to refresh gauges such as the
 * resident memory); at most 8 per registry. */
int rf_prom_on_collect(rf_prom *r, void (*fn)(rf_prom *r, void *user), void *user);

/* Appends every family, sorted by name, in the text format 0.0.4: # HELP and
 * # TYPE lines, then one line per series (histograms: cumulative _bucket
 * lines with le, then _sum and _count). Label values are escaped (\\, \",
 * \n), as is help text (\\, \n). Families without series are written with
 * their HELP and TYPE only. */
int rf_prom_expose(rf_prom *r, rf_buf *out);

/* The content type of rf_prom_expose's output. */
#define RF_PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Bucket bounds for latencies in seconds: 1 ms to 60 s. */
extern const double rf_prom_latency_buckets[];
extern const size_t rf_prom_nlatency_buckets;

#endif
