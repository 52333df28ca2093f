/* Labels from raw values: a star rating, a class number, "0"/"1", a class
 * name. A label map turns values into class labels: numbers by inclusive
 * ranges, "1-2:0,3-5:1" (ratings 1..2 -> 0, 3..5 -> 1, the project's reference
 * task) or "5:1" for one value; names by exact match, "neg:0,pos:1" (a name
 * starts with a letter). Without a map a value must be a non-negative integer
 * and is the label. */
#ifndef RF_INGEST_LABEL_H
#define RF_INGEST_LABEL_H

#include <stddef.h>
#include <stdint.h>

#define RF_LABEL_MAP_MAX 16

#define RF_LABEL_NAME_MAX 32

typedef struct rf_label_range {
    double lo, hi;                /* when name is "" */
    char name[RF_LABEL_NAME_MAX]; /* a class name, or "" */
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

/* Maps number v to a label. Returns NULL with *label set, or a reject reason:
 * "unmapped_label" (no range holds v) or "bad_label" (not an integer, no map). */
const char *rf_label_apply(const rf_label_map *m, double v, int32_t *label);

/* Maps the text s[0..n) (trimmed): a name of the map, else a number as above.
 * Returns NULL or "bad_label" (neither) / "unmapped_label". */
const char *rf_label_from_text(const rf_label_map *m, const char *s, size_t n, int32_t *label);

#endif
