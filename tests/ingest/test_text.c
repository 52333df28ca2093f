/* Plain-text records: blank separators, WikiText headings, paragraphs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "ingest/text.h"

static void test_blank(void **state) {
    assert_true(rf_text_blank("", 0));
    assert_true(rf_text_blank(" \r", 2)); /* WikiText's empty lines */
    assert_true(rf_text_blank("\t \f\v", 4));
    assert_false(rf_text_blank(" x ", 3));
    assert_false(rf_text_blank("\xc2\xa0", 2)); /* NBSP is text here; clean decides */
}

static void test_wikitext_heading(void **state) {
    const char *yes[] = {" = Robert Boulter = \r",
                         " = = Career = = ", "= = = 2000 – 2005 = = =", "= x ="};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        assert_true(rf_text_wikitext_heading(yes[i], strlen(yes[i])));
    const char *no[] = {" The = sign = ", "==", "= x", " x = y = ", "=x=", ""};
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        assert_false(rf_text_wikitext_heading(no[i], strlen(no[i])));
}

static void test_paragraph(void **state) {
    rf_paragraph p;
    rf_paragraph_init(&p, 0);
    assert_int_equal(rf_paragraph_add(&p, "first", 5, 3, 40), 0);
    assert_int_equal(rf_paragraph_add(&p, "second", 6, 4, 46), 0);
    assert_int_equal(p.nlines, 2);
    assert_int_equal(p.line, 3);
    assert_int_equal(p.offset, 40);
    assert_string_equal(p.text.data, "first\nsecond");
    rf_paragraph_reset(&p);
    assert_int_equal(p.nlines, 0);
    assert_int_equal(rf_paragraph_add(&p, "next", 4, 9, 100), 0);
    assert_int_equal(p.line, 9);
    assert_string_equal(p.text.data, "next");
    rf_paragraph_free(&p);
}

static void test_paragraph_limit(void **state) {
    rf_paragraph p;
    rf_paragraph_init(&p, 10);
    assert_int_equal(rf_paragraph_add(&p, "12345", 5, 1, 0), 0);
    assert_false(p.too_long);
    assert_int_equal(rf_paragraph_add(&p, "67890", 5, 2, 6), 0); /* 5 + 1 + 5 > 10 */
    assert_true(p.too_long);
    assert_int_equal(rf_paragraph_add(&p, "more", 4, 3, 12), 0);
    assert_int_equal(p.nlines, 3);
    assert_string_equal(p.text.data, "12345"); /* nothing held past the limit */
    rf_paragraph_reset(&p);
    assert_false(p.too_long);
    rf_paragraph_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blank),
        cmocka_unit_test(test_wikitext_heading),
        cmocka_unit_test(test_paragraph),
        cmocka_unit_test(test_paragraph_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
