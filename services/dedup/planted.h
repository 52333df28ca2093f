/* The planted near-duplicate benchmark: real documents are copied with edits
 * at controlled rates (adjacent word swaps, insertions, deletions, typos,
 * truncation, and a mix), the originals and copies are shuffled into one
 * stream and deduplicated, and the decisions are scored against the exact
 * Jaccard of the shingle sets:
 *   - pairs scored: every (copy, its original), and every pair of originals
 *     that share at least one shingle (real corpora have near duplicates of
 *     their own);
 *   - truth: Jaccard >= threshold; prediction: both ended in the same cluster
 *     (the cluster id at decision time, as emitted);
 * and per document: a document should be removed when an earlier one of its
 * family (original and copies) or an earlier original sharing a shingle has
 * Jaccard >= threshold with it.
 * It also measures the LSH S-curve: for the same pairs plus random pairs of
 * originals, how often two signatures share a band, per Jaccard bin, against
 * the theoretical 1-(1-s^r)^b averaged over the pairs in the bin. */
#ifndef RF_DEDUP_PLANTED_H
#define RF_DEDUP_PLANTED_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "dedup/dedup.h"

#define RF_PLANTED_OPS  6
#define RF_PLANTED_BINS 10

typedef struct rf_planted_opts {
    size_t max_base;     /* originals used (after the length filter) */
    int variants;        /* edited copies per original */
    int min_words;       /* originals shorter than this are skipped */
    double max_rate;     /* edit rates are uniform in [0, max_rate] (truncation: 2x) */
    size_t random_pairs; /* extra random pairs of originals for the S-curve */
    uint64_t seed;
    int batch;
} rf_planted_opts;

typedef struct rf_planted_bin {
    size_t pairs, collided;
    double expected; /* mean theoretical collision probability of the bin's pairs */
} rf_planted_bin;

typedef struct rf_planted_report {
    size_t base, variants, docs;
    size_t tp, fp, fn, tn;
    size_t op_pos[RF_PLANTED_OPS], op_found[RF_PLANTED_OPS]; /* per edit kind, positives */
    double precision, recall, f1;
    /* Per document: should it have been removed (an earlier document of its
     * family, or an earlier original sharing a shingle, has Jaccard >= threshold)
     * and was it? */
    size_t doc_tp, doc_fp, doc_fn;
    double doc_precision, doc_recall, doc_f1;
    double seconds; /* dedup of the stream alone */
    rf_planted_bin bins[RF_PLANTED_BINS];
    double max_bin_excess; /* max over bins of |measured-expected| - allowed */
} rf_planted_report;

void rf_planted_opts_default(rf_planted_opts *po);

/* Runs the benchmark on texts[0..n) (originals; exact repeats are skipped)
 * with an index in index_dir, which must be new. */
int rf_planted_run(const rf_dedup_opts *o, const rf_planted_opts *po, char *const *texts, size_t n,
                   const char *index_dir, rf_planted_report *rep);

/* The report as JSON (one object, no newline). */
int rf_planted_json(const rf_planted_report *rep, const rf_dedup_opts *o, rf_buf *out);

#endif
