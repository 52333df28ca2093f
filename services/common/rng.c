#include "common/rng.h"

#include "common/hash.h"

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

void rf_rng_seed(rf_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) {
        seed += 0x9e3779b97f4a7c15ull;
        r->s[i] = rf_mix64(seed);
    }
}

uint64_t rf_rng_next(rf_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t rf_rng_below(rf_rng *r, uint64_t n) {
    /* Rejection sampling on the top of the range removes modulo bias. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = rf_rng_next(r);
    while (x >= limit);
    return x % n;
}

double rf_rng_double(rf_rng *r) {
    return (double)(rf_rng_next(r) >> 11) * 0x1.0p-53;
}
