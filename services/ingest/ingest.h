/* The ingest stage: reads JSON Lines, CSV/TSV and plain-text inputs (plain, gzip
 * or zstd), extracts text, label and id per record, cleans, filters and
 * optionally augments the text, and writes one JSON document per kept record
 * (common/doc.h form) and one JSON reject per refused record:
 *   {"source":"a.csv","line":7,"offset":912,"reason":"invalid_json",
 *    "detail":"...","excerpt":"first bytes"}
 *
 * Accounting: every record read ends in exactly one of the two outputs, and the
 * stats satisfy  ingest.records_in = ingest.kept + sum(ingest.rejected.*).
 * Augmented copies are counted apart (ingest.augmented). Lines that are not
 * records (blank separator lines, a CSV header) are counted as
 * ingest.lines_skipped.
 *
 * Work is split into sequence-numbered batches: one thread reads and splits
 * records, `threads` workers process batches, and the calling thread writes
 * them back in sequence order, so the output is byte-identical for any thread
 * count. Memory is bounded by a fixed pool of reused batches. */
#ifndef RF_INGEST_H
#define RF_INGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/config.h"
#include "common/stage.h"
#include "common/stats.h"
#include "ingest/augment.h"
#include "ingest/clean.h"
#include "ingest/filter.h"
#include "ingest/label.h"
#include "ingest/langid.h"

#define RF_INGEST_MAX_TEXT_FIELDS 8
#define RF_INGEST_MAX_COLUMNS     64
#define RF_INGEST_MAX_ANSWERS     64

typedef enum rf_ingest_format {
    RF_FORMAT_AUTO, /* per input: by extension, then by sniffing the first line */
    RF_FORMAT_JSONL,
    RF_FORMAT_CSV,
    RF_FORMAT_TSV,
    RF_FORMAT_TEXT,
} rf_ingest_format;

typedef struct rf_ingest_opts {
    rf_ingest_format format;
    /* Field mapping: JSON keys (dotted for nested objects), CSV column names
     * (from the header or `columns`) or 0-based column indexes. The text is the
     * present text fields joined by text_join, in order. */
    const char *text_fields[RF_INGEST_MAX_TEXT_FIELDS];
    size_t n_text_fields;
    const char *text_join;
    /* Leave out a text field whose whitespace-normalized text is contained in
     * another present one (Amazon summaries cut from the review). */
    bool text_join_skip_contained;
    const char *label_field; /* NULL: no label */
    const char *id_field;    /* NULL: id is "<basename>:<line>" */
    rf_label_map label_map;  /* empty: the label must be an integer */
    /* CSV/TSV */
    bool header;                                /* first record names the columns */
    const char *columns[RF_INGEST_MAX_COLUMNS]; /* names for a header-less file */
    size_t n_columns;
    int quote; /* '"' or -1 (none); TSV defaults to none */
    bool quote_set;
    /* Plain text */
    bool paragraphs;    /* a document per blank-line-separated paragraph */
    bool skip_headings; /* WikiText " = Title = " lines are rejected as "heading" */
    /* Limits and threads */
    size_t max_line;   /* longer lines are rejected as line_too_long, not held */
    size_t max_record; /* bytes of one multi-line CSV record or paragraph */
    int threads;       /* worker threads, >= 1 */
    size_t batch_docs; /* records per batch */
    /* Text processing (clean.h, filter.h, langid.h, augment.h) */
    rf_clean_opts clean;
    rf_quality_opts quality;
    bool quality_enabled;
    rf_langid_opts language;
    rf_augment_opts augment;
    /* Conversations (common/doc.h; SFT data). `conversations` (preset sft):
     * a JSON Lines record is {"messages": [...]} or {"prompt": P, "response"
     * (or "completion"): R} with an optional "system": S; the filters judge
     * the contents joined by "\n" (the document's text) and the contents are
     * kept as given (no cleaning: chat data holds code and markup).
     * Rejects: messages_not_array, bad_message, bad_role, no_assistant,
     * missing_prompt, missing_response. `chat_user` (the `chat:` section)
     * turns every kept document into a conversation instead: [system:
     * chat_system] + user: chat_user with each "{text}" replaced by the
     * cleaned text (cut to chat_max_words words when > 0) + assistant:
     * chat_answers[label]; a label without an answer is rejected as
     * "no_answer". The document's text stays the cleaned text. Conversations
     * are not augmented (augment.h works on the text, not on the messages). */
    bool conversations;
    const char *chat_system, *chat_user;
    const char *chat_answers[RF_INGEST_MAX_ANSWERS];
    size_t n_chat_answers;
    int64_t chat_max_words;
    char *owned[2]; /* split copies of comma-separated text_fields / columns */
} rf_ingest_opts;

