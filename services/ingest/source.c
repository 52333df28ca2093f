/* The reading side of ingest: see source.h. */
#include "ingest/source.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "common/reader.h"
#include "ingest/csv.h"
#include "ingest/join.h"
#include "ingest/text.h"

#define EXCERPT_BYTES   80
#define BATCH_ARENA_MAX ((size_t)4 << 20) /* close a batch after this many bytes */

typedef struct input {
    const char *path;
    const char *base; /* id prefix: the file name, unless another input shares it */
    char *owned;      /* base when it had to be built */
    const void *data; /* an input in memory (rf_source_open_mem), else NULL */
    size_t len;
} input;

struct rf_source {
    const rf_ingest_opts *o;
    input *in;
    size_t n_in;
    size_t cur;           /* index of the open input */
    rf_reader *r;         /* NULL between inputs */
    rf_ingest_format fmt; /* of the open input */
    uint64_t bytes_done;  /* decompressed bytes of closed inputs */
    uint64_t skipped;
    /* CSV/TSV state */
    rf_csv csv;
    bool need_header;
    uint64_t rec_line, rec_offset; /* first line of the open CSV record */
    char rec_head[EXCERPT_BYTES];  /* and its first bytes, for rejects */
    size_t rec_head_len;
    long text_col[RF_INGEST_MAX_TEXT_FIELDS];
    long label_col, id_col;
    size_t want_fields; /* expected field count, 0 = any */
    rf_buf names;       /* header names, NUL-separated */
    /* Text state */
    rf_paragraph para;
    rf_buf join; /* scratch for joined CSV text */
    rf_buf norm; /* scratch for text_join_skip_contained */
};

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Document ids are "<base>:<line>", so bases must differ between inputs: a
 * file name shared by several inputs gives way to the path as given, and the
 * same path given twice gets "@<k>" for its k-th occurrence (k >= 2). */
static int unique_bases(rf_source *s) {
    for (size_t i = 0; i < s->n_in; i++) {
        input *in = &s->in[i];
        bool shared = false;
        size_t repeat = 1;
        for (size_t j = 0; j < s->n_in; j++) {
            if (j == i || strcmp(base_name(s->in[j].path), base_name(in->path)) != 0) continue;
            shared = true;
            repeat += j < i && strcmp(s->in[j].path, in->path) == 0;
        }
        if (!shared) continue;
        if (repeat == 1) {
            in->base = in->path;
        } else {
            if (asprintf(&in->owned, "%s@%zu", in->path, repeat) < 0) {
                in->owned = NULL;
                return RF_ERR_NOMEM;
            }
            in->base = in->owned;
        }
    }
    return 0;
}

int rf_source_open(const rf_ingest_opts *o, const char *const *inputs, size_t n, rf_source **out) {
    if (n == 0) return rf_fail(RF_ERR_INVALID, "ingest: no input files");
    for (size_t i = 0; i < n; i++) {
        if (strcmp(inputs[i], "-") != 0 && access(inputs[i], R_OK) != 0)
            return rf_fail(RF_ERR_NOT_FOUND, "ingest: cannot read input '%s'", inputs[i]);
    }
    rf_source *s = calloc(1, sizeof(*s));
    if (!s || !(s->in = calloc(n, sizeof(input)))) {
        free(s);
        return RF_ERR_NOMEM;
    }
    s->o = o;
    s->n_in = n;
    for (size_t i = 0; i < n; i++)
        s->in[i] = (input){inputs[i], base_name(inputs[i]), NULL, NULL, 0};
    rf_paragraph_init(&s->para, o->max_record);
    if (unique_bases(s)) {
        rf_source_close(s);
        return RF_ERR_NOMEM;
    }
    *out = s;
    return 0;
}

int rf_source_open_mem(const rf_ingest_opts *o, const char *name, const void *data, size_t len,
                       rf_source **out) {
    rf_source *s = calloc(1, sizeof(*s));
    if (!s || !(s->in = calloc(1, sizeof(input)))) {
        free(s);
        return RF_ERR_NOMEM;
    }
    s->o = o;
    s->n_in = 1;
    s->in[0] = (input){name, base_name(name), NULL, data ? data : "", len};
    rf_paragraph_init(&s->para, o->max_record);
    *out = s;
    return 0;
}

