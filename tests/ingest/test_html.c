/* HTML tag stripping and character references. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/buf.h"
#include "ingest/html.h"

static size_t count;

static void unescape(const char *in, const char *want) {
    rf_buf out = RF_BUF_INIT;
    count = 0;
    assert_int_equal(rf_html_unescape(in, strlen(in), &out, &count), 0);
    assert_string_equal(out.data, want);
    rf_buf_free(&out);
}

static void strip(const char *in, const char *want) {
    rf_buf out = RF_BUF_INIT;
    count = 0;
    assert_int_equal(rf_html_strip_tags(in, strlen(in), &out, &count), 0);
    assert_string_equal(out.data, want);
    rf_buf_free(&out);
}

static void test_named(void **state) {
    unescape("Tom &amp; Jerry &lt;3 &quot;x&quot; &apos;y&apos;", "Tom & Jerry <3 \"x\" 'y'");
    assert_int_equal(count, 6);
    unescape("caf&eacute; &Eacute;t&eacute; &euro;5 &hellip; &mdash;",
             "caf\xC3\xA9 \xC3\x89t\xC3\xA9 \xE2\x82\xAC"
             "5 \xE2\x80\xA6 \xE2\x80\x94");
    unescape("&nbsp;&iexcl;&thetasym;&zwj;&rlm;",
             "\xC2\xA0\xC2\xA1\xCF\x91\xE2\x80\x8D\xE2\x80\x8F");
    /* Case matters: &Alpha; and &alpha; differ; &AMP; is not HTML4. */
    unescape("&Alpha;&alpha;&AMP;", "\xCE\x91\xCE\xB1&AMP;");
    assert_int_equal(count, 2);
}

static void test_table(void **state) {
    /* First and last names of the HTML 4.01 set in byte order, and lookups
     * that must fail. */
    assert_int_equal(rf_html_entity_lookup("AElig", 5), 0xC6);
    assert_int_equal(rf_html_entity_lookup("zwnj", 4), 0x200C);
    assert_int_equal(rf_html_entity_lookup("yuml", 4), 0xFF);
    assert_int_equal(rf_html_entity_lookup("diams", 5), 0x2666);
    assert_int_equal(rf_html_entity_lookup("apos", 4), 0x27);
    assert_int_equal(rf_html_entity_lookup("amp", 2), 0); /* "am" */
    assert_int_equal(rf_html_entity_lookup("", 0), 0);
    assert_int_equal(rf_html_entity_lookup("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 40), 0);
}

static void test_numeric(void **state) {
    unescape("&#65;&#x41;&#X41;&#0065;", "AAAA");
    assert_int_equal(count, 4);
    unescape("&#233;&#xe9;&#x1F600;", "\xC3\xA9\xC3\xA9\xF0\x9F\x98\x80");
    /* 0, surrogates, beyond U+10FFFF (also after overflow) -> U+FFFD. */
    unescape("&#0;|&#xD800;|&#xDFFF;|&#x110000;|&#99999999999999999999;",
             "\xEF\xBF\xBD|\xEF\xBF\xBD|\xEF\xBF\xBD|\xEF\xBF\xBD|\xEF\xBF\xBD");
    assert_int_equal(count, 5);
    /* 0x80..0x9F through windows-1252; undefined slots stay C1. */
    unescape("&#150;&#x93;&#128;&#x81;", "\xE2\x80\x93\xE2\x80\x9C\xE2\x82\xAC\xC2\x81");
    /* U+10FFFF is the last valid one. */
    unescape("&#x10FFFF;", "\xF4\x8F\xBF\xBF");
}

static void test_kept_verbatim(void **state) {
    unescape("&#; &#x; &#xZZ; &#12 &amp &unknown; & ; AT&T &",
             "&#; &#x; &#xZZ; &#12 &amp &unknown; & ; AT&T &");
    assert_int_equal(count, 0);
    /* A reference right after a failed one is still decoded. */
    unescape("&&amp;&#&#38;", "&&&#&");
    assert_int_equal(count, 2);
}

static void test_tags(void **state) {
    strip("<b>bold</b> and <i>italic</i>", "bold and italic");
    assert_int_equal(count, 4);
    /* Inline tags join, block tags separate words. */
    strip("wor<b>d</b>s", "words");
    strip("one<br>two<br/>three<p>four</p>five", "one two three four five");
    strip("<li>a</li><li>b</li>", " a  b ");
    /* '>' inside a quoted attribute value does not end the tag. */
    strip("<a href=\"x>y\" title='p>q'>link</a>", "link");
    strip("<img alt = \"a > b\" src=x.png>pic", " pic");
    /* Quotes outside attribute values are not quoting. */
    strip("<p class=a\"b>text</p>", " text ");
}

static void test_comments_and_raw_text(void **state) {
    strip("a<!-- hidden > still hidden -->b", "a b");
    strip("<!DOCTYPE html><?xml version=\"1.0\"?>x", "  x");
    strip("<script type=\"text/javascript\">if (a < b) { x = \"</div>\"; }</script>after",
          " after");
    strip("<STYLE>p { color: red }</Style >after", " after");
    /* Unterminated script removes the rest, like a browser. */
    strip("before<script>var x = 1;", "before ");
}

static void test_not_tags(void **state) {
    strip("a < b and c > d", "a < b and c > d");
    strip("I <3 this", "I <3 this");
    strip("x<=y", "x<=y");
    strip("<", "<");
    /* Unterminated constructs are text, not silently dropped. */
    strip("price <b unclosed", "price <b unclosed");
    strip("a <!-- no end", "a <!-- no end");
    strip("<a title=\"open>", "<a title=\"open>");
    assert_int_equal(count, 0);
}

/* A construct left open keeps the rest as text, tags included... */
static void test_unterminated_keeps_rest(void **state) {
    strip("a <b x=\"open <i>y</i>", "a <b x=\"open <i>y</i>");
    strip("<i>y</i> then <!-- open <b>z</b>", "y then <!-- open <b>z</b>");
}

/* ...which keeps stripping linear: 8 MB of openers that never close, in
 * several shapes, each well under a second (quadratic would take hours). */
static void test_adversarial_linear(void **state) {
    const char *units[] = {"<a x=\"", "<!--", "<a ", "<!x", "<a x='>'"};
    size_t size = 8u << 20;
    char *in = malloc(size);
    assert_non_null(in);
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t k = strlen(units[u]), n = size / k * k;
        for (size_t i = 0; i < n; i += k)
            memcpy(in + i, units[u], k);
        rf_buf out = RF_BUF_INIT;
        clock_t t0 = clock();
        assert_int_equal(rf_html_strip_tags(in, n, &out, NULL), 0);
        double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
        if (secs > 5) fail_msg("'%s' x %zu took %.1f s", units[u], n / k, secs);
        rf_buf_free(&out);
    }
    free(in);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_named),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_numeric),
        cmocka_unit_test(test_kept_verbatim),
        cmocka_unit_test(test_tags),
        cmocka_unit_test(test_comments_and_raw_text),
        cmocka_unit_test(test_not_tags),
        cmocka_unit_test(test_unterminated_keeps_rest),
        cmocka_unit_test(test_adversarial_linear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
