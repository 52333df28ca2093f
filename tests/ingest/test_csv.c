/* CSV/TSV record parser: RFC 4180 quoting, records across lines, CRLF, TSV
 * without quoting, and every error status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "ingest/csv.h"

static const rf_csv_opts csv_opts = {',', '"', 0};

/* Feeds text split at '\n' (as the line reader does) and returns the status of
 * the last line fed. */
static rf_csv_status feed_text(rf_csv *p, const char *text) {
    rf_csv_status st = RF_CSV_MORE;
    const char *s = text;
    for (;;) {
        const char *nl = strchr(s, '\n');
        size_t n = nl ? (size_t)(nl - s) : strlen(s);
        st = rf_csv_feed(p, s, n);
        if (!nl) break;
        s = nl + 1;
    }
    return st;
}

static void assert_field(const rf_csv *p, size_t i, const char *want) {
    size_t len;
    const char *f = rf_csv_field(p, i, &len);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(f, want, len);
    assert_int_equal(f[len], '\0');
}

static void test_simple_fields(void **state) {
    rf_csv p;
    rf_csv_init(&p, &csv_opts);
    assert_int_equal(rf_csv_feed(&p, "a,bb,,ccc", 9), RF_CSV_RECORD);
    assert_int_equal(p.nfields, 4);
    assert_field(&p, 0, "a");
    assert_field(&p, 1, "bb");
    assert_field(&p, 2, "");
    assert_field(&p, 3, "ccc");
    assert_int_equal(rf_csv_feed(&p, "x,", 2), RF_CSV_RECORD);
    assert_int_equal(p.nfields, 2);
    assert_field(&p, 1, "");
    rf_csv_free(&p);
}

static void test_quoted_comma_and_doubled_quote(void **state) {
    rf_csv p;
    rf_csv_init(&p, &csv_opts);
    const char *line = "\"a, b\",\"say \"\"hi\"\"\",\"\",plain";
    assert_int_equal(rf_csv_feed(&p, line, strlen(line)), RF_CSV_RECORD);
    assert_int_equal(p.nfields, 4);
    assert_field(&p, 0, "a, b");
    assert_field(&p, 1, "say \"hi\"");
    assert_field(&p, 2, "");
    assert_field(&p, 3, "plain");
    rf_csv_free(&p);
}

static void test_newline_inside_quotes(void **state) {
    rf_csv p;
    rf_csv_init(&p, &csv_opts);
    assert_int_equal(rf_csv_feed(&p, "1,\"first line", 13), RF_CSV_MORE);
    assert_true(rf_csv_open(&p));
    assert_int_equal(rf_csv_feed(&p, "", 0), RF_CSV_MORE); /* an empty line inside */
    assert_int_equal(rf_csv_feed(&p, "third\",end", 10), RF_CSV_RECORD);
    assert_false(rf_csv_open(&p));
    assert_int_equal(p.nfields, 3);
    assert_field(&p, 0, "1");
    assert_field(&p, 1, "first line\n\nthird");
    assert_field(&p, 2, "end");
    rf_csv_free(&p);
}

static void test_crlf(void **state) {
    rf_csv p;
    rf_csv_init(&p, &csv_opts);
    /* CR ending a record is dropped; CRLF inside quotes is kept. */
    assert_int_equal(rf_csv_feed(&p, "a,b\r", 4), RF_CSV_RECORD);
    assert_field(&p, 1, "b");
    assert_int_equal(rf_csv_feed(&p, "\"x\r", 3), RF_CSV_MORE);
    assert_int_equal(rf_csv_feed(&p, "y\",\"z\"\r", 7), RF_CSV_RECORD);
    assert_field(&p, 0, "x\r\ny");
    assert_field(&p, 1, "z");
    rf_csv_free(&p);
}

static void test_blank_line(void **state) {
    rf_csv p;
    rf_csv_init(&p, &csv_opts);
    assert_int_equal(rf_csv_feed(&p, "", 0), RF_CSV_RECORD);
    assert_int_equal(p.nfields, 0);
    assert_int_equal(rf_csv_feed(&p, "\r", 1), RF_CSV_RECORD);
    assert_int_equal(p.nfields, 0);
    rf_csv_free(&p);
}

