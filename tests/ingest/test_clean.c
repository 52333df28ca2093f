/* Cleaning: UTF-8 repair/reject, NFKC, controls, whitespace, HTML, lowercase,
 * options from YAML, and NFKC fast-path parity with utf8proc on real data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include <cmocka.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "common/utf8.h"
#include "ingest/clean.h"

static rf_clean_result last;

/* Cleans s (length n) with o and compares against want (NUL-terminated). */
static void expect_n(const rf_clean_opts *o, const char *s, size_t n, const char *want) {
    rf_buf out = RF_BUF_INIT;
    assert_int_equal(rf_clean_text(o, s, n, &out, &last), 0);
    assert_null(last.reject);
    assert_string_equal(out.data, want);
    assert_int_equal(out.len, strlen(want));
    rf_buf_free(&out);
}

static void expect(const rf_clean_opts *o, const char *s, const char *want) {
    expect_n(o, s, strlen(s), want);
}

static void test_defaults(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    assert_int_equal(o.utf8, RF_UTF8_REPAIR);
    assert_true(o.nfkc && o.strip_control && o.collapse_whitespace);
    assert_false(o.html_unescape || o.strip_tags || o.lowercase);
}

static void test_ascii_unchanged(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    expect(&o, "Great product, works as described!", "Great product, works as described!");
    assert_int_equal(last.controls_removed, 0);
    assert_int_equal(last.utf8_repairs, 0);
}

static void test_nfkc(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    expect(&o, "\xEF\xAC\x81ne", "fine");                               /* U+FB01 ligature */
    expect(&o, "\xEF\xBC\xA1\xEF\xBC\xA2\xEF\xBC\x91", "AB1");          /* full-width A B 1 */
    expect(&o, "\xE2\x91\xA0 step", "1 step");                          /* U+2460 circled 1 */
    expect(&o, "cafe\xCC\x81", "caf\xC3\xA9");                          /* e + U+0301 composes */
    expect(&o, "x\xC2\xB2", "x2");                                      /* superscript two */
    expect(&o, "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB", "\xED\x95\x9C"); /* jamo -> U+D55C */
    /* Characters NFKC leaves alone take the fast path and are unchanged. */
    expect(&o, "it\xE2\x80\x99s \xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC",
           "it\xE2\x80\x99s \xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC");
    o.nfkc = false;
    expect(&o, "\xEF\xAC\x81ne", "\xEF\xAC\x81ne");
}

static void test_utf8_repair_maximal_subparts(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    /* Unicode 15 Table 3-8: "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64" has
     * the maximal subparts F1 80 80 | E1 80 | C2 | 80 | 80 | BF -> six U+FFFD. */
    const char in[] = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
    expect(&o, in,
           "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
           "b\xEF\xBF\xBD"
           "c\xEF\xBF\xBD\xEF\xBF\xBD"
           "d");
    assert_int_equal(last.utf8_repairs, 6);
    /* Overlong, surrogate, above U+10FFFF: one U+FFFD per byte (no valid prefix). */
    expect(&o, "\xC0\xAF|\xED\xA0\x80|\xF4\x90\x80\x80",
           "\xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD|"
           "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    assert_int_equal(last.utf8_repairs, 9);
    /* Truncated sequence at the end. */
    expect(&o, "ok\xE2\x82", "ok\xEF\xBF\xBD");
}

static void test_utf8_reject(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    o.utf8 = RF_UTF8_REJECT;
    rf_buf out = RF_BUF_INIT;
    assert_int_equal(rf_clean_text(&o, "bad \xFF byte", 10, &out, &last), 0);
    assert_string_equal(last.reject, "invalid_utf8");
    assert_int_equal(out.len, 0);
    assert_int_equal(rf_clean_text(&o, "fine \xC3\xA9", 7, &out, &last), 0);
    assert_null(last.reject);
    rf_buf_free(&out);
}

static void test_controls(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    /* NUL, BEL, ESC, DEL, C1 U+0080 and U+009F are removed and counted. */
    expect_n(&o,
             "a\0b\x07"
             "c\x1B"
             "d\x7F"
             "e\xC2\x80"
             "f\xC2\x9F"
             "g",
             15, "abcdefg");
    assert_int_equal(last.controls_removed, 6);
    assert_int_equal(last.nul_bytes, 1);
    /* Without collapsing, \t \n \r stay, \v \f and U+0085 are controls. */
    o.collapse_whitespace = false;
    expect(&o,
           "a\tb\nc\r\nd\x0B"
           "e\x0C"
           "f\xC2\x85g",
           "a\tb\nc\r\ndefg");
    assert_int_equal(last.controls_removed, 3);
    /* strip_control off keeps them. */
    o.strip_control = false;
    expect(&o, "a\x01z", "a\x01z");
}

/* A removed control must not keep apart what NFKC composes: jamo L, NUL, jamo
 * V, jamo T is one syllable, and cleaning the result again changes nothing. */
static void test_controls_before_nfkc(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    const char in[] = "\xE1\x84\x92\0\xE1\x85\xA1\x01\xE1\x86\xAB";
    expect_n(&o, in, sizeof in - 1, "\xED\x95\x9C");
    assert_int_equal(last.controls_removed, 2);
    assert_int_equal(last.nul_bytes, 1);
}

static void test_whitespace(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    expect(&o, "  two   spaces\t\tand\n\nlines  ", "two spaces and lines");
    /* Unicode spaces: NBSP, ideographic, line separator, em space, narrow NBSP. */
    o.nfkc = false; /* NFKC would map most to U+0020 first: test the collapse itself */
    expect(&o,
           "a\xC2\xA0\xE3\x80\x80"
           "b\xE2\x80\xA8"
           "c\xE2\x80\x83"
           "d\xE2\x80\xAF"
           "e",
           "a b c d e");
    /* A control between spaces leaves one space. */
    expect(&o, "a \x01 b", "a b");
    o.collapse_whitespace = false;
    expect(&o, " a  b ", " a  b ");
}

/* Reference for ASCII with default options (+ lowercase): controls dropped,
 * whitespace runs (after dropping) collapsed, trimmed. */
static void reference_ascii(const char *s, size_t n, bool lower, char *out) {
    size_t k = 0;
    bool pending = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == ' ' || (c >= '\t' && c <= '\r')) {
            pending = k > 0;
        } else if (c >= 0x20 && c != 0x7F) {
            if (pending) out[k++] = ' ';
            pending = false;
            out[k++] = (char)(lower && c >= 'A' && c <= 'Z' ? c | 0x20 : c);
        }
    }
    out[k] = '\0';
}

