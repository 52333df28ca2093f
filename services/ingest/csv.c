/* CSV/TSV record parser: see csv.h for the accepted dialect. */
#include "ingest/csv.h"

#include <stdlib.h>
#include <string.h>

enum {
    ST_START,        /* at the start of a field */
    ST_UNQUOTED,     /* inside an unquoted field */
    ST_QUOTED,       /* inside a quoted field */
    ST_QUOTED_QUOTE, /* saw a quote inside a quoted field: closing or doubled */
};

void rf_csv_init(rf_csv *p, const rf_csv_opts *opts) {
    memset(p, 0, sizeof(*p));
    p->opts = *opts;
    p->state = ST_START;
}

void rf_csv_free(rf_csv *p) {
    rf_buf_free(&p->buf);
    free(p->fields);
    memset(p, 0, sizeof(*p));
}

void rf_csv_reset(rf_csv *p) {
    rf_buf_reset(&p->buf);
    p->nfields = 0;
    p->state = ST_START;
    p->lines = 0;
}

bool rf_csv_open(const rf_csv *p) {
    return p->lines > 0;
}

/* Opens a new field starting at the current end of buf. */
static int field_open(rf_csv *p) {
    if (p->nfields == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        rf_csv_span *f = realloc(p->fields, cap * sizeof(*f));
        if (!f) return -1;
        p->fields = f;
        p->cap = cap;
    }
    p->fields[p->nfields].off = p->buf.len;
    p->fields[p->nfields].len = 0;
    p->nfields++;
    return 0;
}

/* Closes the last field: records its length and NUL-terminates it in buf. */
static int field_close(rf_csv *p) {
    rf_csv_span *f = &p->fields[p->nfields - 1];
    f->len = p->buf.len - f->off;
    return rf_buf_putc(&p->buf, '\0');
}

static rf_csv_status fail(rf_csv *p, rf_csv_status s) {
    rf_csv_reset(p);
    return s;
}

rf_csv_status rf_csv_feed(rf_csv *p, const char *line, size_t len) {
    const char delim = p->opts.delim;
    const int quote = p->opts.quote;
    /* A CR ending the line is a line break, not data, unless a quoted field is
     * still open at that point (then it is part of the field's line break). */
    bool crlf = len > 0 && line[len - 1] == '\r';
    size_t n = len - crlf;

    if (p->lines == 0) {
        rf_buf_reset(&p->buf);
        p->nfields = 0;
        p->state = ST_START;
        if (n == 0) return RF_CSV_RECORD; /* blank line: a record of no fields */
        if (field_open(p)) return fail(p, RF_CSV_NOMEM);
    }
    p->lines++;
    if (rf_buf_reserve(&p->buf, len + 2)) return fail(p, RF_CSV_NOMEM);

    int st = p->state;
    size_t i = 0;
    while (i < n) {
        char c = line[i];
        switch (st) {
        case ST_START:
            if (quote >= 0 && (unsigned char)c == quote) {
                st = ST_QUOTED;
                i++;
                break;
            }
            st = ST_UNQUOTED;
            /* fall through */
        case ST_UNQUOTED: {
            /* Copy the run up to the next delimiter in one go. */
            const char *d = memchr(line + i, delim, n - i);
            size_t run = d ? (size_t)(d - (line + i)) : n - i;
            if (rf_buf_append(&p->buf, line + i, run)) return fail(p, RF_CSV_NOMEM);
            i += run;
            if (d) {
                if (field_close(p) || field_open(p)) return fail(p, RF_CSV_NOMEM);
                st = ST_START;
                i++;
            }
            break;
        }
        case ST_QUOTED: {
            const char *q = memchr(line + i, quote, n - i);
            size_t run = q ? (size_t)(q - (line + i)) : n - i;
            if (rf_buf_append(&p->buf, line + i, run)) return fail(p, RF_CSV_NOMEM);
            i += run;
            if (q) {
                st = ST_QUOTED_QUOTE;
                i++;
            }
            break;
        }
        case ST_QUOTED_QUOTE:
            if ((unsigned char)c == quote) { /* doubled quote: a literal one */
                if (rf_buf_putc(&p->buf, c)) return fail(p, RF_CSV_NOMEM);
                st = ST_QUOTED;
                i++;
            } else if (c == delim) {
                if (field_close(p) || field_open(p)) return fail(p, RF_CSV_NOMEM);
                st = ST_START;
                i++;
            } else {
                return fail(p, RF_CSV_BAD_QUOTE);
            }
            break;
        }
    }

    if (st == ST_QUOTED) {
        /* The quoted field goes on: keep the line break as it was. */
        if ((crlf && rf_buf_putc(&p->buf, '\r')) || rf_buf_putc(&p->buf, '\n'))
            return fail(p, RF_CSV_NOMEM);
        if (p->opts.max_record && p->buf.len > p->opts.max_record) return fail(p, RF_CSV_TOO_LONG);
        p->state = st;
        return RF_CSV_MORE;
    }
    if (field_close(p)) return fail(p, RF_CSV_NOMEM);
    if (p->opts.max_record && p->buf.len > p->opts.max_record + p->nfields)
        return fail(p, RF_CSV_TOO_LONG);
    p->state = ST_START;
    p->lines = 0;
    return RF_CSV_RECORD;
}

rf_csv_status rf_csv_finish(rf_csv *p) {
    if (p->lines == 0) return RF_CSV_MORE;
    return fail(p, RF_CSV_UNTERMINATED);
}

const char *rf_csv_status_name(rf_csv_status s) {
    switch (s) {
    case RF_CSV_MORE:
        return "more";
    case RF_CSV_RECORD:
        return "record";
    case RF_CSV_BAD_QUOTE:
        return "csv_bad_quote";
    case RF_CSV_TOO_LONG:
        return "csv_record_too_long";
    case RF_CSV_UNTERMINATED:
        return "csv_unterminated_quote";
    case RF_CSV_NOMEM:
        return "out_of_memory";
    }
    return "unknown";
}
