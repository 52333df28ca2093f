/* Internal to the ingest stage: the unit of work passed from the reading
 * thread (source.c) to the workers (process.c) and on to the writer (ingest.c).
 * Batches are pooled and reused, so their buffers stop growing after warm-up. */
#ifndef RF_INGEST_BATCH_H
#define RF_INGEST_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/doc.h"
#include "ingest/ingest.h"

typedef struct rf_source rf_source;

#define RF_NO_SPAN            SIZE_MAX
#define RF_INGEST_MAX_REASONS 48

typedef enum rf_rec_kind {
    RF_REC_JSON,   /* span a: a JSON line for the worker to parse */
    RF_REC_FIELDS, /* spans: a text, b label (or none), c id (or none) */
    RF_REC_REJECT, /* refused while reading: reason, span a excerpt, b detail */
} rf_rec_kind;

typedef struct rf_span {
    size_t off; /* into the batch arena; RF_NO_SPAN when absent */
    size_t len;
} rf_span;

typedef struct rf_rec {
    rf_rec_kind kind;
    uint32_t src; /* input index */
    uint64_t line;
    uint64_t offset;
    rf_span a, b, c;
    const char *reason; /* RF_REC_REJECT */
} rf_rec;

typedef struct rf_reason_count {
    const char *reason; /* static string */
    int64_t n;
} rf_reason_count;

/* A reject kept for rf_ingest_sink.batch; its excerpt is in rej_bytes. */
typedef struct rf_ibatch_reject {
    uint32_t src; /* input index */
    uint64_t line, offset;
    const char *reason; /* static string */
    size_t excerpt_off, excerpt_len;
} rf_ibatch_reject;

typedef struct rf_ibatch {
    uint64_t seq;
    rf_rec *recs;
    size_t n, cap;
    rf_buf arena; /* record bytes, filled by the reader */
    /* Filled by the worker: */
    rf_buf docs_out;        /* JSON lines of kept documents and augmented copies */
    rf_buf rejects_out;     /* JSON lines of rejects */
    rf_doc_batch *docs;     /* kept documents for a downstream stage, or NULL */
    rf_ibatch_reject *rejs; /* structured rejects, when the worker keeps them */
    size_t n_rejs, cap_rejs;
    rf_buf rej_bytes; /* their excerpts */
    rf_reason_count reasons[RF_INGEST_MAX_REASONS];
    size_t n_reasons;
    int64_t kept, augmented;
    int64_t utf8_repairs, controls_removed, nul_bytes, entities, tags;
    int err; /* a processing failure (out of memory): fails the run */
} rf_ibatch;

rf_ibatch *rf_ibatch_new(void);
void rf_ibatch_free(rf_ibatch *b);
/* Empties a batch for reuse, keeping its memory. */
void rf_ibatch_clear(rf_ibatch *b);
/* Appends a record slot (zeroed, spans absent); NULL on OOM. */
rf_rec *rf_ibatch_push(rf_ibatch *b);
/* Copies bytes into the arena and returns their span; len RF_NO_SPAN on OOM. */
rf_span rf_ibatch_keep(rf_ibatch *b, const char *p, size_t n);
/* Keeps one structured reject (excerpt copied); RF_ERR_NOMEM on OOM. */
int rf_ibatch_keep_reject(rf_ibatch *b, uint32_t src, uint64_t line, uint64_t offset,
                          const char *reason, const char *excerpt, size_t n);
/* Counts one reject for reason. */
void rf_ibatch_count(rf_ibatch *b, const char *reason);
/* Gives b to fn as an rf_ingest_batch (ingest.h): its documents, moved out of
 * b, and its structured rejects, named after src's inputs. *view (*cap
 * entries) is the caller's scratch for the rejects, reused from batch to
 * batch; the caller frees it. */
int rf_ibatch_hand_on(rf_ibatch *b, const rf_source *src, rf_ingest_reject **view, size_t *cap,
                      rf_ingest_batch_fn fn, void *ctx);

#endif
