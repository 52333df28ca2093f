/* An incremental CSV/TSV record parser (RFC 4180) fed one physical line at a
 * time, as the line reader delivers them (without '\n', a trailing '\r' kept).
 *
 * A quoted field may hold delimiters, doubled quotes ("" -> ") and line breaks,
 * so a record can span several lines: rf_csv_feed returns RF_CSV_MORE until the
 * record is complete. Outside quotes a trailing '\r' ends the line (CRLF files);
 * inside quotes line breaks are kept as they were ("\r\n" or "\n").
 *
 * Deliberate leniencies, as Python's csv module: a quote inside an unquoted
 * field is an ordinary byte. Deliberate strictness: bytes after a closing quote
 * other than the delimiter make the record RF_CSV_BAD_QUOTE (the closing quote
 * was probably a stray one and the fields cannot be trusted).
 *
 * quote = -1 disables quoting (GLUE-style TSV: every byte is literal).
 *
 * After any status other than RF_CSV_MORE the parser is ready for the next
 * record; a rejected record's lines are never re-read, so parsing resumes at the
 * next physical line. max_record bounds the bytes held for one record, so an
 * unterminated quote cannot swallow the whole input into memory. */
#ifndef RF_INGEST_CSV_H
#define RF_INGEST_CSV_H

#include <stdbool.h>
#include <stddef.h>

#include "common/buf.h"

typedef enum rf_csv_status {
    RF_CSV_MORE = 0,         /* record continues on the next line */
    RF_CSV_RECORD = 1,       /* a complete record: read its fields */
    RF_CSV_BAD_QUOTE = 2,    /* text after a closing quote */
    RF_CSV_TOO_LONG = 3,     /* record exceeded max_record bytes */
    RF_CSV_UNTERMINATED = 4, /* input ended inside a quoted field (rf_csv_finish) */
    RF_CSV_NOMEM = 5,
} rf_csv_status;

typedef struct rf_csv_opts {
    char delim;        /* ',' or '\t' */
    int quote;         /* '"', or -1 for no quoting */
    size_t max_record; /* bytes; 0 means unbounded */
} rf_csv_opts;

typedef struct rf_csv_span {
    size_t off;
    size_t len;
} rf_csv_span;

typedef struct rf_csv {
    rf_csv_opts opts;
    rf_buf buf;          /* field bytes of the current record, back to back */
    rf_csv_span *fields; /* spans into buf */
    size_t nfields;
    size_t cap;
    int state;    /* internal: where the previous line left the field */
    size_t lines; /* physical lines in the current record so far */
} rf_csv;

void rf_csv_init(rf_csv *p, const rf_csv_opts *opts);
void rf_csv_free(rf_csv *p);

/* Feeds one physical line (len bytes, no '\n'). Returns an rf_csv_status. */
rf_csv_status rf_csv_feed(rf_csv *p, const char *line, size_t len);
/* At end of input: RF_CSV_UNTERMINATED if a record is still open (and resets),
 * else RF_CSV_MORE. */
rf_csv_status rf_csv_finish(rf_csv *p);
/* Drops a partly read record (e.g. after its next line was too long). */
void rf_csv_reset(rf_csv *p);
/* True while a quoted field spans lines. */
bool rf_csv_open(const rf_csv *p);

/* Field i of the last complete record (i < nfields): bytes and length. The
 * bytes are followed by a NUL and valid until the next rf_csv_feed. */
static inline const char *rf_csv_field(const rf_csv *p, size_t i, size_t *len) {
    *len = p->fields[i].len;
    return p->buf.data + p->fields[i].off;
}

const char *rf_csv_status_name(rf_csv_status s);

#endif
