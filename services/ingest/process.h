/* Internal to the ingest stage: the worker side. Turns a batch of raw records
 * into output lines: JSON parsing and field extraction, label mapping, then
 * the verdict of decide.h (clean -> quality filter -> language filter, the
 * same function the service's Push path calls) and augmentation, writing each
 * record to docs_out or rejects_out and counting it. A worker holds scratch
 * buffers reused from batch to batch; one per thread. */
#ifndef RF_INGEST_PROCESS_H
#define RF_INGEST_PROCESS_H

#include <stdbool.h>

#include "ingest/augment.h"
#include "ingest/batch.h"
#include "ingest/ingest.h"
#include "ingest/source.h"

typedef struct rf_worker rf_worker;

/* aug may be NULL when augmentation is off; src provides file names (read
 * only). want_docs also fills b->docs for a downstream stage. */
int rf_worker_new(const rf_ingest_opts *o, const rf_augmenter *aug, const rf_source *src,
                  bool want_docs, rf_worker **out);
void rf_worker_free(rf_worker *w);
/* Also keep each reject structured in the batch (rf_ibatch_keep_reject). */
void rf_worker_keep_rejects(rf_worker *w);

/* Processes every record of b. Returns 0, or a negative rf_err (also left in
 * b->err) when memory ran out. */
int rf_worker_process(rf_worker *w, rf_ibatch *b);

#endif
