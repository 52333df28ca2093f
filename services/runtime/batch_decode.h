/* Decoding a DocumentBatch from Kafka as strictly as proto3 asks: protobuf-c
 * does not check that string fields are UTF-8, and a batch that is not would
 * pass through a stage only to be refused by a stricter decoder downstream. */
#ifndef RF_SVC_BATCH_DECODE_H
#define RF_SVC_BATCH_DECODE_H

#include "runtime/kafka/kafka.h"
#include "refinery.pb-c.h"

/* *out (free with refinery__v1__document_batch__free_unpacked) or
 * RF_ERR_PARSE naming what is wrong: not a DocumentBatch, or a document whose
 * id, text, source or aug_of is not UTF-8. */
int rf_svc_unpack_documents(const rf_kafka_msg *m, Refinery__V1__DocumentBatch **out);

#endif