/* Random ASCII over a small alphabet rich in spaces, controls and capitals,
 * at lengths around the 8-byte blocks of the fast path, against the reference. */
static void test_ascii_paths_random(void **state) {
    static const char ALPHA[] = {'a', 'Z', ' ', ' ', ' ', '\t', '\n', 0x01, 0x7F, '.', '@', '['};
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    rf_buf out = RF_BUF_INIT;
    char in[64], want[64];
    uint64_t x = 99;
    for (int t = 0; t < 200000; t++) {
        size_t n = (size_t)(t % 40) + 1;
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* Mostly letters so that many strings are already clean. */
            in[i] = (x >> 60) < 9 ? "abcXYZ.-!"[(x >> 40) % 9] : ALPHA[(x >> 33) % sizeof ALPHA];
        }
        o.lowercase = t & 1;
        reference_ascii(in, n, o.lowercase, want);
        assert_int_equal(rf_clean_text(&o, in, n, &out, &last), 0);
        if (strcmp(out.data, want) != 0) fail_msg("case %d: got '%s' want '%s'", t, out.data, want);
        assert_true(last.reject ? want[0] == '\0' : want[0] != '\0');
    }
    rf_buf_free(&out);
}

static void test_empty(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    rf_buf out = RF_BUF_INIT;
    const char *cases[] = {"", "   ", "\t\n\x01\x02", "\xE3\x80\x80"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(rf_clean_text(&o, cases[i], strlen(cases[i]), &out, &last), 0);
        assert_string_equal(last.reject, "empty");
        assert_int_equal(out.len, 0);
    }
    rf_buf_free(&out);
}

static void test_html(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    /* Off by default: markup stays. */
    expect(&o, "<b>Tom &amp; Jerry</b>", "<b>Tom &amp; Jerry</b>");
    o.html_unescape = o.strip_tags = true;
    expect(&o, "<b>Tom &amp; Jerry</b><br/>great&nbsp;show", "Tom & Jerry great show");
    assert_int_equal(last.tags_removed, 3);
    assert_int_equal(last.entities_decoded, 2);
    /* Escaped markup is text, not a tag: unescape runs after stripping. */
    expect(&o, "use &lt;b&gt; for bold", "use <b> for bold");
    /* Entities feed NFKC: &#xFB01; becomes "fi", like a literal U+FB01. */
    expect(&o, "&#xFB01;ne", "fine");
    expect(&o, "don&#039;t", "don't");
    /* Every step in one document: repair, strip, unescape, NFKC. */
    expect(&o, "<b>x\xFF</b> &amp; \xEF\xAC\x81", "x\xEF\xBF\xBD & fi");
    assert_int_equal(last.utf8_repairs, 1);
    assert_int_equal(last.tags_removed, 2);
    assert_int_equal(last.entities_decoded, 1);
}

