/* MinHash signatures and LSH band keys.
 *
 * Each shingle hash is folded to 32 bits x; permutation i is the
 * multiply-add-shift hash h_i(x) = ((a_i * x + b_i) mod 2^64) >> 32 with random
 * 64-bit a_i, b_i (Dietzfelbinger: strongly universal from 32 to 32 bits). It
 * needs no modulo by a prime, so the inner loop over permutations is plain
 * 32x32->64 multiplies and min, which the compiler vectorizes (AVX2: 4 lanes).
 * The signature has bands*rows 32-bit values; band j's key is the 64-bit hash
 * of its rows, seeded by j so equal rows in different bands do not collide. */
#ifndef RF_DEDUP_MINHASH_H
#define RF_DEDUP_MINHASH_H

#include <stddef.h>
#include <stdint.h>

#define RF_MINHASH_MAX_PERM 1024

typedef struct rf_minhash {
    int bands, rows, nperm;
    uint64_t seed;
    int npad;       /* nperm rounded up to 8 (the AVX2 width) */
    uint32_t *a_lo; /* low and high halves of a_i, split for 32-bit lanes */
    uint32_t *a_hi;
    uint64_t *b;
    uint64_t *b_even, *b_odd; /* b of even and odd lanes, for the AVX2 layout */
} rf_minhash;

int rf_minhash_init(rf_minhash *mh, int bands, int rows, uint64_t seed);
void rf_minhash_free(rf_minhash *mh);

/* The 32-bit fold of a shingle hash: the MinHash input and the verification set element. */
static inline uint32_t rf_minhash_fold(uint64_t h) {
    return (uint32_t)(h ^ (h >> 32));
}

/* sig[0..nperm) = min over shingles of each permutation (UINT32_MAX if n == 0). */
void rf_minhash_sign(const rf_minhash *mh, const uint64_t *shingles, size_t n, uint32_t *sig);
/* The portable loop (the reference the AVX2 path is tested against). */
void rf_minhash_sign_scalar(const rf_minhash *mh, const uint64_t *shingles, size_t n,
                            uint32_t *sig);
/* keys[0..bands) from a signature; never 0 (0 marks an empty table slot). */
void rf_minhash_band_keys(const rf_minhash *mh, const uint32_t *sig, uint64_t *keys);

/* Probability that a pair with Jaccard s shares at least one band: 1-(1-s^r)^b. */
double rf_lsh_prob(double s, int bands, int rows);
/* Jaccard at which rf_lsh_prob crosses 1/2 (the effective LSH threshold). */
double rf_lsh_threshold(int bands, int rows);

#endif
