/* Ingesting one input held in memory (a Kafka message of JSON Lines, plain,
 * gzip or zstd) on the calling thread: the same reading, field mapping,
 * cleaning and filters as rf_ingest_run, each internal batch handed to a
 * callback as rf_ingest_run hands them to rf_ingest_sink.batch.
 * Augmentation is not applied. */
#ifndef RF_INGEST_BUFFER_H
#define RF_INGEST_BUFFER_H

#include <stddef.h>

#include "ingest/ingest.h"

/* Ingests data[0..len) named name (the "path" of its document ids and
 * rejects), calling fn for every internal batch in order: its documents are
 * fn's (also when it fails), its rejects valid during the call, and
 * records = kept + rejects. A non-zero return of fn stops with it; otherwise
 * fails (negative rf_err) only on out of memory, corrupt compressed data or a
 * CSV mapping error. */
int rf_ingest_buffer(const rf_ingest_opts *o, const char *name, const void *data, size_t len,
                     rf_ingest_batch_fn fn, void *ctx);

#endif
