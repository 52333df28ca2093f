/* One in-memory input through the reading and worker sides, inline. */
#include "ingest/buffer.h"

#include <string.h>

#include "common/error.h"
#include "ingest/batch.h"
#include "ingest/process.h"
#include "ingest/source.h"

void rf_ingest_out_free(rf_ingest_out *out) {
    rf_doc_batch_free(out->docs);
    rf_buf_free(&out->rejects);
    memset(out, 0, sizeof *out);
}

/* Moves the kept documents and reject lines of b into out. */
static int take(rf_ibatch *b, rf_ingest_out *out) {
    if (b->err) return b->err;
    int64_t rejected = 0;
    for (size_t i = 0; i < b->n_reasons; i++)
        rejected += b->reasons[i].n;
    if (b->kept + rejected != (int64_t)b->n)
        return rf_fail(RF_ERR_INTERNAL, "ingest: a batch accounts for %lld of %zu records",
                       (long long)(b->kept + rejected), b->n);
    out->records += (int64_t)b->n;
    out->kept += b->kept;
    out->rejected += rejected;
    if (b->rejects_out.len && rf_buf_append(&out->rejects, b->rejects_out.data, b->rejects_out.len))
        return RF_ERR_NOMEM;
    if (!b->docs) return RF_OK;
    if (!out->docs) { /* the common case: one batch holds the whole input */
        out->docs = b->docs;
        b->docs = NULL;
        return RF_OK;
    }
    for (size_t i = 0; i < b->docs->n; i++) {
        rf_doc *d = rf_doc_batch_push(out->docs);
        if (!d) return RF_ERR_NOMEM;
        *d = b->docs->docs[i];
        memset(&b->docs->docs[i], 0, sizeof b->docs->docs[i]); /* moved */
    }
    return RF_OK;
}

int rf_ingest_buffer(const rf_ingest_opts *o, const char *name, const void *data, size_t len,
                     rf_ingest_out *out) {
    if (o->n_text_fields == 0) return rf_fail(RF_ERR_INVALID, "ingest: no text field");
    rf_source *src = NULL;
    rf_worker *w = NULL;
    rf_ibatch *b = rf_ibatch_new();
    int rc = b ? rf_source_open_mem(o, name, data, len, &src) : RF_ERR_NOMEM;
    if (rc == RF_OK) rc = rf_worker_new(o, NULL, src, true, &w);
    while (rc == RF_OK) {
        rf_ibatch_clear(b);
        int got = rf_source_fill(src, b);
        if (got <= 0) {
            rc = got;
            break;
        }
        rf_worker_process(w, b);
        rc = take(b, out);
    }
    rf_worker_free(w);
    rf_source_close(src);
    rf_ibatch_free(b);
    return rc;
}
