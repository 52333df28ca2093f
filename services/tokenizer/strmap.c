#include "tokenizer/strmap.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/hash.h"

void rf_strmap_init(rf_strmap *m) {
    memset(m, 0, sizeof *m);
}

void rf_strmap_free(rf_strmap *m) {
    free(m->slots);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static int grow(rf_strmap *m) {
    size_t cap = m->slots ? (m->mask + 1) * 2 : 64;
    rf_strmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return RF_ERR_NOMEM;
    for (size_t i = 0; m->slots && i <= m->mask; i++) {
        if (!m->slots[i].used) continue;
        size_t j = m->slots[i].hash & (cap - 1);
        while (slots[j].used)
            j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->mask = cap - 1;
    return RF_OK;
}

int rf_strmap_put(rf_strmap *m, const char *key, size_t len, uint32_t value) {
    if (len > UINT32_MAX / 2) return rf_fail(RF_ERR_RANGE, "vocabulary entry too long");
    /* keep the load factor under 1/2 so lookups of absent keys stay short */
    if (!m->slots || (m->count + 1) * 2 > m->mask + 1) {
        int rc = grow(m);
        if (rc) return rc;
    }
    uint64_t h = rf_hash64(key, len, 0);
    size_t j = h & m->mask;
    for (; m->slots[j].used; j = (j + 1) & m->mask) {
        const rf_strmap_slot *s = &m->slots[j];
        if (s->hash == h && s->key_len == len && memcmp(m->arena + s->key_off, key, len) == 0) {
            m->slots[j].value = value;
            return RF_OK;
        }
    }
    if (m->arena_len + len + 1 > m->arena_cap) {
        size_t cap = m->arena_cap ? m->arena_cap * 2 : 4096;
        while (cap < m->arena_len + len + 1)
            cap *= 2;
        if (cap > UINT32_MAX) return rf_fail(RF_ERR_RANGE, "vocabulary too large");
        char *a = realloc(m->arena, cap);
        if (!a) return RF_ERR_NOMEM;
        m->arena = a;
        m->arena_cap = cap;
    }
    memcpy(m->arena + m->arena_len, key, len);
    m->arena[m->arena_len + len] = 0;
    m->slots[j] = (rf_strmap_slot){h, (uint32_t)m->arena_len, (uint32_t)len, value, 1};
    m->arena_len += len + 1;
    m->count++;
    return RF_OK;
}

int64_t rf_strmap_get(const rf_strmap *m, const char *key, size_t len) {
    if (!m->slots) return -1;
    uint64_t h = rf_hash64(key, len, 0);
    for (size_t j = h & m->mask; m->slots[j].used; j = (j + 1) & m->mask) {
        const rf_strmap_slot *s = &m->slots[j];
        if (s->hash == h && s->key_len == len && memcmp(m->arena + s->key_off, key, len) == 0)
            return s->value;
    }
    return -1;
}