static void test_lowercase(void **state) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    o.lowercase = true;
    expect(&o, "Hello WORLD", "hello world");
    expect(&o,
           "\xC3\x89T\xC3\x89 \xCE\xA3\xCE\x9F\xCE\xA6\xCE\x9F\xCE\xA3 \xD0\x9C\xD0\x98\xD0\xA0",
           "\xC3\xA9t\xC3\xA9 \xCF\x83\xCE\xBF\xCF\x86\xCE\xBF\xCF\x83 \xD0\xBC\xD0\xB8\xD1\x80");
    /* U+023A (2 bytes) lowercases to U+2C65 (3 bytes): the output may grow. */
    expect(&o, "\xC8\xBA\xC8\xBA\xC8\xBA\xC8\xBA",
           "\xE2\xB1\xA5\xE2\xB1\xA5\xE2\xB1\xA5\xE2\xB1\xA5");
    /* U+0130 + U+0301 is NFKC; lowercased it is 'i' + U+0301, which NFKC
     * composes into U+00ED: the output is normalized again, so a second
     * cleaning changes nothing (found by fuzz_clean). */
    expect(&o, "\xC4\xB0\xCC\x81 x", "\xC3\xAD x");
    expect(&o, "\xC3\xAD x", "\xC3\xAD x");
}

static void test_from_cfg(void **state) {
    const char *yaml = "clean:\n  utf8: reject\n  lowercase: true\n  nfkc: false\n";
    rf_cfg *root;
    assert_int_equal(rf_cfg_load_string(yaml, strlen(yaml), "t.yaml", &root), 0);
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    assert_int_equal(rf_clean_opts_from_cfg(rf_cfg_get(root, "clean"), &o), 0);
    assert_int_equal(o.utf8, RF_UTF8_REJECT);
    assert_true(o.lowercase);
    assert_false(o.nfkc);
    assert_true(o.collapse_whitespace); /* absent: kept */
    rf_cfg_free(root);

    const char *bad[] = {"clean:\n  lowercse: true\n", "clean:\n  utf8: fix\n",
                         "clean:\n  nfkc: maybe\n"};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(rf_cfg_load_string(bad[i], strlen(bad[i]), "t.yaml", &root), 0);
        assert_int_equal(rf_clean_opts_from_cfg(rf_cfg_get(root, "clean"), &o), RF_ERR_INVALID);
        assert_non_null(strstr(rf_errmsg(), i == 0 ? "lowercse" : i == 1 ? "utf8" : "nfkc"));
        rf_cfg_free(root);
    }
    assert_int_equal(rf_clean_opts_from_cfg(NULL, &o), 0);
}

/* Reference: utf8proc NFKC, then the same whitespace collapse done naively. */
static char *reference_nfkc(const char *s, size_t n) {
    utf8proc_uint8_t *m = NULL;
    utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &m,
                                        UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    assert_true(len >= 0);
    return (char *)m;
}

/* On every line of SST-2 train, the musical-instrument reviews and WikiText-2, cleaning
 * with only NFKC on equals utf8proc's NFKC: the ASCII and no-change fast paths
 * never differ from the library. */
static void test_nfkc_parity_real_data(void **state) {
    const char *shared = getenv("SHARED");
    if (!shared) fail_msg("SHARED is not set: run through tests/run.sh (needs ../shared/data)");
    const char *files[] = {"data/sst2/train.tsv",
                           "data/amazon/Musical_instruments_reviews.PARTIAL.csv",
                           "data/wikitext2/wiki.valid.raw", "data/wikitext2/wiki.test.raw"};
    rf_clean_opts o = {.utf8 = RF_UTF8_REPAIR, .nfkc = true};
    rf_buf out = RF_BUF_INIT, valid = RF_BUF_INIT;
    size_t lines = 0, changed = 0;
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", shared, files[f]);
        FILE *fp = fopen(path, "rb");
        if (!fp) fail_msg("cannot open %s (shared data missing?)", path);
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        while ((len = getline(&line, &cap, fp)) > 0) {
            rf_buf_reset(&valid);
            assert_true(rf_utf8_repair(line, (size_t)len, &valid) >= 0);
            assert_int_equal(rf_clean_text(&o, valid.data, valid.len, &out, &last), 0);
            char *ref = reference_nfkc(valid.data, valid.len);
            assert_string_equal(out.data, ref);
            changed += strcmp(ref, valid.data) != 0;
            free(ref);
            lines++;
        }
        free(line);
        fclose(fp);
    }
    print_message("nfkc parity: %zu lines, %zu changed by NFKC\n", lines, changed);
    assert_true(lines > 80000);
    assert_true(changed > 0); /* WikiText has text NFKC changes */
    assert_true(changed > 0); /* WikiText has text NFKC changes */
    rf_buf_free(&out);
    rf_buf_free(&valid);
}

