/* Causal-LM training data (trainer.task: causal_lm): what the trainer reads,
 * and how it packs documents into fixed-length rows.
 *
 * THE DATASET FORMAT (what the tokenizer stage of `refinery run`, an SFT
 * preset or any other producer writes). Any one of:
 *
 *   1. Token shards (tokenizer/shard.h), ONE RECORD PER DOCUMENT: the
 *      document's token ids as the tokenizer gave them (no padding). The
 *      record's label is ignored. A document that does not end with the EOS
 *      id gets one appended here (the tokenizer stage's `append_eos: true`
 *      writes it already, and sets the header's eos_id). The EOS id is the
 *      header's eos_id, or else config.json's eos_token_id of the model.
 *   2. Packed token shards (flag RF_SHARD_PACKED, the tokenizer stage's
 *      `pack: true`): every record is one row of block_len <= max_len tokens,
 *      documents separated by the header's eos_id; used as they are.
 *   3. Either kind with a LOSS MASK beside it, PREFIX.mask: one byte per token
 *      of PREFIX.bin, in the same order (n_tokens bytes, nothing else): 1 = the
 *      token is a target (the loss counts its prediction), 0 = it is not (an
 *      SFT prompt, a system turn). Any other byte, or another size, is
 *      RF_ERR_CORRUPT. Without the file every token is a target. An EOS
 *      appended here is a target when its document's last token is.
 *   4. JSON Lines, one document per line, tokenized with the model folder's
 *      tokenizer WITHOUT special tokens: {"text": "..."} (every token a
 *      target) or {"prompt": "...", "completion": "..."} (the prompt's tokens
 *      are not targets; the two are encoded separately and concatenated, so
 *      no BPE merge crosses the boundary). EOS appended. Other lines are
 *      skipped and counted.
 *   5. Plain text (*.txt, *.raw): one document per non-blank line (a
 *      trailing \r dropped), every token a target, EOS appended.
 *   A directory is read as its *.idx shards in name order (1-3).
 *
 * PACKING. Documents, each ending with EOS, are concatenated in data order
 * and cut into rows of max_len tokens (the last row may be shorter; a long
 * document continues in the next row). Within a row every document is its own
 * segment: attention stays inside it (ops_causal.h's seg, so nothing leaks
 * between documents: trl issue 1230), its positions restart at 0, and its
 * first token is not predicted from the document before (label -100). A
 * document's piece at the start of a row starts at position 0.
 *
 * The rows are an rf_dataset with per-token flags (rf_dataset.tflags):
 * RF_LM_TARGET (the token's own label is its id) and RF_LM_DOC_START (the
 * token opens a document inside the row); rf_batch_collate turns them into
 * Hugging Face's unshifted labels, positions and segment ids. The loss is the
 * mean over the predicted tokens of an optimizer step (every micro-batch and
 * rank of it; train.c). */
#ifndef RF_TR_LM_DATA_H
#define RF_TR_LM_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/stats.h"
#include "trainer/dataset.h"

#define RF_LM_TARGET    1u /* predicted: the label of this token is its id */
#define RF_LM_DOC_START 2u /* opens a document inside a row (not at position 0) */

/* Appends path's documents (any format above) packed into rows of at most
 * max_len tokens to d (empty, or holding rows). eos_id: the model's
 * eos_token_id (-1: none; then every source must name one in its shard header
 * or the load fails). model_dir: the tokenizer for text sources (a GGUF: its own,
 * gguf_tokenizer.h). Skipped records are counted in d->skipped and in stats
 * "<prefix>.skipped.<why>". */
int rf_lm_data_load(rf_dataset *d, const char *path, const char *model_dir, int max_len, int eos_id,
                    rf_stats *stats, const char *prefix);

/* Documents in, rows out (for producers that have documents in memory). */
typedef struct rf_lm_packer rf_lm_packer;
int rf_lm_packer_new(rf_dataset *d, int max_len, int eos_id, rf_lm_packer **out);
/* One document; mask NULL: every token a target. EOS appended unless the last
 * id is eos_id. */
int rf_lm_packer_add(rf_lm_packer *p, const uint32_t *ids, const uint8_t *mask, size_t n);
/* Emits the last, partial row, then frees p. */
int rf_lm_packer_finish(rf_lm_packer *p);
void rf_lm_packer_free(rf_lm_packer *p);

/* The tokens row i of d makes the model predict: t in [1, len) with
 * RF_LM_TARGET and not RF_LM_DOC_START (what the causal loss counts). */
uint32_t rf_lm_row_targets(const rf_dataset *d, size_t i);

#endif
