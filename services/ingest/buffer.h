/* Ingesting one input held in memory (a Kafka message of JSON Lines, plain,
 * gzip or zstd) on the calling thread: the same reading, field mapping,
 * cleaning and filters as rf_ingest_run, with the results handed back in
 * memory for the caller to route. Augmentation is not applied. */
#ifndef RF_INGEST_BUFFER_H
#define RF_INGEST_BUFFER_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/doc.h"
#include "ingest/ingest.h"

typedef struct rf_ingest_out {
    rf_doc_batch *docs; /* kept documents in input order; NULL when none */
    rf_buf rejects;     /* a JSON line per rejected record, as rf_ingest_run writes them */
    int64_t records, kept, rejected;
} rf_ingest_out;

/* Ingests data[0..len) named name (the "path" of its ids and rejects) into
 * *out, which starts zeroed and is freed with rf_ingest_out_free whatever
 * the result. records = kept + rejected. Fails (negative rf_err) only on out
 * of memory, corrupt compressed data or a CSV mapping error. */
int rf_ingest_buffer(const rf_ingest_opts *o, const char *name, const void *data, size_t len,
                     rf_ingest_out *out);
void rf_ingest_out_free(rf_ingest_out *out);

#endif
