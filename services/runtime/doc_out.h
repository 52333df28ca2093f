/* Kept documents (common/doc.h) on their way out as protobuf Documents: one
 * DocumentBatch to a Kafka topic (the ingest service's file loader and Kafka
 * source) or a DocumentList (refinery submit). The protobuf views point into
 * the rf_docs, which must outlive the send; the arrays are reused. */
#ifndef RF_SVC_DOC_OUT_H
#define RF_SVC_DOC_OUT_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/doc.h"
#include "runtime/kafka/kafka.h"
#include "refinery.pb-c.h"

typedef struct rf_doc_out {
    Refinery__V1__Document *docs;
    Refinery__V1__Document **ptrs; /* docs[0..n), as a repeated field wants them */
    size_t n, cap;
    rf_buf pack;
} rf_doc_out;

/* Why d cannot travel as a protobuf Document, or NULL: protobuf-c strings
 * end at the first NUL ("nul_in_text") and must be UTF-8
 * ("invalid_utf8_id"; texts and sources are UTF-8 by the time they get here,
 * ids come from the data). */
const char *rf_doc_out_refusal(const rf_doc *d);
/* Appends a view of d (no copy); RF_ERR_NOMEM. */
int rf_doc_out_add(rf_doc_out *o, const rf_doc *d);
/* Produces docs[0..n) as one DocumentBatch (run_id, seq), keyed by run_id,
 * accounted in t; then empties the list. Nothing is produced when n = 0. */
int rf_doc_out_produce(rf_doc_out *o, rf_kafka_producer *p, rf_kafka_tracker *t, const char *topic,
                       const char *run_id, uint64_t seq);
void rf_doc_out_free(rf_doc_out *o);

#endif
