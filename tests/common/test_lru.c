/* common/lru.h: hits and misses, eviction of the least recently used,
 * entries held past their eviction, failed loads not cached, and the key
 * owned by the cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/lru.h"

typedef struct thing {
    int id;
    rf_lru_entry lru;
} thing;

static int freed, next_id;

static thing *of(rf_lru_entry *e) {
    return (thing *)((char *)e - offsetof(thing, lru));
}

static void free_thing(rf_lru_entry *e) {
    assert_null(e->key); /* the cache freed its key first */
    freed++;
    free(of(e));
}

static int load_thing(void *arg, rf_lru_entry **out) {
    if (arg) return rf_fail(RF_ERR_IO, "cannot load %s", (const char *)arg);
    thing *t = calloc(1, sizeof *t);
    if (!t) return RF_ERR_NOMEM;
    t->id = ++next_id;
    *out = &t->lru;
    return RF_OK;
}

static int get(rf_lru *c, const char *key) {
    rf_lru_entry *e;
    assert_int_equal(rf_lru_get(c, key, load_thing, NULL, &e), RF_OK);
    assert_string_equal(e->key, key);
    int id = of(e)->id;
    rf_lru_release(c, e);
    return id;
}

static void test_hits_and_eviction(void **state) {
    (void)state;
    freed = next_id = 0;
    rf_lru *c;
    assert_int_equal(rf_lru_new(2, free_thing, &c), RF_OK);
    int a = get(c, "a"), b = get(c, "b");
    assert_int_not_equal(a, b);
    assert_int_equal(get(c, "a"), a); /* a hit: a is now the most recent */
    assert_int_equal(rf_lru_loads(c), 2);
    int x = get(c, "c"); /* evicts b, the least recently used */
    assert_int_equal(freed, 1);
    assert_int_equal(get(c, "a"), a);
    assert_int_equal(get(c, "c"), x);
    assert_int_not_equal(get(c, "b"), b); /* b was evicted: loaded again */
    assert_int_equal(rf_lru_loads(c), 4);
    rf_lru_free(c);
    assert_int_equal(freed, 4);
}

static void test_held_entry_survives_eviction(void **state) {
    (void)state;
    freed = next_id = 0;
    rf_lru *c;
    assert_int_equal(rf_lru_new(1, free_thing, &c), RF_OK);
    rf_lru_entry *held;
    assert_int_equal(rf_lru_get(c, "a", load_thing, NULL, &held), RF_OK);
    get(c, "b"); /* evicts a, which is still held */
    assert_int_equal(freed, 0);
    assert_int_equal(of(held)->id, 1);
    rf_lru_release(c, held);
    assert_int_equal(freed, 1);
    rf_lru_release(c, NULL);
    rf_lru_free(c);
    assert_int_equal(freed, 2);
}

static void test_failed_load_not_cached(void **state) {
    (void)state;
    freed = next_id = 0;
    rf_lru *c;
    assert_int_equal(rf_lru_new(2, free_thing, &c), RF_OK);
    rf_lru_entry *e = (rf_lru_entry *)1;
    assert_int_equal(rf_lru_get(c, "bad", load_thing, "bad", &e), RF_ERR_IO);
    assert_null(e);
    assert_int_equal(rf_lru_loads(c), 0);
    assert_int_equal(get(c, "bad"), 1); /* the next get loads again */
    rf_lru_free(c);
    assert_int_equal(freed, 1);
    assert_int_equal(rf_lru_new(0, free_thing, &c), RF_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hits_and_eviction),
        cmocka_unit_test(test_held_entry_survives_eviction),
        cmocka_unit_test(test_failed_load_not_cached),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
