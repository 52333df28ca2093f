/* Labelled token sequences in memory, and padded batches drawn from them.
 * Sources: token shards of the tokenizer stage (tokenizer/shard.h), JSON Lines
 * documents ({"text":...,"label":N}, common/doc.h) or GLUE-style TSV, the last
 * two tokenized here with the model folder's tokenizer. Sequences longer than max_len are truncated
 * (keeping the final token, [SEP], when the sequence came from a shard). */
#ifndef RF_TR_DATASET_H
#define RF_TR_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "common/stats.h"

typedef struct rf_dataset {
    size_t n;         /* sequences */
    uint32_t *tokens; /* all ids, concatenated */
    size_t *start;    /* [n] offset into tokens */
    uint32_t *len;    /* [n] */
    int32_t *label;   /* [n], -1 = none */
    size_t ntokens, cap_tokens, cap;
    size_t skipped; /* records dropped (no label, empty, bad JSON), counted */
    /* Causal-LM rows (lm_data.h): one RF_LM_* flag byte per token, parallel to
     * tokens; NULL for classifier data. */
    uint8_t *tflags;
} rf_dataset;

void rf_dataset_free(rf_dataset *d); /* frees the contents, zeroes d */
int rf_dataset_add(rf_dataset *d, const uint32_t *ids, size_t len, int32_t label);
/* Appends a causal-LM row with its per-token flags (lm_data.h); label -1. A
 * dataset holds either kind of sequence, not both. */
int rf_dataset_add_row(rf_dataset *d, const uint32_t *ids, const uint8_t *flags, size_t len);

/* Tokenizes a JSONL file of documents with the tokenizer of model_dir
 * (tokenizer.json or vocab.txt), adding [CLS]/[SEP] and truncating to max_len.
 * Records without a label or with invalid JSON are skipped and counted in
 * d->skipped (and in stats "<prefix>.skipped.*" when stats is given). */
int rf_dataset_load_jsonl(rf_dataset *d, const char *path, const char *model_dir, int max_len,
                          rf_stats *stats, const char *prefix);
/* Tokenizes a TSV file with a header row naming a 'sentence' (or 'text') and a
 * 'label' column (the GLUE layout, e.g. SST-2's dev.tsv). Rows without an
 * integer label are skipped and counted. */
int rf_dataset_load_tsv(rf_dataset *d, const char *path, const char *model_dir, int max_len,
                        rf_stats *stats, const char *prefix);
/* Appends every sequence of the shard PREFIX(.bin/.idx). */
int rf_dataset_load_shard(rf_dataset *d, const char *prefix, int max_len);
/* Appends every shard (*.idx) of a directory, in name order. */
int rf_dataset_load_shard_dir(rf_dataset *d, const char *dir, int max_len);
/* Loads path as a shard prefix when PREFIX.idx exists, as TSV when it ends in
 * .tsv, else as JSONL; path may also be a directory, whose *.idx shards are
 * loaded in name order. */
int rf_dataset_load(rf_dataset *d, const char *path, const char *model_dir, int max_len,
                    rf_stats *stats, const char *prefix);

/* A padded batch owned by the caller (reused across calls). */
typedef struct rf_batch_buf {
    int B, T;
    int32_t *ids, *types, *labels;
    uint8_t *valid;
    size_t cap;
    int32_t *pos, *seg; /* causal-LM rows: per-row positions and document ids */
} rf_batch_buf;

/* Fills bb with sequences idx[0..B): padded to the longest (pad id 0, type 0,
 * valid 0), labels copied. Causal-LM rows (d->tflags) get per-token labels
 * instead ([B*T]: the id where RF_LM_TARGET and not RF_LM_DOC_START, else
 * -100), positions restarting and segment ids counting at each document
 * start (lm_data.h). */
int rf_batch_collate(rf_batch_buf *bb, const rf_dataset *d, const size_t *idx, int B);
void rf_batch_buf_free(rf_batch_buf *bb);

/* Largest label + 1 (0 if no labels). */
int rf_dataset_num_labels(const rf_dataset *d);

#endif
