/* A small seeded PRNG (xoshiro256**) whose whole state can be saved and restored,
 * for deterministic augmentation, sampling, dropout and data order. */
#ifndef RF_RNG_H
#define RF_RNG_H

#include <stdint.h>

typedef struct rf_rng {
    uint64_t s[4];
} rf_rng;

void rf_rng_seed(rf_rng *r, uint64_t seed);
uint64_t rf_rng_next(rf_rng *r);
/* Uniform in [0, n) without modulo bias; n > 0. */
uint64_t rf_rng_below(rf_rng *r, uint64_t n);
/* Uniform float in [0, 1). */
double rf_rng_double(rf_rng *r);

#endif
