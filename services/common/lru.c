/* The least-recently-used cache of lru.h: a small array scanned under one
 * lock (caps are a handful of models; a scan is cheaper than a hash). */
#include "common/lru.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

struct rf_lru {
    pthread_mutex_t lock;
    int cap;
    rf_lru_entry **slots; /* [cap], NULL when free */
    rf_lru_free_fn free_fn;
    uint64_t tick;
    int64_t loads;
};

int rf_lru_new(int cap, rf_lru_free_fn free_fn, rf_lru **out) {
    if (cap < 1) return rf_fail(RF_ERR_INVALID, "cache: capacity %d", cap);
    rf_lru *c = calloc(1, sizeof *c);
    if (!c || !(c->slots = calloc((size_t)cap, sizeof *c->slots))) {
        free(c);
        return RF_ERR_NOMEM;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->cap = cap;
    c->free_fn = free_fn;
    *out = c;
    return RF_OK;
}

/* Called with the lock held (or by the last owner). */
static void unref(rf_lru *c, rf_lru_entry *e) {
    if (--e->refs) return;
    free(e->key);
    e->key = NULL;
    c->free_fn(e);
}

void rf_lru_free(rf_lru *c) {
    if (!c) return;
    for (int i = 0; i < c->cap; i++)
        if (c->slots[i]) unref(c, c->slots[i]);
    pthread_mutex_destroy(&c->lock);
    free(c->slots);
    free(c);
}

int rf_lru_get(rf_lru *c, const char *key, rf_lru_load_fn load, void *arg, rf_lru_entry **out) {
    *out = NULL;
    pthread_mutex_lock(&c->lock);
    int rc = RF_OK, slot = 0;
    rf_lru_entry *e = NULL;
    for (int i = 0; i < c->cap && !e; i++)
        if (c->slots[i] && !strcmp(c->slots[i]->key, key)) e = c->slots[i];
    if (!e) {
        char *k = strdup(key);
        if (!k) rc = RF_ERR_NOMEM;
        if (!rc && (rc = load(arg, &e))) e = NULL;
        if (rc) {
            free(k);
        } else {
            e->key = k;
            e->refs = 1; /* the cache's own reference */
            c->loads++;
            for (int i = 0; i < c->cap; i++) {
                if (!c->slots[i]) {
                    slot = i;
                    break;
                }
                if (c->slots[i]->used < c->slots[slot]->used) slot = i;
            }
            if (c->slots[slot]) unref(c, c->slots[slot]);
            c->slots[slot] = e;
        }
    }
    if (e) {
        e->refs++;
        e->used = ++c->tick;
        *out = e;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void rf_lru_release(rf_lru *c, rf_lru_entry *e) {
    if (!e) return;
    pthread_mutex_lock(&c->lock);
    unref(c, e);
    pthread_mutex_unlock(&c->lock);
}

int64_t rf_lru_loads(rf_lru *c) {
    pthread_mutex_lock(&c->lock);
    int64_t n = c->loads;
    pthread_mutex_unlock(&c->lock);
    return n;
}
