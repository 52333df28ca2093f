/* Named counters, safe to update from many threads, printed as JSON in sorted
 * key order (deterministic). Names are dotted: "ingest.rejected.invalid_json";
 * segments use [a-z0-9_], and a name is never also the prefix of another. */
#ifndef RF_STATS_H
#define RF_STATS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/buf.h"

typedef struct rf_stats rf_stats;

rf_stats *rf_stats_new(void);
void rf_stats_free(rf_stats *s);

int rf_stats_add(rf_stats *s, const char *name, int64_t delta);
int rf_stats_set(rf_stats *s, const char *name, int64_t value);
int rf_stats_set_real(rf_stats *s, const char *name, double value);
/* A JSON true/false, and a JSON string (copied): per-stage records such as
 * "tokenizer.cached" and "tokenizer.key". rf_stats_get reads a boolean as 0/1
 * and a string as 0. */
int rf_stats_set_bool(rf_stats *s, const char *name, bool value);
int rf_stats_set_str(rf_stats *s, const char *name, const char *value);
int64_t rf_stats_get(const rf_stats *s, const char *name); /* 0 if absent */
/* Calls fn for every entry whose name starts with prefix, in name order, until
 * fn returns non-zero (returned). kind: 0 integer (value), 1 real (real),
 * 2 boolean (value 0/1), 3 string (str). fn must not use s. */
typedef int (*rf_stats_fn)(void *user, const char *name, int kind, int64_t value, double real,
                           const char *str);
int rf_stats_each(const rf_stats *s, const char *prefix, rf_stats_fn fn, void *user);
/* Sum of every counter whose name starts with prefix. */
int64_t rf_stats_sum_prefix(const rf_stats *s, const char *prefix);
/* Adds every counter of src into dst. */
int rf_stats_merge(rf_stats *dst, const rf_stats *src);

/* Writes the counters as nested JSON objects split on '.', e.g.
 * {"ingest":{"rejected":{"invalid_json":3}}}. */
int rf_stats_to_json(const rf_stats *s, rf_buf *out);

#endif
