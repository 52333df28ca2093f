/* Internal to the ingest stage: the reading side. Walks the inputs in order,
 * splits them into records per format (JSON line, CSV/TSV record, text line or
 * paragraph) and fills batches. Single-threaded; the heavy per-record work is
 * left to the workers (process.h). Records refused while reading (a line too
 * long, a CSV quote error, a WikiText heading) go into the batch as rejects, in
 * stream order. */
#ifndef RF_INGEST_SOURCE_H
#define RF_INGEST_SOURCE_H

#include <stdint.h>

#include "ingest/batch.h"
#include "ingest/ingest.h"

typedef struct rf_source rf_source;

/* Checks that every input can be opened; RF_ERR_NOT_FOUND/IO naming it. */
int rf_source_open(const rf_ingest_opts *o, const char *const *inputs, size_t n, rf_source **out);
/* One input in memory, data[0..len) (plain, gzip or zstd), which must outlive
 * the source; name stands for its path (document ids, rejects). */
int rf_source_open_mem(const rf_ingest_opts *o, const char *name, const void *data, size_t len,
                       rf_source **out);
void rf_source_close(rf_source *s);

/* Fills b (cleared by the caller) with up to o->batch_docs records. Returns 1
 * if it added any, 0 at the end of all inputs, or a negative rf_err (read
 * failure, corrupt compressed data, a CSV column that does not exist). */
int rf_source_fill(rf_source *s, rf_ibatch *b);

const char *rf_source_path(const rf_source *s, uint32_t src); /* as given */
/* Id prefix: the file name, or the path (plus "@k" for a repeat) when inputs
 * share a file name. */
const char *rf_source_base(const rf_source *s, uint32_t src);
uint64_t rf_source_bytes(const rf_source *s);         /* decompressed bytes read */
uint64_t rf_source_lines_skipped(const rf_source *s); /* blank lines, CSV headers */

#endif