/* Keys allowed in an `ingest:` section (NULL-terminated), for rf_cfg_check_keys. */
extern const char *const rf_ingest_keys[];

void rf_ingest_opts_default(rf_ingest_opts *o);
/* Applies the section's preset (preset.h) then every other key over it. Strings
 * point into the tree, which must outlive *o; text_fields and columns may be
 * lists or comma-separated strings. Errors name the offending key. */
int rf_ingest_opts_from_cfg(const rf_cfg *section, rf_ingest_opts *o);
/* Frees what from_cfg allocated (the split name lists). */
void rf_ingest_opts_free(rf_ingest_opts *o);
const char *rf_ingest_format_name(rf_ingest_format f);

/* A record refused, as handed to rf_ingest_sink.batch (valid during the call). */
typedef struct rf_ingest_reject {
    const char *source; /* the input path as given */
    uint64_t line, offset;
    const char *reason;  /* as in the reject JSON lines */
    const char *excerpt; /* first bytes of the record (at most 80) */
    size_t excerpt_len;
} rf_ingest_reject;

/* One internal batch. seq counts every batch from 0 in input order and only
 * depends on the inputs and batch_docs (not on threads), so the same files
 * give the same numbering on every run: a loader can record how far it got
 * and resume there (rf_ingest_sink.first_batch). */
typedef struct rf_ingest_batch {
    uint64_t seq;
    size_t records; /* records read into the batch: kept + rejects */
    int64_t kept;
    rf_doc_batch *docs; /* kept documents and augmented copies in order, NULL when
                         * none; owned by the callback (also when it fails) */
    const rf_ingest_reject *rejects;
    size_t n_rejects;
} rf_ingest_batch;

typedef int (*rf_ingest_batch_fn)(void *ctx, rf_ingest_batch *b);

/* Where results go. Any may be NULL: docs and rejects are JSON Lines streams;
 * emit receives the kept documents as batches, in order, and owns them.
 * batch (exclusive with emit) is called for every batch in seq order, also
 * those without kept documents; a non-zero return stops the run with it.
 * Batches with seq < first_batch are read and split into records (so that
 * the numbering holds) but neither processed, written nor handed on; their
 * records are counted as ingest.records_skipped, not as records_in. */
typedef struct rf_ingest_sink {
    FILE *docs;
    FILE *rejects;
    rf_emit_fn emit;
    void *emit_ctx;
    rf_ingest_batch_fn batch;
    void *batch_ctx;
    uint64_t first_batch;
} rf_ingest_sink;

/* Ingests inputs[0..n) in order. Counters go to stats under "ingest.", with
 * reals ingest.seconds, ingest.docs_per_s, ingest.mb_per_s (decompressed input
 * MB = 1e6 bytes) and ingest.peak_rss_kb. cancel (may be NULL) stops early with
 * RF_ERR_CANCELED. Returns 0 or a negative rf_err (unreadable or corrupt input,
 * write failure, out of memory) with rf_errmsg() set. */
int rf_ingest_run(const rf_ingest_opts *o, const char *const *inputs, size_t n,
                  const rf_ingest_sink *sink, rf_stats *stats, volatile int *cancel);

#endif
