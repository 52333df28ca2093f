/* The tokenizer service's work, on one loaded tokenizer:
 *
 * - stage (rf_stage_loop.process): DocumentBatch from docs.unique -> each
 *   document encoded -> TokenBatch to tokens.train and to tokens.eval (both
 *   always sent, possibly empty, with the input batch's (run_id, seq) and
 *   `eval` set on the eval one). Encoding, split and rejects are
 *   rf_tok_split_batch's (split_batch.h), the function the embedded tokenizer
 *   stage calls: a sequence's cluster is the split key (the dedup cluster, or
 *   the id's hash without one, as in the shards). Counts: in, out (sequences
 *   produced), rejected (documents without text or that the tokenizer
 *   refused, also counted in stats as tokenizer.rejected.<reason> and logged).
 *   Nothing is cut silently: each sequence carries its length before
 *   truncation (original_length) and whether it was cut to the tokenizer's
 *   max_length (truncated), as Tokenize's do; cut ones are counted as
 *   tokenizer.truncated and logged per batch.
 * - gRPC refinery.v1.Tokenizer/Tokenize (unary): every text encoded, in
 *   order. A text that is not valid UTF-8 (proto3 strings must be) fails the
 *   call with INVALID_ARGUMENT naming the text and byte, rather than being
 *   repaired: a client should learn that its input is not what it meant. */
#ifndef RF_SVC_TOKENIZER_SERVICE_H
#define RF_SVC_TOKENIZER_SERVICE_H

#include <stdbool.h>

#include "runtime/kafka/kafka.h"
#include "runtime/rpc/rpc.h"
#include "runtime/store/store.h"
#include "runtime/stage_loop.h"
#include "tokenizer/tokenizer.h"

typedef struct rf_tokenizer_service_opts {
    const char *tokenizer; /* tokenizer.json (or anything rf_tokenizer_load takes) */
    bool add_special;      /* stage: add the post-processor's special tokens */
    double eval_fraction;
    uint64_t seed;
    rf_kafka_producer *producer; /* stage only */
    rf_stats *stats;             /* stage: reject counters (may be NULL) */
    const char *topic_train, *topic_eval;
} rf_tokenizer_service_opts;

typedef struct rf_tokenizer_service rf_tokenizer_service;

int rf_tokenizer_service_new(const rf_tokenizer_service_opts *o, rf_tokenizer_service **out);
void rf_tokenizer_service_free(rf_tokenizer_service *s);

/* rf_stage_loop.process, user = the service (single-threaded use). */
int rf_tokenizer_service_process(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                                 rf_kafka_tracker *t, rf_store_counts *counts);

/* Adds /refinery.v1.Tokenizer/Tokenize to server (handlers run on its workers). */
int rf_tokenizer_service_register(rf_tokenizer_service *s, rf_rpc_server *server);

#endif