void rf_source_close(rf_source *s) {
    if (!s) return;
    rf_reader_close(s->r);
    rf_csv_free(&s->csv);
    rf_paragraph_free(&s->para);
    rf_buf_free(&s->names);
    rf_buf_free(&s->join);
    rf_buf_free(&s->norm);
    for (size_t i = 0; s->in && i < s->n_in; i++)
        free(s->in[i].owned);
    free(s->in);
    free(s);
}

const char *rf_source_path(const rf_source *s, uint32_t src) {
    return s->in[src].path;
}

const char *rf_source_base(const rf_source *s, uint32_t src) {
    return s->in[src].base;
}

uint64_t rf_source_bytes(const rf_source *s) {
    return s->bytes_done + (s->r ? rf_reader_bytes_out(s->r) : 0);
}

uint64_t rf_source_lines_skipped(const rf_source *s) {
    return s->skipped;
}

/* Format from the file name, ignoring a .gz/.zst suffix; AUTO if unknown. */
static rf_ingest_format format_from_name(const char *path) {
    const char *b = base_name(path);
    size_t n = strlen(b);
    static const char *const comp[] = {".gz", ".zst", ".zstd"};
    for (size_t i = 0; i < 3; i++) {
        size_t k = strlen(comp[i]);
        if (n > k && strcmp(b + n - k, comp[i]) == 0) {
            n -= k;
            break;
        }
    }
    static const struct {
        const char *ext;
        rf_ingest_format f;
    } map[] = {{".jsonl", RF_FORMAT_JSONL},  {".json", RF_FORMAT_JSONL},
               {".ndjson", RF_FORMAT_JSONL}, {".csv", RF_FORMAT_CSV},
               {".tsv", RF_FORMAT_TSV},      {".txt", RF_FORMAT_TEXT},
               {".raw", RF_FORMAT_TEXT}};
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        size_t k = strlen(map[i].ext);
        if (n > k && strncmp(b + n - k, map[i].ext, k) == 0) return map[i].f;
    }
    return RF_FORMAT_AUTO;
}

/* Pushes a reject record with an excerpt of the offending bytes. */
static int push_reject(rf_ibatch *b, uint32_t src, uint64_t line, uint64_t offset,
                       const char *reason, const char *bytes, size_t n, const char *detail) {
    rf_rec *r = rf_ibatch_push(b);
    if (!r) return RF_ERR_NOMEM;
    r->kind = RF_REC_REJECT;
    r->src = src;
    r->line = line;
    r->offset = offset;
    r->reason = reason;
    r->a = rf_ibatch_keep(b, bytes, n < EXCERPT_BYTES ? n : EXCERPT_BYTES);
    if (detail) r->b = rf_ibatch_keep(b, detail, strlen(detail));
    return r->a.len == RF_NO_SPAN || r->b.len == RF_NO_SPAN ? RF_ERR_NOMEM : 0;
}

static int push_fields(rf_ibatch *b, uint32_t src, uint64_t line, uint64_t offset, const char *text,
                       size_t n, const char *label, size_t label_len, const char *id,
                       size_t id_len) {
    rf_rec *r = rf_ibatch_push(b);
    if (!r) return RF_ERR_NOMEM;
    r->kind = RF_REC_FIELDS;
    r->src = src;
    r->line = line;
    r->offset = offset;
    r->a = rf_ibatch_keep(b, text, n);
    if (label) r->b = rf_ibatch_keep(b, label, label_len);
    if (id) r->c = rf_ibatch_keep(b, id, id_len);
    return r->a.len == RF_NO_SPAN || r->b.len == RF_NO_SPAN || r->c.len == RF_NO_SPAN ? RF_ERR_NOMEM
                                                                                      : 0;
}

/* ---- CSV/TSV ---------------------------------------------------------------- */

