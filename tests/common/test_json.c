#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/json.h"

static const rf_json *parse(rf_json_doc *d, const char *s) {
    const rf_json *root = NULL;
    int rc = rf_json_parse(d, s, strlen(s), &root);
    return rc ? NULL : root;
}

static void test_objects_and_arrays(void **state) {
    rf_json_doc *d = rf_json_doc_new();
    const rf_json *r = parse(d, " {\"a\": [1, 2.5, -3e2], \"b\": {\"c\": null}, \"t\": true} ");
    assert_non_null(r);
    assert_int_equal(r->type, RF_JSON_OBJECT);
    assert_int_equal(r->len, 3);
    const rf_json *a = rf_json_get(r, "a");
    assert_int_equal(a->type, RF_JSON_ARRAY);
    assert_int_equal(a->len, 3);
    assert_true(a->u.items[1].num == 2.5);
    assert_true(a->u.items[2].num == -300.0);
    int64_t x;
    assert_int_equal(rf_json_int64(&a->u.items[0], &x), 0);
    assert_int_equal(x, 1);
    assert_int_not_equal(rf_json_int64(&a->u.items[1], &x), 0);
    assert_int_equal(rf_json_get(rf_json_get(r, "b"), "c")->type, RF_JSON_NULL);
    assert_int_equal(rf_json_get(r, "t")->type, RF_JSON_TRUE);
    assert_null(rf_json_get(r, "missing"));
    rf_json_doc_free(d);
}

static void test_string_escapes(void **state) {
    rf_json_doc *d = rf_json_doc_new();
    const rf_json *r = parse(d, "\"a\\n\\t\\\"\\\\\\/\\u00e9\\ud83d\\ude00\\ud800x\"");
    assert_non_null(r);
    /* a \n \t " \ / é 😀 U+FFFD x */
    const char want[] = "a\n\t\"\\/\xc3\xa9\xf0\x9f\x98\x80\xef\xbf\xbdx";
    assert_int_equal(r->len, sizeof want - 1);
    assert_memory_equal(r->u.str, want, sizeof want - 1);
    /* \u0000 is kept, length says so. */
    r = parse(d, "\"a\\u0000b\"");
    assert_int_equal(r->len, 3);
    assert_int_equal(r->u.str[1], 0);
    /* Invalid UTF-8 bytes pass through for the caller to judge. */
    r = parse(d, "\"\xff\xfe\"");
    assert_non_null(r);
    assert_int_equal(r->len, 2);
    rf_json_doc_free(d);
}

static void test_rejects_malformed(void **state) {
    static const char *bad[] = {
        "",    "{",     "[1,]",       "{\"a\" 1}", "\"abc",    "01",  "1.",        "-",
        "tru", "[1 2]", "{\"a\":1,}", "\"\\x\"",   "\"a\nb\"", "1 2", "\"\\u12\"", "{1:2}"};
    rf_json_doc *d = rf_json_doc_new();
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const rf_json *r;
        int rc = rf_json_parse(d, bad[i], strlen(bad[i]), &r);
        if (rc != RF_ERR_PARSE) fail_msg("accepted malformed JSON: '%s'", bad[i]);
        assert_non_null(strstr(rf_errmsg(), "at byte"));
    }
    rf_json_doc_free(d);
}

static void test_depth_limit(void **state) {
    char deep[2 * RF_JSON_MAX_DEPTH + 10];
    size_t n = RF_JSON_MAX_DEPTH + 5;
    memset(deep, '[', n);
    memset(deep + n, ']', n);
    rf_json_doc *d = rf_json_doc_new();
    const rf_json *r;
    assert_int_equal(rf_json_parse(d, deep, 2 * n, &r), RF_ERR_PARSE);
    /* Just inside the limit parses. */
    n = RF_JSON_MAX_DEPTH;
    memset(deep, '[', n);
    memset(deep + n, ']', n);
    assert_int_equal(rf_json_parse(d, deep, 2 * n, &r), RF_OK);
    rf_json_doc_free(d);
}

static void test_int64_bounds(void **state) {
    rf_json_doc *d = rf_json_doc_new();
    int64_t x;
    assert_int_equal(rf_json_int64(parse(d, "9223372036854775807"), &x), 0);
    assert_true(x == INT64_MAX);
    assert_int_equal(rf_json_int64(parse(d, "-9223372036854775808"), &x), 0);
    assert_true(x == INT64_MIN);
    assert_int_equal(rf_json_int64(parse(d, "9223372036854775808"), &x), RF_ERR_RANGE);
    assert_int_equal(rf_json_int64(parse(d, "1e3"), &x), RF_ERR_RANGE);
    rf_json_doc_free(d);
}

static void test_reuse_many_parses(void **state) {
    rf_json_doc *d = rf_json_doc_new();
    char line[128];
    for (int i = 0; i < 10000; i++) {
        int n = snprintf(line, sizeof line, "{\"id\":%d,\"text\":\"doc %d\",\"xs\":[%d,%d]}", i, i,
                         i, i + 1);
        const rf_json *r;
        assert_int_equal(rf_json_parse(d, line, (size_t)n, &r), 0);
        int64_t v;
        assert_int_equal(rf_json_int64(rf_json_get(r, "id"), &v), 0);
        assert_int_equal(v, i);
    }
    rf_json_doc_free(d);
}

/* A special byte at every position of a long string, so the 16-byte scan sees
 * it in every lane and in the tail. */
static void test_special_byte_at_every_position(void **state) {
    rf_json_doc *d = rf_json_doc_new();
    char text[80], want[80];
    for (int pos = 0; pos < 40; pos++) {
        for (int kind = 0; kind < 3; kind++) {
            size_t n = 0, w = 0;
            text[n++] = '"';
            for (int i = 0; i < 40; i++) {
                if (i == pos && kind == 0) { /* escaped quote */
                    text[n++] = '\\';
                    text[n++] = '"';
                    want[w++] = '"';
                } else if (i == pos && kind == 1) { /* escaped backslash */
                    text[n++] = '\\';
                    text[n++] = '\\';
                    want[w++] = '\\';
                } else if (i == pos && kind == 2) { /* high byte, passed through */
                    text[n++] = (char)0xC3;
                    text[n++] = (char)0xA9;
                    want[w++] = (char)0xC3;
                    want[w++] = (char)0xA9;
                } else {
                    text[n++] = (char)('a' + i % 26);
                    want[w++] = (char)('a' + i % 26);
                }
            }
            text[n++] = '"';
            const rf_json *r;
            assert_int_equal(rf_json_parse(d, text, n, &r), 0);
            assert_int_equal(r->len, w);
            assert_memory_equal(r->u.str, want, w);
            /* A raw control byte at the same place is refused. */
            text[1 + pos] = '\n';
            assert_int_equal(rf_json_parse(d, text, n, &r), RF_ERR_PARSE);
        }
    }
    rf_json_doc_free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_objects_and_arrays),
        cmocka_unit_test(test_string_escapes),
        cmocka_unit_test(test_rejects_malformed),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_int64_bounds),
        cmocka_unit_test(test_reuse_many_parses),
        cmocka_unit_test(test_special_byte_at_every_position),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
