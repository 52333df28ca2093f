/* Token shards: memory-mappable files of token sequences for the trainer, in
 * the spirit of Megatron's .bin/.idx pair.
 *
 *   PREFIX.bin  the token ids of every sequence, concatenated, as little-endian
 *               uint32 (no header, so it can be mmapped and indexed directly);
 *   PREFIX.idx  a header followed by one record per sequence.
 *
 * PREFIX.idx layout (all integers little-endian):
 *   offset  size  field
 *   0       8     magic "RFTOKIDX"
 *   8       4     version (1)
 *   12      4     flags (RF_SHARD_PACKED: sequences are fixed causal-LM blocks)
 *   16      8     n_seqs
 *   24      8     n_tokens (= size of PREFIX.bin / 4)
 *   32      4     vocab_size (every id is < vocab_size)
 *   36      4     eos_id (-1 if none)
 *   40      4     pad_id (-1 if none)
 *   44      4     block_len (tokens per sequence when PACKED, else 0)
 *   48      8     xxh3-64 (rf_hash64, seed 0) of the n_seqs records
 *   56      8     reserved (0)
 *   64      24*n  records: u64 start (in tokens), u32 len, i32 label, u64 cluster
 *
 * Records are in write order and contiguous: start[i] = start[i-1] + len[i-1].
 * `label` is the document's class label (RF_LABEL_NONE = -1 when unknown);
 * `cluster` is the dedup cluster id of the document (its id hash when dedup did
 * not assign one), so a reader can keep near-duplicates together.
 *
 * The reader checks everything before handing out a pointer: magic, version,
 * sizes of both files, the record checksum, contiguity, and that every id is
 * below vocab_size (one linear pass at open). A shard that fails any check is
 * rejected with RF_ERR_CORRUPT and a message naming the check. */
#ifndef RF_TOKENIZER_SHARD_H
#define RF_TOKENIZER_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define RF_SHARD_MAGIC      "RFTOKIDX"
#define RF_SHARD_VERSION    1u
#define RF_SHARD_PACKED     1u
#define RF_SHARD_HEADER_LEN 64u
#define RF_SHARD_RECORD_LEN 24u

typedef struct rf_shard_info {
    uint32_t flags;
    uint64_t n_seqs;
    uint64_t n_tokens;
    uint32_t vocab_size;
    int32_t eos_id;
    int32_t pad_id;
    uint32_t block_len;
} rf_shard_info;

/* One sequence as stored. ids points into the mapping: valid until close. */
typedef struct rf_shard_seq {
    const uint32_t *ids;
    uint32_t len;
    int32_t label;
    uint64_t cluster;
} rf_shard_seq;

/* ---- writing ---- */
typedef struct rf_shard_writer rf_shard_writer;

/* Creates PREFIX.bin and PREFIX.idx (written to temporary names, renamed into
 * place by rf_shard_writer_close so a reader never sees a half-written shard).
 * info->n_seqs and info->n_tokens are ignored (counted while writing). */
int rf_shard_writer_open(const char *prefix, const rf_shard_info *info, rf_shard_writer **out);
/* Appends one sequence. RF_ERR_RANGE if an id is >= vocab_size, or if the shard
 * is PACKED and len != block_len. */
int rf_shard_writer_add(rf_shard_writer *w, const uint32_t *ids, uint32_t len, int32_t label,
                        uint64_t cluster);
/* Flushes, fsyncs and renames both files into place, then frees w (also on
 * error, in which case the temporary files are removed). */
int rf_shard_writer_close(rf_shard_writer *w);
/* Drops a shard being written (removes temporary files) and frees w. */
void rf_shard_writer_abort(rf_shard_writer *w);

/* ---- reading ---- */
typedef struct rf_shard rf_shard;

/* Maps PREFIX.bin and PREFIX.idx read-only and validates them (see above). */
int rf_shard_open(const char *prefix, rf_shard **out);
const rf_shard_info *rf_shard_get_info(const rf_shard *s);
/* Sequence i, or RF_ERR_RANGE if i >= n_seqs. */
int rf_shard_get(const rf_shard *s, uint64_t i, rf_shard_seq *out);
void rf_shard_close(rf_shard *s);

#endif