/* Column index of a name: in the header (or `columns`), else a 0-based number. */
static int resolve_column(rf_source *s, const char *name, size_t ncols, long *col) {
    const char *p = s->names.data;
    for (size_t i = 0; p && i < ncols; i++, p += strlen(p) + 1) {
        if (strcmp(p, name) == 0) {
            *col = (long)i;
            return 0;
        }
    }
    char *e;
    long v = strtol(name, &e, 10);
    if (*name && !*e && isdigit((unsigned char)*name) && v < 1 << 20) {
        *col = v;
        return 0;
    }
    return rf_fail(RF_ERR_NOT_FOUND, "%s: column '%s' is not in the %s", s->in[s->cur].path, name,
                   s->o->header ? "header" : "columns list");
}

/* Maps the configured fields to column indexes once the names are known. */
static int map_columns(rf_source *s, size_t ncols) {
    const rf_ingest_opts *o = s->o;
    int rc;
    for (size_t i = 0; i < o->n_text_fields; i++)
        if ((rc = resolve_column(s, o->text_fields[i], ncols, &s->text_col[i]))) return rc;
    s->label_col = s->id_col = -1;
    if (o->label_field && (rc = resolve_column(s, o->label_field, ncols, &s->label_col))) return rc;
    if (o->id_field && (rc = resolve_column(s, o->id_field, ncols, &s->id_col))) return rc;
    s->want_fields = ncols;
    return 0;
}

static int csv_start(rf_source *s) {
    const rf_ingest_opts *o = s->o;
    bool tsv = s->fmt == RF_FORMAT_TSV;
    rf_csv_opts co = {tsv ? '\t' : ',', o->quote, o->max_record};
    if (tsv && !o->quote_set) co.quote = -1; /* TSV: no quoting unless asked */
    rf_csv_free(&s->csv);
    rf_csv_init(&s->csv, &co);
    rf_buf_reset(&s->names);
    s->need_header = o->header;
    if (o->header) return 0;
    for (size_t i = 0; i < o->n_columns; i++)
        if (rf_buf_append(&s->names, o->columns[i], strlen(o->columns[i]) + 1)) return RF_ERR_NOMEM;
    return map_columns(s, o->n_columns);
}

static int csv_record(rf_source *s, rf_ibatch *b, uint32_t src) {
    rf_csv *c = &s->csv;
    size_t len;
    if (c->nfields == 0) { /* a blank line */
        s->skipped++;
        return 0;
    }
    if (s->need_header) {
        s->need_header = false;
        s->skipped++;
        for (size_t i = 0; i < c->nfields; i++) {
            const char *f = rf_csv_field(c, i, &len);
            if (rf_buf_append(&s->names, f, len + 1)) return RF_ERR_NOMEM;
        }
        return map_columns(s, c->nfields);
    }
    if (s->want_fields && c->nfields != s->want_fields) {
        char detail[64];
        snprintf(detail, sizeof detail, "%zu fields, expected %zu", c->nfields, s->want_fields);
        return push_reject(b, src, s->rec_line, s->rec_offset, "csv_field_count", s->rec_head,
                           s->rec_head_len, detail);
    }
    const rf_ingest_opts *o = s->o;
    /* One present text field is pushed as it is; more are joined in s->join. */
    const char *text = "";
    size_t text_len = 0, present = 0;
    rf_text_part parts[RF_TEXT_JOIN_MAX];
    rf_buf_reset(&s->join);
    for (size_t i = 0; i < o->n_text_fields; i++) {
        if ((size_t)s->text_col[i] >= c->nfields) continue;
        const char *f = rf_csv_field(c, (size_t)s->text_col[i], &len);
        if (len == 0) continue;
        if (o->text_join_skip_contained) { /* joined below */
            parts[present++] = (rf_text_part){f, len};
            continue;
        }
        if (++present == 2 && rf_buf_append(&s->join, text, text_len)) return RF_ERR_NOMEM;
        if (present >= 2 &&
            (rf_buf_puts(&s->join, o->text_join) || rf_buf_append(&s->join, f, len)))
            return RF_ERR_NOMEM;
        text = f;
        text_len = len;
    }
    if (o->text_join_skip_contained && present &&
        rf_text_join(parts, present, o->text_join, true, &s->join, &s->norm, &text, &text_len))
        return RF_ERR_NOMEM;
    if (!o->text_join_skip_contained && present >= 2) {
        text = s->join.data;
        text_len = s->join.len;
    }
    const char *label = NULL, *id = NULL;
    size_t label_len = 0, id_len = 0;
    if (s->label_col >= 0 && (size_t)s->label_col < c->nfields)
        label = rf_csv_field(c, (size_t)s->label_col, &label_len);
    if (s->id_col >= 0 && (size_t)s->id_col < c->nfields)
        id = rf_csv_field(c, (size_t)s->id_col, &id_len);
    return push_fields(b, src, s->rec_line, s->rec_offset, text, text_len, label, label_len, id,
                       id_len);
}

