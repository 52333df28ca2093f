/* Labels from raw values: a star rating, a class number, "0"/"1". A label map
 * turns numbers into class labels by inclusive ranges, written "1-2:0,3-5:1"
 * (ratings 1..2 -> 0, 3..5 -> 1, the project's reference task) or "5:1" for a
 * single value. Without a map a value must be an integer and is the label. */
#ifndef RF_INGEST_LABEL_H
#define RF_INGEST_LABEL_H

#include <stddef.h>
#include <stdint.h>

#define RF_LABEL_MAP_MAX 16

typedef struct rf_label_range {
    double lo, hi;
    int32_t label;
} rf_label_range;

typedef struct rf_label_map {
    size_t n; /* 0: no map */
    rf_label_range r[RF_LABEL_MAP_MAX];
} rf_label_map;

/* Parses a map spec; RF_ERR_INVALID with a message on a bad spec. */
int rf_label_map_parse(const char *spec, rf_label_map *m);

/* Parses a whole string s[0..n) as a finite number (leading/trailing spaces
 * allowed). Returns 0 or RF_ERR_PARSE. */
int rf_label_parse_number(const char *s, size_t n, double *v);

/* Maps value v to a label. Returns NULL with *label set, or a reject reason:
 * "unmapped_label" (no range holds v) or "bad_label" (not an integer, no map). */
const char *rf_label_apply(const rf_label_map *m, double v, int32_t *label);

#endif
