/* refinery.v1.Ingest/Push: a client streams Documents (or, with PushLists,
 * DocumentLists: many documents per message, handled the same); each is cleaned and
 * filtered like the ingest stage does (ingest/clean.h, filter.h, langid.h),
 * kept ones travel in DocumentBatch messages to the clean topic (key = run
 * id), refused ones as Reject messages with their reason to the rejects
 * topic. The PushSummary (received = accepted + rejected) is sent only once
 * every message of the stream is durably in Kafka; otherwise the call fails
 * with UNAVAILABLE and the client should push again (dedup absorbs repeats).
 *
 * The run is named by the request metadata "refinery-run-id" ("adhoc" when
 * absent). Batches are numbered from a service-wide counter that starts at
 * the service's start time in microseconds, so numbers do not repeat across
 * restarts. Text must be valid UTF-8 (proto3 strings): a document that is
 * not is rejected with reason invalid_utf8, not repaired.
 *
 * With a store, the run id is required (INVALID_ARGUMENT without it), must
 * exist (NOT_FOUND) and take input: a sealed or ended run is
 * FAILED_PRECONDITION; a pending run becomes running. When the run's spec
 * has an `ingest:` section, its cleaning, quality and language settings
 * apply to the stream (defaults as in `refinery run`), else the service's
 * (text that is not UTF-8 is rejected either way). Once the stream's
 * messages are delivered each batch's counts are recorded in stage_progress
 * under stage "ingest" (a last row without a DocumentBatch holds trailing
 * rejects), so that
 * sum(docs_in) = sum(docs_out) + sum(rejected) = documents pushed. */
#ifndef RF_SVC_INGEST_SERVICE_H
#define RF_SVC_INGEST_SERVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/stats.h"
#include "ingest/clean.h"
#include "ingest/filter.h"
#include "ingest/langid.h"
#include "runtime/kafka/kafka.h"
#include "runtime/rpc/rpc.h"
#include "runtime/store/store.h"

typedef struct rf_ingest_service_opts {
    rf_kafka_producer *producer; /* shared by every stream; owned by the caller */
    rf_store *store;             /* optional; used under the service's lock */
    const char *topic_clean;     /* "docs.clean" */
    const char *topic_rejected;  /* "docs.rejected" */
    size_t batch_docs;           /* kept documents per DocumentBatch */
    double delivery_timeout_s;   /* how long a stream's end waits for Kafka */
    rf_clean_opts clean;
    bool quality_enabled;
    rf_quality_opts quality;
    rf_langid_opts language;
} rf_ingest_service_opts;

typedef struct rf_ingest_service rf_ingest_service;

/* Defaults: the ingest stage's cleaning and filters, batches of 256. */
void rf_ingest_service_opts_default(rf_ingest_service_opts *o);
int rf_ingest_service_new(const rf_ingest_service_opts *o, rf_ingest_service **out);
/* Adds Ingest/Push and Ingest/PushLists to s and reports "refinery.v1.Ingest"
 * as serving. */
int rf_ingest_service_register(rf_ingest_service *svc, rf_rpc_server *s);
/* ingest.received, ingest.kept, ingest.rejected.<reason>, ingest.batches,
 * ingest.streams_failed. */
rf_stats *rf_ingest_service_stats(rf_ingest_service *svc);
void rf_ingest_service_free(rf_ingest_service *svc);

#endif
