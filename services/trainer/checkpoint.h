/* Training checkpoints: the full state needed to continue bitwise-identically —
 * parameters, both AdamW moments, the optimizer step, the data position
 * (epoch, index within the epoch's order) and the dropout RNG. One file,
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
 * only the moments of [lo, hi) into m->m/m->v (a shard of hi - lo floats). */
int rf_checkpoint_save_blocks(const char *path, const rf_bert *m, const float *mom1,
                              const float *mom2, const rf_train_state *s);
int rf_checkpoint_load_range(const char *path, rf_bert *m, rf_train_state *s, size_t lo, size_t hi);

#endif