static void test_quote_inside_unquoted_field_is_literal(void **state) {
    rf_csv p;
    rf_csv_init(&p, &csv_opts);
    assert_int_equal(rf_csv_feed(&p, "5\" tall,x", 9), RF_CSV_RECORD);
    assert_field(&p, 0, "5\" tall");
    rf_csv_free(&p);
}

static void test_bad_quote_then_recovers(void **state) {
    rf_csv p;
    rf_csv_init(&p, &csv_opts);
    assert_int_equal(rf_csv_feed(&p, "\"ab\"c,d", 7), RF_CSV_BAD_QUOTE);
    assert_false(rf_csv_open(&p));
    assert_int_equal(rf_csv_feed(&p, "e,f", 3), RF_CSV_RECORD);
    assert_field(&p, 0, "e");
    rf_csv_free(&p);
}

static void test_unterminated_at_end(void **state) {
    rf_csv p;
    rf_csv_init(&p, &csv_opts);
    assert_int_equal(feed_text(&p, "a,\"never closed\nmore text"), RF_CSV_MORE);
    assert_int_equal(rf_csv_finish(&p), RF_CSV_UNTERMINATED);
    assert_false(rf_csv_open(&p));
    assert_int_equal(rf_csv_finish(&p), RF_CSV_MORE);
    rf_csv_free(&p);
}

static void test_max_record_bounds_memory(void **state) {
    rf_csv_opts o = {',', '"', 64};
    rf_csv p;
    rf_csv_init(&p, &o);
    char line[40];
    memset(line, 'x', sizeof line);
    line[0] = '"';
    assert_int_equal(rf_csv_feed(&p, line, sizeof line), RF_CSV_MORE);
    assert_int_equal(rf_csv_feed(&p, line + 1, sizeof line - 1), RF_CSV_TOO_LONG);
    assert_false(rf_csv_open(&p));
    assert_true(p.buf.len == 0);
    char big[100];
    memset(big, 'y', sizeof big);
    assert_int_equal(rf_csv_feed(&p, big, sizeof big), RF_CSV_TOO_LONG);
    assert_int_equal(rf_csv_feed(&p, "ok", 2), RF_CSV_RECORD);
    rf_csv_free(&p);
}

static void test_tsv_without_quoting(void **state) {
    rf_csv_opts o = {'\t', -1, 0};
    rf_csv p;
    rf_csv_init(&p, &o);
    const char *line = "\"quoted\" words , commas\t1";
    assert_int_equal(rf_csv_feed(&p, line, strlen(line)), RF_CSV_RECORD);
    assert_int_equal(p.nfields, 2);
    assert_field(&p, 0, "\"quoted\" words , commas");
    assert_field(&p, 1, "1");
    /* 0xFF must not be mistaken for "no quote" (-1) on signed-char machines. */
    assert_int_equal(rf_csv_feed(&p, "\xff\t\xff", 3), RF_CSV_RECORD);
    assert_field(&p, 0, "\xff");
    rf_csv_free(&p);
}

static void test_tsv_with_quoting(void **state) {
    rf_csv_opts o = {'\t', '"', 0};
    rf_csv p;
    rf_csv_init(&p, &o);
    const char *line = "\"a\tb\"\tc";
    assert_int_equal(rf_csv_feed(&p, line, strlen(line)), RF_CSV_RECORD);
    assert_field(&p, 0, "a\tb");
    assert_field(&p, 1, "c");
    rf_csv_free(&p);
}

static void test_status_names(void **state) {
    assert_string_equal(rf_csv_status_name(RF_CSV_BAD_QUOTE), "csv_bad_quote");
    assert_string_equal(rf_csv_status_name(RF_CSV_UNTERMINATED), "csv_unterminated_quote");
    assert_string_equal(rf_csv_status_name(RF_CSV_TOO_LONG), "csv_record_too_long");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simple_fields),
        cmocka_unit_test(test_quoted_comma_and_doubled_quote),
        cmocka_unit_test(test_newline_inside_quotes),
        cmocka_unit_test(test_crlf),
        cmocka_unit_test(test_blank_line),
        cmocka_unit_test(test_quote_inside_unquoted_field_is_literal),
        cmocka_unit_test(test_bad_quote_then_recovers),
        cmocka_unit_test(test_unterminated_at_end),
        cmocka_unit_test(test_max_record_bounds_memory),
        cmocka_unit_test(test_tsv_without_quoting),
        cmocka_unit_test(test_tsv_with_quoting),
        cmocka_unit_test(test_status_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
