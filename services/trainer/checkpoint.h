/* Training checkpoints: the full state needed to continue bitwise-identically —
 * parameters, both AdamW moments, the optimizer step, the data position
 * (epoch, index within the epoch's order) and the dropout RNG. rf_train
 * writes sharded checkpoints (below, "Sharded checkpoints"); the one-file
 * format described here (RFCKPT02, rf_checkpoint_save/_save_blocks) is still
 * written by those functions and read everywhere a checkpoint is. One file,
 * written atomically (temporary file, fsync, rename) and ending with an
 * xxh3-64 checksum of everything before it.
 *
 * A checkpoint also records what it belongs to (rf_train_ident): resuming it
 * with other training data or other schedule-shaping options would silently
 * continue a different run, so the load refuses it.
 *
 * Layout (little-endian): magic "RFCKPT02", u64 nparams, u64 step, u64 epoch,
 * u64 pos, u64 rng[4], u64 micro (micro-batches done), u64 ident.data,
 * u64 ident.opts, f32 params[nparams], f32 m[nparams], f32 v[nparams],
 * u64 xxh3. */
#ifndef RF_TR_CHECKPOINT_H
#define RF_TR_CHECKPOINT_H

#include <stdint.h>

#include "common/rng.h"
#include "trainer/model.h"
#include "trainer/model_iface.h"

/* xxh3 hashes of the training data (every sequence's tokens and label, in
 * order) and of the options that shape the trajectory (steps, batching,
 * optimizer, schedule, seed, shuffle, dropout); see rf_train. */
typedef struct rf_train_ident {
    uint64_t data, opts;
} rf_train_ident;

typedef struct rf_train_state {
    uint64_t step;  /* optimizer steps done */
    uint64_t epoch; /* current epoch */
    uint64_t pos;   /* sequences of this epoch already consumed */
    uint64_t micro; /* micro-batches done in total */
    rf_rng rng;     /* dropout seeds are drawn from it */
    rf_train_ident ident;
} rf_train_state;

int rf_checkpoint_save(const char *path, const rf_bert *m, const rf_train_state *s);
/* Restores params, moments and state into m (which must have the same
 * parameter count and training enabled). s->ident must hold the identity of
 * the run that resumes: a checkpoint of another data set or other options is
 * refused with RF_ERR_INVALID before anything is restored. Corrupt, truncated
 * or mismatched files give RF_ERR_CORRUPT/RF_ERR_INVALID. */
int rf_checkpoint_load(const char *path, rf_bert *m, rf_train_state *s);

/* Data-parallel ranks (see train.c): the same file, whatever the world size or
 * ZeRO stage. save_blocks writes m's params with full moments given apart
 * (rank 0 gathers them from the shards); load_range restores all params and
 * only the moments of [lo, hi) into m->m/m->v (a shard of hi - lo floats).
 * load_range (and rf_checkpoint_load) also read a sharded checkpoint's
 * manifest (below). */
int rf_checkpoint_save_blocks(const char *path, const rf_bert *m, const float *mom1,
                              const float *mom2, const rf_train_state *s);
int rf_checkpoint_load_range(const char *path, rf_bert *m, rf_train_state *s, size_t lo, size_t hi);

/* ---- Sharded checkpoints ----
 *
 * Every rank writes what it holds, and a checkpoint loads at any world size
 * and ZeRO stage. In <out_dir>:
 *
 *   checkpoint.d/step-NNNNNNNN/shard-RRRRR-of-WWWWW.bin  one per rank
 *   checkpoint.d/step-NNNNNNNN/manifest.bin              rank 0, after all shards
 *   checkpoint.d/step-NNNNNNNN/COMPLETE                  rank 0, after the manifest
 *   checkpoint.bin                                       rank 0, last: a copy of
 *                                                        the newest complete manifest
 *
 * each written atomically (temporary file, fsync, rename). checkpoint.bin is
 * what resume reads, so a group killed while writing step N (some shards, no
 * marker, or no new checkpoint.bin) resumes from the previous complete
 * checkpoint; older step directories are removed once checkpoint.bin names a
 * newer one.
 *
 * Shard file (little-endian): magic "RFSHRD01", u32 rank, u32 world, u64
 * nparams, u64 nentries, then nentries entries of 136 bytes {char name[96],
 * u32 ndim, u32 shape[2], u32 0, u64 tensor offset in the flat block, u64
 * start within the tensor, u64 count}: each a piece of one tensor with its
 * global shape and where the piece lies; then per entry f32 params[count],
 * m[count], v[count]; then the xxh3-64 of everything before.
 *
 * Manifest: magic "RFCKPT03", u64 nparams, step, epoch, pos, rng[4], micro,
 * ident.data, ident.opts (as in RFCKPT02), u64 world, zero, nshards, char
 * dir[32] (the step directory), then per shard u64 size and u64 xxh3 (its
 * trailing checksum), then the xxh3-64 of everything before. */

/* A range [lo, hi) of the flat block that a rank holds, with pointers (host
 * memory) to element lo of its params and moments; NULL: that block is not
 * written (save) or not wanted (load). */
typedef struct rf_ckpt_piece {
    size_t lo, hi;
    float *p, *m1, *m2;
} rf_ckpt_piece;

/* Writes this rank's shard of the checkpoint of step s->step under out_dir
 * (the step directory is created); *size and *hash describe it for the
 * manifest. Pieces must not overlap (neither here nor across ranks). */
int rf_checkpoint_write_shard(const char *out_dir, const rf_bert *m, const rf_train_state *s,
                              int rank, int world, const rf_ckpt_piece *pc, size_t npc,
                              uint64_t *size, uint64_t *hash);
/* Rank 0, once every rank's shard is written (sizes[w], hashes[w]): the
 * manifest, the COMPLETE marker, checkpoint.bin, then removes the other step
 * directories. */
int rf_checkpoint_commit(const char *out_dir, const rf_bert *m, const rf_train_state *s, int world,
                         int zero, const uint64_t *sizes, const uint64_t *hashes);
/* Loads checkpoint path (a manifest, RFCKPT03) into the wanted pieces: each
 * element of each non-NULL block must be found in some shard, or the load
 * fails (RF_ERR_CORRUPT). The manifest's checksum and s->ident (as in
 * rf_checkpoint_load) are checked before anything is written to the pieces;
 * a damaged or missing shard found later fails the load with the pieces
 * partly overwritten. A legacy single file (RFCKPT02) is read the same way. */
int rf_checkpoint_load_pieces(const char *path, size_t nparams, rf_train_state *s,
                              const rf_ckpt_piece *pc, size_t npc);

/* The same for any model's blocks (model_iface.h); the rf_bert functions
 * above are these on an rf_bert's. */
int rf_ckpt_load_range(const char *path, const rf_model_blocks *m, rf_train_state *s, size_t lo,
                       size_t hi);
int rf_ckpt_write_shard(const char *out_dir, const rf_model_blocks *m, const rf_train_state *s,
                        int rank, int world, const rf_ckpt_piece *pc, size_t npc, uint64_t *size,
                        uint64_t *hash);
int rf_ckpt_commit(const char *out_dir, size_t nparams, const rf_train_state *s, int world,
                   int zero, const uint64_t *sizes, const uint64_t *hashes);

#endif
