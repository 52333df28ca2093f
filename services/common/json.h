/* A bounds-checked JSON parser (RFC 8259) building a read-only tree in an arena.
 * One rf_json_doc can be reused across many parses (e.g. one per JSONL line) to
 * avoid allocation: each parse invalidates the previous tree.
 *
 * Strings are unescaped into the arena and NUL-terminated (they may also contain
 * NUL via \u0000: always use len). Raw bytes inside strings are passed through
 * as they are, valid UTF-8 or not: callers that need valid text check it
 * (rf_utf8_valid) so that a bad byte can be repaired or reported rather than
 * rejecting the whole record. A \u escape of a lone surrogate becomes U+FFFD.
 * Nesting is limited (RF_JSON_MAX_DEPTH) so hostile input cannot exhaust the stack. */
#ifndef RF_JSON_H
#define RF_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RF_JSON_MAX_DEPTH 256

typedef enum rf_json_type {
    RF_JSON_NULL,
    RF_JSON_FALSE,
    RF_JSON_TRUE,
    RF_JSON_NUMBER,
    RF_JSON_STRING,
    RF_JSON_ARRAY,
    RF_JSON_OBJECT,
} rf_json_type;

typedef struct rf_json rf_json;
typedef struct rf_json_member rf_json_member;

struct rf_json {
    rf_json_type type;
    size_t len; /* STRING: bytes; NUMBER: raw text bytes; ARRAY/OBJECT: children */
    union {
        const char *str;               /* STRING (unescaped) or NUMBER (raw text) */
        const rf_json *items;          /* ARRAY */
        const rf_json_member *members; /* OBJECT, in document order */
    } u;
    double num; /* NUMBER */
};

struct rf_json_member {
    const char *key;
    size_t keylen;
    rf_json value;
};

typedef struct rf_json_doc rf_json_doc;

rf_json_doc *rf_json_doc_new(void);
void rf_json_doc_free(rf_json_doc *doc);

/* Parses text[0..len). On success *root points into doc's arena. On failure
 * returns RF_ERR_PARSE (or RF_ERR_NOMEM) and rf_errmsg() names the byte offset. */
int rf_json_parse(rf_json_doc *doc, const char *text, size_t len, const rf_json **root);

/* Object member by key (first match), or NULL if obj is not an object or lacks it. */
const rf_json *rf_json_get(const rf_json *obj, const char *key);
/* Exact integer value of a NUMBER without fraction/exponent; RF_ERR_RANGE otherwise. */
int rf_json_int64(const rf_json *v, int64_t *out);
bool rf_json_is_str(const rf_json *v);

#endif
