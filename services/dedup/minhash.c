#include "dedup/minhash.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "common/error.h"
#include "common/hash.h"

int rf_minhash_init(rf_minhash *mh, int bands, int rows, uint64_t seed) {
    *mh = (rf_minhash){0};
    if (bands < 1 || rows < 1 || bands * rows > RF_MINHASH_MAX_PERM)
        return rf_fail(RF_ERR_INVALID, "bands %d x rows %d: need >= 1 each and <= %d permutations",
                       bands, rows, RF_MINHASH_MAX_PERM);
    mh->bands = bands;
    mh->rows = rows;
    mh->nperm = bands * rows;
    mh->seed = seed;
    mh->npad = (mh->nperm + 7) / 8 * 8;
    size_t np = (size_t)mh->npad;
    mh->a_lo = malloc(sizeof(uint32_t) * np);
    mh->a_hi = malloc(sizeof(uint32_t) * np);
    mh->b = malloc(sizeof(uint64_t) * np);
    mh->b_even = malloc(sizeof(uint64_t) * np / 2);
    mh->b_odd = malloc(sizeof(uint64_t) * np / 2);
    if (!mh->a_lo || !mh->a_hi || !mh->b || !mh->b_even || !mh->b_odd) {
        rf_minhash_free(mh);
        return RF_ERR_NOMEM;
    }
    uint64_t state = seed;
    for (int i = 0; i < mh->npad; i++) {
        uint64_t a = rf_mix64(state++) | 1;
        mh->a_lo[i] = (uint32_t)a;
        mh->a_hi[i] = (uint32_t)(a >> 32);
        mh->b[i] = rf_mix64(state++);
    }
    /* In a 256-bit vector of 8 permutations, lanes 0,2,4,6 and 1,3,5,7 are
     * multiplied separately (vpmuludq), so their b's are stored apart. */
    for (int i = 0; i < mh->npad; i++)
        (i % 2 ? mh->b_odd : mh->b_even)[i / 8 * 4 + i % 8 / 2] = mh->b[i];
    return RF_OK;
}

void rf_minhash_free(rf_minhash *mh) {
    free(mh->a_lo);
    free(mh->a_hi);
    free(mh->b);
    free(mh->b_even);
    free(mh->b_odd);
    *mh = (rf_minhash){0};
}

/* ((a*x + b) mod 2^64) >> 32 with a = a_hi:a_lo and x < 2^32 equals
 * hi32(a_lo*x + b) + lo32(a_hi*x) mod 2^32: one widening and one 32-bit multiply. */
void rf_minhash_sign_scalar(const rf_minhash *mh, const uint64_t *shingles, size_t n,
                            uint32_t *sig) {
    const int k = mh->nperm;
    const uint32_t *restrict alo = mh->a_lo;
    const uint32_t *restrict ahi = mh->a_hi;
    const uint64_t *restrict b = mh->b;
    uint32_t *restrict out = sig;
    for (int i = 0; i < k; i++)
        out[i] = UINT32_MAX;
    for (size_t j = 0; j < n; j++) {
        const uint32_t x = rf_minhash_fold(shingles[j]);
        for (int i = 0; i < k; i++) {
            uint64_t t = (uint64_t)alo[i] * x + b[i];
            uint32_t v = (uint32_t)(t >> 32) + ahi[i] * x;
            out[i] = v < out[i] ? v : out[i];
        }
    }
}

#ifdef __AVX2__
/* Loop order: for each group of 8 permutations, all shingles. The accumulator
 * and the group's a/b stay in registers; the folded shingles are prepared once
 * per chunk. */
#define FOLD_CHUNK 512
void rf_minhash_sign(const rf_minhash *mh, const uint64_t *shingles, size_t n, uint32_t *sig) {
    const int nv = mh->npad / 8;
    uint32_t tmp[RF_MINHASH_MAX_PERM];
    uint32_t xs[FOLD_CHUNK];
    for (int i = 0; i < mh->npad; i++)
        tmp[i] = UINT32_MAX;
    for (size_t start = 0; start < n; start += FOLD_CHUNK) {
        size_t m = n - start < FOLD_CHUNK ? n - start : FOLD_CHUNK;
        for (size_t j = 0; j < m; j++)
            xs[j] = rf_minhash_fold(shingles[start + j]);
        for (int v = 0; v < nv; v++) {
            const __m256i alo = _mm256_loadu_si256((const __m256i *)(mh->a_lo + 8 * v));
            const __m256i alo_odd = _mm256_srli_epi64(alo, 32);
            const __m256i ahi = _mm256_loadu_si256((const __m256i *)(mh->a_hi + 8 * v));
            const __m256i be = _mm256_loadu_si256((const __m256i *)(mh->b_even + 4 * v));
            const __m256i bo = _mm256_loadu_si256((const __m256i *)(mh->b_odd + 4 * v));
            __m256i acc = _mm256_loadu_si256((const __m256i *)(tmp + 8 * v));
            for (size_t j = 0; j < m; j++) {
                const __m256i x = _mm256_set1_epi32((int)xs[j]);
                __m256i te = _mm256_add_epi64(_mm256_mul_epu32(alo, x), be);
                __m256i to = _mm256_add_epi64(_mm256_mul_epu32(alo_odd, x), bo);
                /* high 32 bits of each 64-bit sum, back in permutation order */
                __m256i hi = _mm256_blend_epi32(_mm256_srli_epi64(te, 32), to, 0xaa);
                __m256i h = _mm256_add_epi32(hi, _mm256_mullo_epi32(ahi, x));
                acc = _mm256_min_epu32(acc, h);
            }
            _mm256_storeu_si256((__m256i *)(tmp + 8 * v), acc);
        }
    }
    memcpy(sig, tmp, sizeof(uint32_t) * (size_t)mh->nperm);
}
#else
void rf_minhash_sign(const rf_minhash *mh, const uint64_t *shingles, size_t n, uint32_t *sig) {
    rf_minhash_sign_scalar(mh, shingles, n, sig);
}
#endif

void rf_minhash_band_keys(const rf_minhash *mh, const uint32_t *sig, uint64_t *keys) {
    for (int j = 0; j < mh->bands; j++) {
        uint64_t h =
            rf_hash64(sig + (size_t)j * (size_t)mh->rows, sizeof(uint32_t) * (size_t)mh->rows,
                      mh->seed ^ (0xba9d000000000000ull + (uint64_t)j));
        keys[j] = h ? h : 1;
    }
}

double rf_lsh_prob(double s, int bands, int rows) {
    return 1.0 - pow(1.0 - pow(s, rows), bands);
}

double rf_lsh_threshold(int bands, int rows) {
    double lo = 0, hi = 1;
    for (int i = 0; i < 60; i++) {
        double mid = (lo + hi) / 2;
        if (rf_lsh_prob(mid, bands, rows) < 0.5)
            lo = mid;
        else
            hi = mid;
    }
    return (lo + hi) / 2;
}
