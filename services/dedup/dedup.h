/* The dedup engine: exact duplicates by a 128-bit hash of the normalized text,
 * near duplicates by MinHash LSH over shingles with optional Jaccard
 * verification, clusters by union-find with the earliest document (in stream
 * order) as representative. Decisions are made one document at a time in
 * stream order, so they never depend on the thread count; threads only compute
 * hashes and signatures.
 *
 * State lives in an index directory (index_log.h) and is rebuilt from it on
 * open: a restarted process on the same index continues from the last
 * committed batch and decides exactly as an uninterrupted run would. Per
 * document the process keeps 16 bytes plus its hash-table slots (one exact
 * key, `bands` band keys); shingle sets and ids stay on disk.
 *
 * Usage: open; for each batch, process() then write its results somewhere and
 * commit() with the output sizes the caller wants restored on restart. After
 * a failed process() or commit() the engine must only be closed: what was not
 * committed is decided again by the next process on the same index. */
#ifndef RF_DEDUP_DEDUP_H
#define RF_DEDUP_DEDUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/doc.h"
#include "common/stats.h"

typedef struct rf_dedup_opts {
    int ngram; /* shingle length in words (or code points with char_mode) */
    bool char_mode;
    int bands, rows;  /* LSH: bands x rows = MinHash permutations */
    unsigned norm;    /* RF_NORM_* flags */
    bool verify;      /* check candidates' Jaccard against threshold */
    double threshold; /* Jaccard for a verified near duplicate */
    int set_cap;      /* shingles kept per document for verification */
    uint64_t seed;
    int threads;
} rf_dedup_opts;

/* Defaults: word 5-grams, 20 bands x 5 rows, all normalizations, verification
 * at Jaccard 0.7 with sets of up to 2048 shingles (README explains why). */
void rf_dedup_opts_default(rf_dedup_opts *o);
int rf_dedup_opts_check(const rf_dedup_opts *o);

typedef enum rf_dd_kind { RF_DD_KEPT = 0, RF_DD_EXACT = 1, RF_DD_NEAR = 2 } rf_dd_kind;
const char *rf_dd_kind_name(rf_dd_kind k);

typedef struct rf_dd_result {
    rf_dd_kind kind;
    uint64_t cluster; /* 64-bit hash of the representative's id */
    char *kept_id;    /* representative's id (malloc'd) for duplicates, else NULL */
    char *matched_id; /* verified near duplicates: the candidate of the best Jaccard */
    float jaccard;    /* that best verified Jaccard */
    bool verified;
    bool replayed; /* decided by an earlier process; read back from the index */
} rf_dd_result;

void rf_dd_results_clear(rf_dd_result *res, size_t n);

/* Appends the duplicates-file line for a duplicate (no '\n'):
 *   {"id":"...","kept_id":"...","kind":"near","jaccard":0.8125,"matched_id":"...","cluster":"..."}
 * jaccard and matched_id only when verified (matched_id is the document the
 * Jaccard was measured against; kept_id is its cluster's representative). */
int rf_dd_dup_json(const rf_doc *doc, const rf_dd_result *res, rf_buf *out);

typedef struct rf_dedup rf_dedup;

int rf_dedup_open(const rf_dedup_opts *o, const char *index_dir, rf_dedup **out);
void rf_dedup_close(rf_dedup *d);

/* Documents decided and committed so far (across restarts). */
uint64_t rf_dedup_committed(const rf_dedup *d);
/* The output sizes recorded by the last commit (0 before any). */
void rf_dedup_out_sizes(const rf_dedup *d, uint64_t *kept_bytes, uint64_t *dups_bytes);

/* Decides docs[0..n), the next n documents of the stream. Documents the index
 * has already committed are replayed: their id must match the stored one
 * (else RF_ERR_INVALID: a different input) and the stored decision is returned. */
int rf_dedup_process(rf_dedup *d, const rf_doc *docs, size_t n, rf_dd_result *res);
/* Documents decided but not yet committed. */
uint64_t rf_dedup_pending(const rf_dedup *d);
/* Makes every decision so far durable, with the caller's output sizes. */
int rf_dedup_commit(rf_dedup *d, uint64_t kept_bytes, uint64_t dups_bytes);

/* Sets counters under prefix (e.g. "dedup."): docs, kept, exact, near,
 * candidate pairs checked and confirmed, cluster merges, cluster-size
 * histogram (cluster_size.1, .2, .3-4, ...), memory and index bytes per doc. */
int rf_dedup_report(const rf_dedup *d, rf_stats *s, const char *prefix);

#endif
