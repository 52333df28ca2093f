#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <string.h>
#include <cmocka.h>

#include "common/doc.h"
#include "common/queue.h"
#include "common/stats.h"

static void test_stats_nested_json(void **state) {
    rf_stats *s = rf_stats_new();
    rf_stats_add(s, "ingest.rejected.invalid_json", 3);
    rf_stats_add(s, "ingest.kept", 10);
    rf_stats_add(s, "ingest.rejected.too_short", 2);
    rf_stats_add(s, "dedup.kept", 9);
    rf_stats_set_real(s, "ingest.mb_per_s", 1.5);
    rf_stats_add(s, "ingest.kept", 1);
    assert_int_equal(rf_stats_get(s, "ingest.kept"), 11);
    assert_int_equal(rf_stats_sum_prefix(s, "ingest.rejected."), 5);
    rf_buf b = RF_BUF_INIT;
    assert_int_equal(rf_stats_to_json(s, &b), 0);
    assert_string_equal(b.data, "{\"dedup\":{\"kept\":9},\"ingest\":{\"kept\":11,\"mb_per_s\":1.5,"
                                "\"rejected\":{\"invalid_json\":3,\"too_short\":2}}}");
    rf_buf_free(&b);
    rf_stats_free(s);
}

#define PER_THREAD 20000
static void *producer(void *arg) {
    rf_queue *q = arg;
    for (uintptr_t i = 1; i <= PER_THREAD; i++)
        rf_queue_push(q, (void *)i);
    return NULL;
}

static void test_queue_delivers_everything_once(void **state) {
    rf_queue *q = rf_queue_new(4);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, producer, q);
    uint64_t sum = 0, count = 0;
    void *item;
    while (count < 2 * PER_THREAD && rf_queue_pop(q, &item) == 1) {
        sum += (uintptr_t)item;
        count++;
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    rf_queue_close(q);
    assert_int_equal(rf_queue_pop(q, &item), 0);
    assert_int_equal(count, 2 * PER_THREAD);
    assert_int_equal(sum, 2 * ((uint64_t)PER_THREAD * (PER_THREAD + 1) / 2));
    assert_int_not_equal(rf_queue_push(q, (void *)1), 0); /* closed */
    rf_queue_free(q);
}

static void test_doc_json_roundtrip(void **state) {
    rf_doc d = {0};
    d.id = strdup("a:1");
    d.text = strdup("he said \"hi\"\n");
    d.text_len = strlen(d.text);
    d.label = 1;
    d.source = strdup("a.json");
    d.line = 1;
    d.offset = 0;
    d.cluster = 0xdeadbeefcafef00dull;
    rf_buf b = RF_BUF_INIT;
    assert_int_equal(rf_doc_to_json(&d, &b), 0);
    rf_json_doc *jd = rf_json_doc_new();
    const rf_json *root;
    assert_int_equal(rf_json_parse(jd, b.data, b.len, &root), 0);
    rf_doc back;
    assert_int_equal(rf_doc_from_json(root, &back), 0);
    assert_string_equal(back.id, d.id);
    assert_int_equal(back.text_len, d.text_len);
    assert_memory_equal(back.text, d.text, d.text_len);
    assert_int_equal(back.label, 1);
    assert_true(back.cluster == d.cluster);
    rf_doc_clear(&back);
    /* A document without text is refused with a reason. */
    const char bad[] = "{\"id\":\"x\"}";
    assert_int_equal(rf_json_parse(jd, bad, sizeof bad - 1, &root), 0);
    assert_int_not_equal(rf_doc_from_json(root, &back), 0);
    rf_json_doc_free(jd);
    rf_buf_free(&b);
    rf_doc_clear(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_nested_json),
        cmocka_unit_test(test_queue_delivers_everything_once),
        cmocka_unit_test(test_doc_json_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
