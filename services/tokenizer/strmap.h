/* A string -> uint32 hash map for vocabularies: open addressing with linear
 * probing, keys copied into one arena owned by the map. Built once, then only
 * read (safe to share between threads). */
#ifndef RF_TOKENIZER_STRMAP_H
#define RF_TOKENIZER_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct rf_strmap_slot {
    uint64_t hash;
    uint32_t key_off; /* into arena */
    uint32_t key_len;
    uint32_t value;
    uint32_t used;
} rf_strmap_slot;

typedef struct rf_strmap {
    rf_strmap_slot *slots;
    size_t mask; /* capacity - 1 (capacity is a power of two) */
    size_t count;
    char *arena;
    size_t arena_len, arena_cap;
} rf_strmap;

void rf_strmap_init(rf_strmap *m);
void rf_strmap_free(rf_strmap *m);
/* Inserts key, or gives an existing key the new value (the last one wins, as
 * in HF's vocabulary maps). */
int rf_strmap_put(rf_strmap *m, const char *key, size_t len, uint32_t value);
/* Value for key, or -1. */
int64_t rf_strmap_get(const rf_strmap *m, const char *key, size_t len);

#endif
