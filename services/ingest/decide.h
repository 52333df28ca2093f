/* The ingest verdict on one document, shared by every ingest driver so that
 * they cannot drift apart:
 *
 *   clean (clean.h) -> quality filter (filter.h) -> language filter (langid.h)
 *
 * giving either the cleaned text (keep) or the first reject reason. Callers:
 * the workers of rf_ingest_run (process.c: `refinery run`, Ingest.Load, the
 * Kafka source, `refinery submit`'s reading side), after field extraction and
 * label mapping; and the service's Push / PushLists handler, whose documents
 * arrive with text, label and id already mapped by the client.
 *
 * What a caller does around the verdict is its own: the workers map labels
 * before and augment kept documents after (augmentation is a property of
 * `refinery run`; the services turn it off, see ingest_files.c); each side
 * writes its outputs in its own form (JSON lines vs Kafka messages) and adds
 * the cleaning counters (rf_verdict.clean) to its accounts.
 *
 * A decider holds the rules and the scratch memory reused from document to
 * document (cleaned text, quality n-gram tables): deciding allocates only
 * when a text is longer than any before. One decider per thread. */
#ifndef RF_INGEST_DECIDE_H
#define RF_INGEST_DECIDE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/stats.h"
#include "ingest/clean.h"
#include "ingest/filter.h"
#include "ingest/ingest.h"
#include "ingest/langid.h"

/* What decides a document. */
typedef struct rf_doc_rules {
    rf_clean_opts clean;
    bool quality_enabled;
    rf_quality_opts quality;
    rf_langid_opts language; /* n_expected 0: language filter off */
} rf_doc_rules;

/* The rules of an ingest section (a copy of its clean, quality, language keys). */
void rf_doc_rules_from_opts(const rf_ingest_opts *o, rf_doc_rules *r);

typedef struct rf_verdict {
    /* NULL: keep. Else a static reason: clean's ("invalid_utf8", "empty"),
     * then the quality filter's (e.g. "too_few_words"), then "wrong_language". */
    const char *reject;
    /* Keep: the cleaned text (NUL-terminated). Reject: the bytes the reason is
     * about, for an excerpt: the input for a cleaning reject, the cleaned text
     * for a filter's. Valid until the decider's next call. */
    const char *text;
    size_t len;
    rf_clean_result clean; /* what cleaning did (counters), always filled */
} rf_verdict;

typedef struct rf_decider rf_decider;

/* A decider with a copy of rules; NULL when out of memory. */
rf_decider *rf_decider_new(const rf_doc_rules *rules);
void rf_decider_free(rf_decider *d);

/* Decides text[0..n) (text may be NULL when n is 0). Returns 0 with *v
 * filled, or a negative rf_err (out of memory; CLD2 refusing text that
 * cleaning passed) that should stop the caller: it is not about the document. */
int rf_decide(rf_decider *d, const char *text, size_t n, rf_verdict *v);

/* Adds the cleaning counters of one verdict (those not zero) to stats under
 * the names rf_ingest_run uses: ingest.clean.utf8_repairs, .controls_removed,
 * .nul_bytes, .entities_decoded, .tags_removed. */
void rf_verdict_count_clean(const rf_verdict *v, rf_stats *stats);

#endif
