#include "common/hash.h"

#include <stdio.h>
#include <xxhash.h>

uint64_t rf_hash64(const void *p, size_t n, uint64_t seed) {
    return XXH3_64bits_withSeed(p, n, seed);
}

rf_hash128 rf_hash128_of(const void *p, size_t n, uint64_t seed) {
    XXH128_hash_t h = XXH3_128bits_withSeed(p, n, seed);
    return (rf_hash128){h.low64, h.high64};
}

void rf_hash128_hex(rf_hash128 h, char out[33]) {
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.hi, (unsigned long long)h.lo);
}
