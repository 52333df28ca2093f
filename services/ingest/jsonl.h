/* JSON Lines records: one JSON object per line, any schema. The text is one or
 * more fields joined (e.g. Amazon's summary + reviewText), the label and id come
 * from optional fields. Field names may be dotted to reach nested objects
 * ("meta.title"); a key that itself contains dots is matched first. */
#ifndef RF_INGEST_JSONL_H
#define RF_INGEST_JSONL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/json.h"
#include "ingest/label.h"

typedef struct rf_field_map {
    const char *const *text_fields; /* at least one */
    size_t n_text_fields;
    const char *text_join;   /* between present text fields */
    const char *label_field; /* NULL: no label */
    const char *id_field;    /* NULL: no id */
    const rf_label_map *label_map;
    bool skip_contained; /* drop a text field contained in another (join.h) */
} rf_field_map;

typedef struct rf_record_fields {
    rf_buf *text;          /* scratch for joining (reset first); caller owns */
    rf_buf *norm;          /* scratch for skip_contained; caller owns */
    const char *text_data; /* the text: into the parse tree if one field was */
    size_t text_len;       /* present (no copy), else text->data */
    int32_t label;         /* RF_LABEL_NONE without label_field */
    const char *id;        /* into the parse tree or the line; NULL without id_field */
    size_t id_len;
} rf_record_fields;

/* Parses line[0..len) with doc and extracts the mapped fields. Returns NULL on
 * success or a reject reason: "invalid_json" (detail from rf_errmsg()),
 * "not_an_object", "missing_text", "text_not_string", "missing_label",
 * "bad_label", "unmapped_label", "missing_id", "out_of_memory". */
const char *rf_jsonl_extract(rf_json_doc *doc, const char *line, size_t len,
                             const rf_field_map *map, rf_record_fields *out);

#endif