static int csv_line(rf_source *s, rf_ibatch *b, uint32_t src, const rf_line *ln) {
    rf_csv *c = &s->csv;
    if (!rf_csv_open(c)) {
        s->rec_line = ln->lineno;
        s->rec_offset = ln->offset;
        s->rec_head_len = ln->len < EXCERPT_BYTES ? ln->len : EXCERPT_BYTES;
        memcpy(s->rec_head, ln->data, s->rec_head_len);
    }
    if (ln->too_long) {
        rf_csv_reset(c);
        char detail[96];
        snprintf(detail, sizeof detail, "line %llu is %llu bytes, max_line %zu",
                 (unsigned long long)ln->lineno, (unsigned long long)ln->full_len, s->o->max_line);
        return push_reject(b, src, s->rec_line, s->rec_offset, "line_too_long", ln->data, ln->len,
                           detail);
    }
    rf_csv_status st = rf_csv_feed(c, ln->data, ln->len);
    switch (st) {
    case RF_CSV_MORE:
        return 0;
    case RF_CSV_RECORD:
        return csv_record(s, b, src);
    case RF_CSV_NOMEM:
        return RF_ERR_NOMEM;
    default:
        return push_reject(b, src, s->rec_line, s->rec_offset, rf_csv_status_name(st), s->rec_head,
                           s->rec_head_len, NULL);
    }
}

/* ---- Plain text -------------------------------------------------------------- */

static int para_flush(rf_source *s, rf_ibatch *b, uint32_t src) {
    rf_paragraph *p = &s->para;
    if (!p->nlines) return 0;
    int rc;
    if (p->too_long)
        rc = push_reject(b, src, p->line, p->offset, "record_too_long", p->text.data, p->text.len,
                         NULL);
    else
        rc = push_fields(b, src, p->line, p->offset, p->text.data, p->text.len, NULL, 0, NULL, 0);
    rf_paragraph_reset(p);
    return rc;
}

static int text_line(rf_source *s, rf_ibatch *b, uint32_t src, const rf_line *ln, size_t n) {
    const rf_ingest_opts *o = s->o;
    if (!ln->too_long && rf_text_blank(ln->data, n)) {
        s->skipped++;
        return o->paragraphs ? para_flush(s, b, src) : 0;
    }
    if (o->paragraphs) {
        if (ln->too_long) {
            s->para.too_long = true;
            return rf_paragraph_add(&s->para, "", 0, ln->lineno, ln->offset);
        }
        return rf_paragraph_add(&s->para, ln->data, n, ln->lineno, ln->offset);
    }
    if (ln->too_long)
        return push_reject(b, src, ln->lineno, ln->offset, "line_too_long", ln->data, n, NULL);
    if (o->skip_headings && rf_text_wikitext_heading(ln->data, n))
        return push_reject(b, src, ln->lineno, ln->offset, "heading", ln->data, n, NULL);
    return push_fields(b, src, ln->lineno, ln->offset, ln->data, n, NULL, 0, NULL, 0);
}

/* ---- Inputs -------------------------------------------------------------------- */

