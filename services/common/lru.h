/* A cache of loaded things shared by threads (the evaluator's checkpoint and
 * LM caches): the last `cap` keys used stay loaded, the least recently used
 * is evicted on a miss. An entry handed out stays valid until released, even
 * if it is evicted meanwhile; a key that fails to load is not cached. Misses
 * load under the cache's lock, so concurrent misses on one key load once.
 *
 * The cached object embeds an rf_lru_entry; the cache owns its key and calls
 * the free function given to rf_lru_new when the last holder lets go. */
#ifndef RF_COMMON_LRU_H
#define RF_COMMON_LRU_H

#include <stdint.h>

typedef struct rf_lru_entry {
    char *key;     /* owned by the cache */
    int refs;      /* holders, plus one while cached */
    uint64_t used; /* last use, for eviction */
} rf_lru_entry;

/* Loads the object of a missed key; *out is its embedded entry. */
typedef int (*rf_lru_load_fn)(void *arg, rf_lru_entry **out);
/* Frees an object the cache no longer holds (its key is already freed). */
typedef void (*rf_lru_free_fn)(rf_lru_entry *e);

typedef struct rf_lru rf_lru;

int rf_lru_new(int cap, rf_lru_free_fn free_fn, rf_lru **out);
/* Frees the cached entries nobody holds; held ones go when released. */
void rf_lru_free(rf_lru *c);
/* The entry of key, calling load(arg) on a miss; release it when done. */
int rf_lru_get(rf_lru *c, const char *key, rf_lru_load_fn load, void *arg, rf_lru_entry **out);
/* NULL is a no-op. */
void rf_lru_release(rf_lru *c, rf_lru_entry *e);
/* How many misses loaded successfully. */
int64_t rf_lru_loads(rf_lru *c);

#endif