/* Random strings mixing ASCII, combining marks, Hangul jamo and arbitrary code
 * points: the fast path's "NFKC cannot change this" test never disagrees. */
static void test_nfkc_parity_random(void **state) {
    static const uint32_t pick[] = {'a',    'e',    ' ',    0x301,  0x308,  0x1100, 0x1161, 0x11A8,
                                    0xAC00, 0xFB01, 0x2460, 0xFF21, 0x0CC6, 0x0CD5, 0x0B47, 0x0B3E};
    rf_clean_opts o = {.utf8 = RF_UTF8_REPAIR, .nfkc = true};
    rf_buf in = RF_BUF_INIT, out = RF_BUF_INIT;
    uint64_t x = 42;
    size_t changed = 0;
    for (int t = 0; t < 20000; t++) {
        rf_buf_reset(&in);
        for (int k = 0; k < 12; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(x >> 33), cp;
            if (r % 3 == 0)
                cp = pick[(r / 3) % (sizeof pick / sizeof pick[0])];
            else
                cp = (r / 3) % (r % 3 == 1 ? 0x3000u : 0x110000u) + 1;
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
            char enc[4];
            assert_int_equal(rf_buf_append(&in, enc, rf_utf8_encode(cp, enc)), 0);
        }
        assert_int_equal(rf_clean_text(&o, in.data, in.len, &out, &last), 0);
        char *ref = reference_nfkc(in.data, in.len);
        assert_string_equal(out.data, ref);
        changed += strcmp(ref, in.data) != 0;
        free(ref);
    }
    assert_true(changed > 1000);
    rf_buf_free(&in);
    rf_buf_free(&out);
}

static bool clean_matches_nfkc(const rf_clean_opts *o, const uint32_t *cps, size_t n, rf_buf *in,
                               rf_buf *out) {
    rf_buf_reset(in);
    char enc[4];
    for (size_t i = 0; i < n; i++)
        rf_buf_append(in, enc, rf_utf8_encode(cps[i], enc));
    assert_int_equal(rf_clean_text(o, in->data, in->len, out, &last), 0);
    char *ref = reference_nfkc(in->data, in->len);
    bool same = strcmp(out->data, ref) == 0;
    free(ref);
    return same;
}

/* Every code point between two letters; then every code point that has a
 * decomposition but is its own NFKC, after every composition starter (where
 * the fast path could miss a composition with the preceding character). */
static void test_nfkc_parity_all_code_points(void **state) {
    rf_clean_opts o = {.utf8 = RF_UTF8_REPAIR, .nfkc = true};
    rf_buf in = RF_BUF_INIT, out = RF_BUF_INIT;
    uint32_t starters[512], self[2048];
    size_t n_starters = 0, n_self = 0;
    for (uint32_t cp = 0x80; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        uint32_t t[3] = {'a', cp, 'a'};
        if (!clean_matches_nfkc(&o, t, 3, &in, &out)) fail_msg("U+%04X between letters", cp);
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        if (p->comb_index != UINT16_MAX && p->comb_index < 0x8000 && n_starters < 512)
            starters[n_starters++] = cp;
        if (p->decomp_seqindex != UINT16_MAX && p->combining_class == 0 && n_self < 2048) {
            char enc[4];
            size_t len = rf_utf8_encode(cp, enc);
            char *ref = reference_nfkc(enc, len);
            if (strlen(ref) == len && memcmp(ref, enc, len) == 0) self[n_self++] = cp;
            free(ref);
        }
    }
    assert_true(n_starters > 300 && n_starters < 512);
    assert_true(n_self > 900 && n_self < 2048);
    for (size_t i = 0; i < n_self; i++)
        for (size_t k = 0; k < n_starters; k++) {
            uint32_t t[2] = {starters[k], self[i]};
            if (!clean_matches_nfkc(&o, t, 2, &in, &out))
                fail_msg("U+%04X after U+%04X", self[i], starters[k]);
        }
    rf_buf_free(&in);
    rf_buf_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_ascii_unchanged),
        cmocka_unit_test(test_nfkc),
        cmocka_unit_test(test_utf8_repair_maximal_subparts),
        cmocka_unit_test(test_utf8_reject),
        cmocka_unit_test(test_controls),
        cmocka_unit_test(test_controls_before_nfkc),
        cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_ascii_paths_random),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_html),
        cmocka_unit_test(test_lowercase),
        cmocka_unit_test(test_from_cfg),
        cmocka_unit_test(test_nfkc_parity_real_data),
        cmocka_unit_test(test_nfkc_parity_random),
        cmocka_unit_test(test_nfkc_parity_all_code_points),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
