/* One in-memory input through the reading and worker sides, inline. */
#include "ingest/buffer.h"

#include <stdlib.h>

#include "common/error.h"
#include "ingest/batch.h"
#include "ingest/process.h"
#include "ingest/source.h"

int rf_ingest_buffer(const rf_ingest_opts *o, const char *name, const void *data, size_t len,
                     rf_ingest_batch_fn fn, void *ctx) {
    if (o->n_text_fields == 0) return rf_fail(RF_ERR_INVALID, "ingest: no text field");
    rf_ingest_opts one = *o; /* shallow: strings stay o's */
    one.augment.enabled = false;
    rf_source *src = NULL;
    rf_worker *w = NULL;
    rf_ingest_reject *view = NULL;
    size_t cap = 0;
    rf_ibatch *b = rf_ibatch_new();
    int rc = b ? rf_source_open_mem(&one, name, data, len, &src) : RF_ERR_NOMEM;
    if (rc == RF_OK && (rc = rf_worker_new(&one, NULL, src, true, &w)) == RF_OK)
        rf_worker_keep_rejects(w);
    while (rc == RF_OK) {
        rf_ibatch_clear(b);
        int got = rf_source_fill(src, b);
        if (got <= 0) {
            rc = got;
            break;
        }
        if ((rc = rf_worker_process(w, b)) < 0) break;
        if (b->kept + (int64_t)b->n_rejs != (int64_t)b->n)
            rc = rf_fail(RF_ERR_INTERNAL, "ingest: a batch accounts for %lld of %zu records",
                         (long long)(b->kept + (int64_t)b->n_rejs), b->n);
        else
            rc = rf_ibatch_hand_on(b, src, &view, &cap, fn, ctx);
    }
    free(view);
    rf_worker_free(w);
    rf_source_close(src);
    rf_ibatch_free(b);
    return rc;
}
