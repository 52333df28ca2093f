/* Open-addressing hash maps (linear probing, power-of-two capacity, load <= 3/4)
 * from LSH band keys (64-bit, never 0) and exact-text hashes (128-bit) to the
 * sequence number of the first document that had them. Insert-only, like the
 * index they mirror. */
#ifndef RF_DEDUP_TABLE_H
#define RF_DEDUP_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "common/hash.h"

#define RF_TABLE_MISSING UINT32_MAX

typedef struct rf_band_table {
    uint64_t *keys; /* 0 = empty slot */
    uint32_t *vals;
    size_t cap, n;
} rf_band_table;

typedef struct rf_exact_table {
    rf_hash128 *keys; /* {0,0} = empty slot; a real {0,0} hash is stored as {1,0} */
    uint32_t *vals;
    size_t cap, n;
} rf_exact_table;

void rf_band_table_free(rf_band_table *t);
uint32_t rf_band_table_get(const rf_band_table *t, uint64_t key);
/* Stores key -> val unless key is present. */
int rf_band_table_put_new(rf_band_table *t, uint64_t key, uint32_t val);

void rf_exact_table_free(rf_exact_table *t);
uint32_t rf_exact_table_get(const rf_exact_table *t, rf_hash128 key);
int rf_exact_table_put_new(rf_exact_table *t, rf_hash128 key, uint32_t val);

/* Bytes held by a table (for the memory-per-document report). */
size_t rf_band_table_bytes(const rf_band_table *t);
size_t rf_exact_table_bytes(const rf_exact_table *t);

#endif
