/* Batching for training: length-balanced data-parallel partitions, length-
 * bucketed batches with little padding, causal-LM packing, and the
 * deterministic train/eval split. All functions are pure and deterministic
 * (same input and seed -> same output on every machine). */
#ifndef RF_TOKENIZER_BATCH_H
#define RF_TOKENIZER_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- length-balanced partitioning ---- */
typedef struct rf_partition_report {
    uint64_t max_tokens, min_tokens;
    double mean_tokens;
    double imbalance; /* max / mean, 1.0 is perfect */
} rf_partition_report;

/* Assigns sequence i (lens[i] tokens) to partition assign[i] in [0, parts) so
 * that token totals are balanced: longest first, each onto the currently
 * lightest partition (LPT; ties to the lowest partition number). The result is
 * within 4/3 of the optimum and, for many short sequences, close to 1.0. */
int rf_partition_balanced(const uint32_t *lens, size_t n, int parts, uint32_t *assign,
                          rf_partition_report *rep);

/* ---- length-bucketed batching ---- */
typedef struct rf_batch_plan {
    size_t *order;       /* sequence indices, batch after batch */
    size_t *batch_start; /* batch b is order[batch_start[b] .. batch_start[b+1]) */
    size_t n, n_batches;
    uint64_t real_tokens;   /* sum of lengths */
    uint64_t padded_tokens; /* sum over batches of batch size x longest member */
} rf_batch_plan;

/* Batches of up to batch_size sequences of similar length: the indices
 * idx[0..n) (NULL = 0..n-1) sorted by length, cut into consecutive batches,
 * and the batch order shuffled with seed (so training does not see lengths in
 * order). Free with rf_batch_plan_free. */
int rf_batch_by_length(const uint32_t *lens, const size_t *idx, size_t n, size_t batch_size,
                       uint64_t seed, rf_batch_plan *plan);
void rf_batch_plan_free(rf_batch_plan *plan);

/* Padded tokens of the naive schemes, for comparison: every sequence padded to
 * fixed_len (0 = the longest), and batches of batch_size in stream order padded
 * to their longest. */
uint64_t rf_padded_fixed(const uint32_t *lens, size_t n, uint32_t fixed_len);
uint64_t rf_padded_stream_batches(const uint32_t *lens, size_t n, size_t batch_size);

/* (padded - real) / padded, 0 when padded is 0. */
double rf_padding_fraction(uint64_t real, uint64_t padded);

/* ---- causal-LM packing ---- */
/* Concatenates documents, each followed by eos_id, and cuts the stream into
 * blocks of block_len tokens. A document may span blocks. */
typedef int (*rf_block_fn)(void *ctx, const uint32_t *block, uint32_t len);

typedef struct rf_packer {
    uint32_t block_len, eos_id;
    uint32_t *buf; /* block_len tokens */
    uint32_t fill;
    uint64_t blocks, tokens;
} rf_packer;

int rf_packer_init(rf_packer *p, uint32_t block_len, uint32_t eos_id);
void rf_packer_free(rf_packer *p);
/* Appends one document (and its EOS), calling fn for every block filled. */
int rf_packer_add(rf_packer *p, const uint32_t *ids, size_t n, rf_block_fn fn, void *ctx);
/* The partial last block: emitted padded with pad_id when pad is true, else
 * dropped; *left receives the pad tokens added or the tokens dropped. */
int rf_packer_finish(rf_packer *p, bool pad, uint32_t pad_id, rf_block_fn fn, void *ctx,
                     uint32_t *left);

/* Document-boundary attention: seg[i] numbers the document of token i within
 * a packed block (it increments after each eos_id), so a token may attend to
 * position j <= i only when seg[j] == seg[i]. */
void rf_pack_segments(const uint32_t *block, uint32_t len, uint32_t eos_id, uint32_t *seg);

/* ---- train/eval split ---- */
/* True if a document belongs to the eval split: a hash of its dedup cluster id
 * (near-duplicates share it, so they never straddle the split) or, when the
 * cluster is 0 (no dedup ran), of its document id, compared with
 * eval_fraction. seed selects a different split. */
bool rf_split_is_eval(uint64_t cluster, const char *doc_id, size_t id_len, double eval_fraction,
                      uint64_t seed);

#endif
