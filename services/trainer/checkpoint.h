/* Training checkpoints: the full state needed to continue bitwise-identically —
 * parameters, both AdamW moments, the optimizer step, the data position
 * (epoch, index within the epoch's order) and the dropout RNG. One file,
 * written atomically (temporary file, fsync, rename) and ending with an
 * xxh3-64 checksum of everything before it.
 *
 * Layout (little-endian): magic "RFCKPT01", u64 nparams, u64 step, u64 epoch,
 * u64 pos, u64 rng[4], u64 micro (micro-batches done), f32 params[nparams],
 * f32 m[nparams], f32 v[nparams], u64 xxh3. */
#ifndef RF_TR_CHECKPOINT_H
#define RF_TR_CHECKPOINT_H

#include <stdint.h>

#include "common/rng.h"
#include "trainer/model.h"

typedef struct rf_train_state {
    uint64_t step;  /* optimizer steps done */
    uint64_t epoch; /* current epoch */
    uint64_t pos;   /* sequences of this epoch already consumed */
    uint64_t micro; /* micro-batches done in total */
    rf_rng rng;     /* dropout seeds are drawn from it */
} rf_train_state;

int rf_checkpoint_save(const char *path, const rf_bert *m, const rf_train_state *s);
/* Restores params, moments and state into m (which must have the same
 * parameter count and training enabled). Corrupt, truncated or mismatched
 * files give RF_ERR_CORRUPT/RF_ERR_INVALID. */
int rf_checkpoint_load(const char *path, rf_bert *m, rf_train_state *s);

#endif
