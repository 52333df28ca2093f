#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "common/buf.h"
#include "common/utf8.h"

static void test_decode_valid(void **state) {
    uint32_t cp;
    assert_int_equal(rf_utf8_decode((const unsigned char *)"A", 1, &cp), 1);
    assert_int_equal(cp, 'A');
    assert_int_equal(rf_utf8_decode((const unsigned char *)"\xc3\xa9", 2, &cp), 2);
    assert_int_equal(cp, 0xe9);
    assert_int_equal(rf_utf8_decode((const unsigned char *)"\xe2\x82\xac", 3, &cp), 3);
    assert_int_equal(cp, 0x20ac);
    assert_int_equal(rf_utf8_decode((const unsigned char *)"\xf4\x8f\xbf\xbf", 4, &cp), 4);
    assert_int_equal(cp, 0x10ffff);
}

static void test_decode_invalid_maximal_subparts(void **state) {
    uint32_t cp;
    /* Overlong, surrogate, above U+10FFFF, stray continuation: one byte each. */
    assert_int_equal(rf_utf8_decode((const unsigned char *)"\xc0\xaf", 2, &cp), -1);
    assert_int_equal(rf_utf8_decode((const unsigned char *)"\xed\xa0\x80", 3, &cp), -1);
    assert_int_equal(rf_utf8_decode((const unsigned char *)"\xf4\x90\x80\x80", 4, &cp), -1);
    assert_int_equal(rf_utf8_decode((const unsigned char *)"\x80", 1, &cp), -1);
    /* A truncated 3-byte sequence is one maximal subpart of 2 bytes. */
    assert_int_equal(rf_utf8_decode((const unsigned char *)"\xe2\x82"
                                                           "A",
                                    3, &cp),
                     -2);
    assert_int_equal(rf_utf8_decode((const unsigned char *)"\xe2\x82", 2, &cp), -2);
}

static void test_repair_matches_unicode_practice(void **state) {
    /* Unicode 15 Table 3-8: "61 F1 80 80 E1 80 C2 62 80 63 80 BF 64" repairs to
     * a FFFD FFFD FFFD b FFFD c FFFD FFFD d. */
    const char in[] = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
    rf_buf out = RF_BUF_INIT;
    long n = rf_utf8_repair(in, sizeof in - 1, &out);
    assert_int_equal(n, 6);
    const char want[] = "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                        "b\xEF\xBF\xBD"
                        "c\xEF\xBF\xBD\xEF\xBF\xBD"
                        "d";
    assert_int_equal(out.len, sizeof want - 1);
    assert_memory_equal(out.data, want, out.len);
    rf_buf_free(&out);
}

static void test_valid_and_first_invalid(void **state) {
    const char ok[] = "plain ascii text that is long enough for the fast path \xc3\xa9";
    assert_true(rf_utf8_valid(ok, sizeof ok - 1));
    const char bad[] = "0123456789abcdef\xff tail";
    assert_false(rf_utf8_valid(bad, sizeof bad - 1));
    assert_int_equal(rf_utf8_first_invalid(bad, sizeof bad - 1), 16);
    assert_int_equal(rf_utf8_count("a\xc3\xa9\xe2\x82\xac", 6), 3);
}

static void test_encode_roundtrip(void **state) {
    static const uint32_t cps[] = {0, 0x7f, 0x80, 0x7ff, 0x800, 0xfffd, 0x10000, 0x10ffff};
    for (size_t i = 0; i < sizeof cps / sizeof *cps; i++) {
        char b[4];
        size_t n = rf_utf8_encode(cps[i], b);
        uint32_t cp;
        assert_int_equal(rf_utf8_decode((const unsigned char *)b, n, &cp), (int)n);
        assert_int_equal(cp, cps[i]);
    }
}

static void test_json_string_output_is_valid(void **state) {
    rf_buf b = RF_BUF_INIT;
    assert_int_equal(rf_buf_append_json_str(&b, "a\"\\\n\x01\xff", 6), 0);
    assert_string_equal(b.data, "\"a\\\"\\\\\\n\\u0001\xEF\xBF\xBD\"");
    rf_buf_free(&b);
}

/* Escaping agrees with a byte-at-a-time reference for a special byte at every
 * position (the 8-byte fast path must stop at each). */
static void test_json_escape_every_position(void **state) {
    static const char specials[] = {'"', '\\', '\n', 0x01, 0x1f, 0x7f, ' ', '~'};
    for (size_t k = 0; k < sizeof specials; k++) {
        for (int pos = 0; pos < 24; pos++) {
            char in[24];
            for (int i = 0; i < 24; i++)
                in[i] = (char)('A' + i);
            in[pos] = specials[k];
            rf_buf got = RF_BUF_INIT, want = RF_BUF_INIT;
            assert_int_equal(rf_buf_append_json_str(&got, in, sizeof in), 0);
            rf_buf_putc(&want, '"');
            for (int i = 0; i < 24; i++) {
                unsigned char c = (unsigned char)in[i];
                if (c == '"' || c == '\\') {
                    rf_buf_putc(&want, '\\');
                    rf_buf_putc(&want, (char)c);
                } else if (c == '\n') {
                    rf_buf_puts(&want, "\\n");
                } else if (c < 0x20) {
                    rf_buf_printf(&want, "\\u%04x", c);
                } else {
                    rf_buf_putc(&want, (char)c);
                }
            }
            rf_buf_putc(&want, '"');
            assert_string_equal(got.data, want.data);
            rf_buf_free(&got);
            rf_buf_free(&want);
        }
    }
}

static void test_put_integers(void **state) {
    rf_buf b = RF_BUF_INIT;
    rf_buf_put_u64(&b, 0);
    rf_buf_putc(&b, ' ');
    rf_buf_put_u64(&b, UINT64_MAX);
    rf_buf_putc(&b, ' ');
    rf_buf_put_i64(&b, INT64_MIN);
    rf_buf_putc(&b, ' ');
    rf_buf_put_i64(&b, -1);
    assert_string_equal(b.data, "0 18446744073709551615 -9223372036854775808 -1");
    rf_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_valid),
        cmocka_unit_test(test_decode_invalid_maximal_subparts),
        cmocka_unit_test(test_repair_matches_unicode_practice),
        cmocka_unit_test(test_valid_and_first_invalid),
        cmocka_unit_test(test_encode_roundtrip),
        cmocka_unit_test(test_json_string_output_is_valid),
        cmocka_unit_test(test_json_escape_every_position),
        cmocka_unit_test(test_put_integers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
