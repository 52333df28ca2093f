/* Fast non-cryptographic hashing (XXH3). Stable across runs and machines, so
 * hashes may be persisted (dedup index, train/eval split). */
#ifndef RF_HASH_H
#define RF_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct rf_hash128 {
    uint64_t lo;
    uint64_t hi;
} rf_hash128;

uint64_t rf_hash64(const void *p, size_t n, uint64_t seed);
rf_hash128 rf_hash128_of(const void *p, size_t n, uint64_t seed);
/* 32 lowercase hex digits + NUL. */
void rf_hash128_hex(rf_hash128 h, char out[33]);

/* splitmix64: a cheap, well-mixed integer hash and the step of seeded PRNGs. */
static inline uint64_t rf_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#endif