static int open_next(rf_source *s) {
    const input *in = &s->in[s->cur];
    int rc = in->data ? rf_reader_open_mem(in->data, in->len, in->path, s->o->max_line, &s->r)
                      : rf_reader_open(in->path, s->o->max_line, &s->r);
    if (rc) return rc;
    s->fmt = s->o->format != RF_FORMAT_AUTO ? s->o->format : format_from_name(s->in[s->cur].path);
    return 0;
}

/* End of the open input: flushes a pending record and closes the reader. */
static int close_input(rf_source *s, rf_ibatch *b) {
    uint32_t src = (uint32_t)s->cur;
    int rc = 0;
    if (s->fmt == RF_FORMAT_CSV || s->fmt == RF_FORMAT_TSV) {
        if (rf_csv_finish(&s->csv) == RF_CSV_UNTERMINATED)
            rc = push_reject(b, src, s->rec_line, s->rec_offset, "csv_unterminated_quote",
                             s->rec_head, s->rec_head_len, "input ended inside a quoted field");
    } else if (s->fmt == RF_FORMAT_TEXT) {
        rc = para_flush(s, b, src);
    }
    s->bytes_done += rf_reader_bytes_out(s->r);
    rf_reader_close(s->r);
    s->r = NULL;
    s->cur++;
    return rc;
}

int rf_source_fill(rf_source *s, rf_ibatch *b) {
    size_t start = b->n;
    while (b->n < s->o->batch_docs && b->arena.len < BATCH_ARENA_MAX) {
        if (!s->r) {
            if (s->cur == s->n_in) break;
            int rc = open_next(s);
            if (rc) return rc;
        }
        rf_line ln;
        int got = rf_reader_next(s->r, &ln), rc = 0;
        if (got < 0) return got;
        if (got == 0) {
            if ((rc = close_input(s, b))) return rc;
            continue;
        }
        uint32_t src = (uint32_t)s->cur;
        const char *data = ln.data;
        size_t n = ln.len;
        if (ln.lineno == 1 && n >= 3 && memcmp(data, "\xEF\xBB\xBF", 3) == 0) {
            ln.data = data += 3; /* UTF-8 byte order mark */
            ln.len = n -= 3;
        }
        if (s->fmt == RF_FORMAT_AUTO && ln.lineno == 1) {
            /* Unknown extension: JSON Lines if the first line is an object. */
            size_t i = 0;
            while (i < n && isspace((unsigned char)data[i]))
                i++;
            s->fmt = i < n && data[i] == '{' ? RF_FORMAT_JSONL : RF_FORMAT_TEXT;
            rf_info("ingest", "%s: format %s (sniffed)", s->in[src].path,
                    rf_ingest_format_name(s->fmt));
        }
        if (ln.lineno == 1 && (s->fmt == RF_FORMAT_CSV || s->fmt == RF_FORMAT_TSV) &&
            (rc = csv_start(s)))
            return rc;
        if (s->fmt == RF_FORMAT_CSV || s->fmt == RF_FORMAT_TSV) {
            rc = csv_line(s, b, src, &ln);
        } else {
            if (!ln.too_long && n && data[n - 1] == '\r') n--;
            if (s->fmt == RF_FORMAT_TEXT) {
                rc = text_line(s, b, src, &ln, n);
            } else if (ln.too_long) {
                char detail[96];
                snprintf(detail, sizeof detail, "%llu bytes, max_line %zu",
                         (unsigned long long)ln.full_len, s->o->max_line);
                rc = push_reject(b, src, ln.lineno, ln.offset, "line_too_long", data, n, detail);
            } else if (rf_text_blank(data, n)) {
                s->skipped++;
            } else {
                rf_rec *r = rf_ibatch_push(b);
                if (!r) return RF_ERR_NOMEM;
                *r = (rf_rec){.kind = RF_REC_JSON,
                              .src = src,
                              .line = ln.lineno,
                              .offset = ln.offset,
                              .a = rf_ibatch_keep(b, data, n),
                              .b = {RF_NO_SPAN, 0},
                              .c = {RF_NO_SPAN, 0}};
                if (r->a.len == RF_NO_SPAN) return RF_ERR_NOMEM;
            }
        }
        if (rc) return rc;
    }
    return b->n > start;
}
