#include "dedup/table.h"

#include <stdlib.h>

#include "common/error.h"

#define MIN_CAP 1024

void rf_band_table_free(rf_band_table *t) {
    free(t->keys);
    free(t->vals);
    *t = (rf_band_table){0};
}

uint32_t rf_band_table_get(const rf_band_table *t, uint64_t key) {
    if (!t->cap) return RF_TABLE_MISSING;
    size_t mask = t->cap - 1;
    for (size_t i = rf_mix64(key) & mask;; i = (i + 1) & mask) {
        if (t->keys[i] == key) return t->vals[i];
        if (!t->keys[i]) return RF_TABLE_MISSING;
    }
}

static void band_insert(uint64_t *keys, uint32_t *vals, size_t cap, uint64_t key, uint32_t val) {
    size_t mask = cap - 1, i = rf_mix64(key) & mask;
    while (keys[i])
        i = (i + 1) & mask;
    keys[i] = key;
    vals[i] = val;
}

static int band_grow(rf_band_table *t) {
    size_t cap = t->cap ? t->cap * 2 : MIN_CAP;
    uint64_t *keys = calloc(cap, sizeof *keys);
    uint32_t *vals = malloc(cap * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return RF_ERR_NOMEM;
    }
    for (size_t i = 0; i < t->cap; i++)
        if (t->keys[i]) band_insert(keys, vals, cap, t->keys[i], t->vals[i]);
    free(t->keys);
    free(t->vals);
    t->keys = keys;
    t->vals = vals;
    t->cap = cap;
    return RF_OK;
}

int rf_band_table_put_new(rf_band_table *t, uint64_t key, uint32_t val) {
    if (!key) return rf_fail(RF_ERR_INTERNAL, "band key 0 is reserved");
    if (rf_band_table_get(t, key) != RF_TABLE_MISSING) return RF_OK;
    if ((t->n + 1) * 4 > t->cap * 3) {
        int rc = band_grow(t);
        if (rc) return rc;
    }
    band_insert(t->keys, t->vals, t->cap, key, val);
    t->n++;
    return RF_OK;
}

size_t rf_band_table_bytes(const rf_band_table *t) {
    return t->cap * (sizeof *t->keys + sizeof *t->vals);
}

static rf_hash128 exact_key(rf_hash128 k) {
    if (!k.lo && !k.hi) k.lo = 1;
    return k;
}

static int is_empty(rf_hash128 k) {
    return !k.lo && !k.hi;
}

void rf_exact_table_free(rf_exact_table *t) {
    free(t->keys);
    free(t->vals);
    *t = (rf_exact_table){0};
}

uint32_t rf_exact_table_get(const rf_exact_table *t, rf_hash128 key) {
    if (!t->cap) return RF_TABLE_MISSING;
    key = exact_key(key);
    size_t mask = t->cap - 1;
    for (size_t i = key.lo & mask;; i = (i + 1) & mask) {
        if (t->keys[i].lo == key.lo && t->keys[i].hi == key.hi) return t->vals[i];
        if (is_empty(t->keys[i])) return RF_TABLE_MISSING;
    }
}

static void exact_insert(rf_hash128 *keys, uint32_t *vals, size_t cap, rf_hash128 key,
                         uint32_t val) {
    size_t mask = cap - 1, i = key.lo & mask;
    while (!is_empty(keys[i]))
        i = (i + 1) & mask;
    keys[i] = key;
    vals[i] = val;
}

int rf_exact_table_put_new(rf_exact_table *t, rf_hash128 key, uint32_t val) {
    key = exact_key(key);
    if (rf_exact_table_get(t, key) != RF_TABLE_MISSING) return RF_OK;
    if ((t->n + 1) * 4 > t->cap * 3) {
        size_t cap = t->cap ? t->cap * 2 : MIN_CAP;
        rf_hash128 *keys = calloc(cap, sizeof *keys);
        uint32_t *vals = malloc(cap * sizeof *vals);
        if (!keys || !vals) {
            free(keys);
            free(vals);
            return RF_ERR_NOMEM;
        }
        for (size_t i = 0; i < t->cap; i++)
            if (!is_empty(t->keys[i])) exact_insert(keys, vals, cap, t->keys[i], t->vals[i]);
        free(t->keys);
        free(t->vals);
        t->keys = keys;
        t->vals = vals;
        t->cap = cap;
    }
    exact_insert(t->keys, t->vals, t->cap, key, val);
    t->n++;
    return RF_OK;
}

size_t rf_exact_table_bytes(const rf_exact_table *t) {
    return t->cap * (sizeof *t->keys + sizeof *t->vals);
}
