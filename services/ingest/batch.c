/* Ingest work batches: see batch.h. */
#include "ingest/batch.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "ingest/source.h"

rf_ibatch *rf_ibatch_new(void) {
    return calloc(1, sizeof(rf_ibatch));
}

void rf_ibatch_free(rf_ibatch *b) {
    if (!b) return;
    free(b->recs);
    rf_buf_free(&b->arena);
    rf_buf_free(&b->docs_out);
    rf_buf_free(&b->rejects_out);
    rf_doc_batch_free(b->docs);
    free(b->rejs);
    rf_buf_free(&b->rej_bytes);
    free(b);
}

void rf_ibatch_clear(rf_ibatch *b) {
    b->n = 0;
    rf_buf_reset(&b->arena);
    rf_buf_reset(&b->docs_out);
    rf_buf_reset(&b->rejects_out);
    rf_doc_batch_free(b->docs);
    b->docs = NULL;
    b->n_rejs = 0;
    rf_buf_reset(&b->rej_bytes);
    b->n_reasons = 0;
    b->kept = b->augmented = 0;
    b->utf8_repairs = b->controls_removed = b->nul_bytes = b->entities = b->tags = 0;
    b->err = 0;
}

rf_rec *rf_ibatch_push(rf_ibatch *b) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        rf_rec *r = realloc(b->recs, cap * sizeof(*r));
        if (!r) return NULL;
        b->recs = r;
        b->cap = cap;
    }
    rf_rec *r = &b->recs[b->n++];
    memset(r, 0, sizeof(*r));
    r->a.off = r->b.off = r->c.off = RF_NO_SPAN;
    return r;
}

rf_span rf_ibatch_keep(rf_ibatch *b, const char *p, size_t n) {
    rf_span s = {b->arena.len, n};
    /* Keep a NUL after every span so it can be read as a C string too. */
    if (rf_buf_reserve(&b->arena, n + 1)) return (rf_span){RF_NO_SPAN, RF_NO_SPAN};
    if (n) memcpy(b->arena.data + b->arena.len, p, n);
    b->arena.len += n;
    b->arena.data[b->arena.len++] = '\0';
    return s;
}

int rf_ibatch_keep_reject(rf_ibatch *b, uint32_t src, uint64_t line, uint64_t offset,
                          const char *reason, const char *excerpt, size_t n) {
    if (b->n_rejs == b->cap_rejs) {
        size_t cap = b->cap_rejs ? b->cap_rejs * 2 : 64;
        rf_ibatch_reject *r = realloc(b->rejs, cap * sizeof(*r));
        if (!r) return RF_ERR_NOMEM;
        b->rejs = r;
        b->cap_rejs = cap;
    }
    size_t off = b->rej_bytes.len;
    if (n && rf_buf_append(&b->rej_bytes, excerpt, n)) return RF_ERR_NOMEM;
    b->rejs[b->n_rejs++] = (rf_ibatch_reject){src, line, offset, reason, off, n};
    return 0;
}

void rf_ibatch_count(rf_ibatch *b, const char *reason) {
    for (size_t i = 0; i < b->n_reasons; i++) {
        if (b->reasons[i].reason == reason || strcmp(b->reasons[i].reason, reason) == 0) {
            b->reasons[i].n++;
            return;
        }
    }
    if (b->n_reasons == RF_INGEST_MAX_REASONS) {
        /* More distinct reasons than any configuration produces: a bug. */
        b->err = rf_fail(RF_ERR_INTERNAL, "ingest: more than %d reject reasons in a batch",
                         RF_INGEST_MAX_REASONS);
        return;
    }
    b->reasons[b->n_reasons++] = (rf_reason_count){reason, 1};
}

int rf_ibatch_hand_on(rf_ibatch *b, const rf_source *src, rf_ingest_reject **view, size_t *cap,
                      rf_ingest_batch_fn fn, void *ctx) {
    if (b->n_rejs > *cap) {
        rf_ingest_reject *v = realloc(*view, b->n_rejs * sizeof(*v));
        if (!v) return RF_ERR_NOMEM;
        *view = v;
        *cap = b->n_rejs;
    }
    /* Every excerpt may be empty: then no byte was ever kept. */
    const char *bytes = b->rej_bytes.data ? b->rej_bytes.data : "";
    for (size_t i = 0; i < b->n_rejs; i++) {
        const rf_ibatch_reject *r = &b->rejs[i];
        (*view)[i] =
            (rf_ingest_reject){rf_source_path(src, r->src), r->line,       r->offset, r->reason,
                               bytes + r->excerpt_off,      r->excerpt_len};
    }
    rf_ingest_batch out = {b->seq, b->n, b->kept, b->docs, *view, b->n_rejs};
    b->docs = NULL;
    return fn(ctx, &out);
}
