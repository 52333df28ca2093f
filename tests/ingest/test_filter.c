/* Quality filters: every rule at its threshold (kept exactly at the limit,
 * rejected just past it), presets, options from YAML, and the project defaults
 * on the real short-review data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "ingest/clean.h"
#include "ingest/filter.h"

/* Every rule off. */
static rf_quality_opts none(void) {
    rf_quality_opts o;
    memset(&o, 0, sizeof o);
    o.max_symbol_ratio = -1;
    o.max_bullet_line_frac = o.max_ellipsis_line_frac = 1;
    o.max_dup_line_frac = o.max_dup_line_char_frac = 1;
    for (size_t i = 0; i < 3; i++)
        o.max_top_ngram_frac[i] = 1;
    for (size_t i = 0; i < 6; i++)
        o.max_dup_ngram_frac[i] = 1;
    o.max_short_line_frac = 1;
    return o;
}

/* The reason for text under o ("keep" when kept). */
static const char *verdict(const rf_quality_opts *o, const char *text) {
    const char *reason;
    assert_int_equal(rf_quality_check(o, text, strlen(text), &reason), 0);
    return reason ? reason : "keep";
}

/* n copies of unit joined by sep, into one of two static buffers (so that two
 * results can be used together). */
static const char *rep(const char *unit, const char *sep, int n) {
    static char bufs[2][1 << 16];
    static int which;
    char *buf = bufs[which ^= 1];
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (i) strcat(buf, sep);
        strcat(buf, unit);
    }
    return buf;
}

static void test_all_off_keeps_anything(void **state) {
    rf_quality_opts o = none();
    assert_string_equal(verdict(&o, ""), "keep");
    assert_string_equal(verdict(&o, "# # # ... \n- \n- "), "keep");
}

static void test_word_count(void **state) {
    rf_quality_opts o = none();
    o.min_words = 3;
    o.max_words = 4;
    assert_string_equal(verdict(&o, "a b"), "too_few_words");
    assert_string_equal(verdict(&o, "a  b\tc"), "keep");
    assert_string_equal(verdict(&o, "a b c d"), "keep");
    assert_string_equal(verdict(&o, "a b c d e"), "too_many_words");
}

static void test_mean_word_len(void **state) {
    rf_quality_opts o = none();
    o.min_mean_word_len = 3;
    o.max_mean_word_len = 10;
    assert_string_equal(verdict(&o, "abc abc"), "keep");
    assert_string_equal(verdict(&o, "abc ab"), "mean_word_len_low");
    assert_string_equal(verdict(&o, "abcdefghij"), "keep");
    assert_string_equal(verdict(&o, "abcdefghijk"), "mean_word_len_high");
    /* Characters, not bytes: three 2-byte letters are a 3-character word. */
    assert_string_equal(verdict(&o, "\xC3\xA9\xC3\xA9\xC3\xA9"), "keep");
}

static void test_symbol_ratio(void **state) {
    rf_quality_opts o = none();
    o.max_symbol_ratio = 0.1;
    assert_string_equal(verdict(&o, "#a b c d e f g h i j"), "keep"); /* 1/10 */
    assert_string_equal(verdict(&o, "#a b c d e f g h i"), "symbol_ratio");
    assert_string_equal(verdict(&o, "wow... b c d e f g h i j"), "keep");
    assert_string_equal(verdict(&o, "wow..... b c d e f g h i"), "symbol_ratio");
    assert_string_equal(verdict(&o, "wow\xE2\x80\xA6 b c d e f g h i"), "symbol_ratio");
    /* Two dots are not an ellipsis. */
    assert_string_equal(verdict(&o, "wow.. b c d e f g h i"), "keep");
}

static void test_bullet_and_ellipsis_lines(void **state) {
    rf_quality_opts o = none();
    o.max_bullet_line_frac = 0.9;
    char text[512];
    snprintf(text, sizeof text, "%s\nplain", rep("- item", "\n", 9));
    assert_string_equal(verdict(&o, text), "keep"); /* 9/10 */
    snprintf(text, sizeof text, "%s\n\xE2\x80\xA2 item", rep("* item", "\n", 9));
    assert_string_equal(verdict(&o, text), "bullet_lines");
    o = none();
    o.max_ellipsis_line_frac = 0.3;
    snprintf(text, sizeof text, "%s\n%s", rep("so...", "\n", 3), rep("done.", "\n", 7));
    assert_string_equal(verdict(&o, text), "keep"); /* 3/10 */
    snprintf(text, sizeof text, "%s\n%s", rep("so\xE2\x80\xA6", "\n", 4), rep("done.", "\n", 6));
    assert_string_equal(verdict(&o, text), "ellipsis_lines");
    /* Blank lines do not count. */
    snprintf(text, sizeof text, "%s\n\n\n\n%s", rep("so...", "\n", 3), rep("done.", "\n", 7));
    assert_string_equal(verdict(&o, text), "keep");
}

static void test_alpha_words(void **state) {
    rf_quality_opts o = none();
    o.min_alpha_word_frac = 0.8;
    assert_string_equal(verdict(&o, "a b c d 42"), "keep"); /* 4/5 */
    assert_string_equal(verdict(&o, "a b c 42 !!"), "alpha_words");
    /* Letters of any script count. */
    assert_string_equal(
        verdict(&o, "\xE6\x97\xA5\xE6\x9C\xAC \xCE\xB1\xCE\xB2 5\xE2\x82\xAC x2 ok"), "keep");
}

static void test_stop_words(void **state) {
    rf_quality_opts o = none();
    o.min_stop_words = 2;
    assert_string_equal(verdict(&o, "cat on mat with hat"), "stop_words");
    assert_string_equal(verdict(&o, "The cat and the hat"), "keep");
}

static void test_dup_lines(void **state) {
    rf_quality_opts o = none();
    o.max_dup_line_frac = 0.3;
    char text[1024];
    /* 10 lines, 3 of which repeat an earlier line. */
    snprintf(text, sizeof text, "%s\nl1\nl2\nl3\nl4\nl5\nl6", rep("same line", "\n", 4));
    assert_string_equal(verdict(&o, text), "keep");
    snprintf(text, sizeof text, "%s\nl1\nl2\nl3\nl4\nl5", rep("same line", "\n", 5));
    assert_string_equal(verdict(&o, text), "dup_lines");
    o = none();
    o.max_dup_line_char_frac = 0.2;
    /* 100 chars, 20 in duplicate lines ("0123456789" twice repeated). */
    snprintf(text, sizeof text, "0123456789\n0123456789\n0123456789\n%s", rep("abcdefghij", "", 7));
    assert_string_equal(verdict(&o, text), "keep");
    snprintf(text, sizeof text, "0123456789\n0123456789\n0123456789\n%s", rep("abcdefghij", "", 6));
    assert_string_equal(verdict(&o, text), "dup_line_chars");
}

static void test_top_ngram(void **state) {
    rf_quality_opts o = none();
    o.max_top_ngram_frac[0] = 0.2;
    /* "aa bb" twice = 8 of 40 word chars: 0.2, kept; a third occurrence of a
     * 2-gram of the same size in 42 chars is 12/42 > 0.2. */
    assert_string_equal(verdict(&o, "aa bb aa bb cccc dddd eeee ffff gggg hhhh iiii jjjj"), "keep");
    assert_string_equal(verdict(&o, "aa bb aa bb aa bb dddd eeee ffff gggg hhhh iiii jjjj"),
                        "top_ngram");
    /* A 2-gram that occurs once is not repetition: two words pass. */
    assert_string_equal(verdict(&o, "Great product"), "keep");
    o = none();
    o.max_top_ngram_frac[2] = 0.16; /* 4-grams */
    assert_string_equal(verdict(&o, "a b c d a b c d xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
                        "keep");
    assert_string_equal(verdict(&o, "a b c d a b c d xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
                        "top_ngram");
}

static void test_dup_ngram(void **state) {
    rf_quality_opts o = none();
    o.max_dup_ngram_frac[0] = 0.15; /* 5-grams */
    /* "a b c d e" repeated once: 5 duplicated chars of 10 + N. */
    assert_string_equal(verdict(&o, "a b c d e a b c d e xxxxxxxxxxxxxxxxxxxxxxxxx"),
                        "keep"); /* 5/35 */
    assert_string_equal(verdict(&o, "a b c d e a b c d e xxxxxxxxxxxxxxxxxxxxxxx"),
                        "dup_ngram"); /* 5/33 */
}

static void test_line_rules_fineweb(void **state) {
    rf_quality_opts o = none();
    o.min_terminal_punct_line_frac = 0.5;
    assert_string_equal(verdict(&o, "One.\nTwo!\nthree\nfour"), "keep");
    assert_string_equal(verdict(&o, "One.\nthree\nfour"), "terminal_punct");
    o = none();
    o.max_short_line_frac = 0.5;
    const char *long_line = "this line is certainly longer than thirty characters";
    char text[512];
    snprintf(text, sizeof text, "short\n%s", long_line);
    assert_string_equal(verdict(&o, text), "keep");
    snprintf(text, sizeof text, "short\nshort too\n%s", long_line);
    assert_string_equal(verdict(&o, text), "short_lines");
}

static void test_presets(void **state) {
    rf_quality_opts g, d;
    rf_quality_opts_gopher(&g);
    rf_quality_opts_default(&d);
    assert_int_equal(g.min_words, 50);
    assert_true(g.max_top_ngram_frac[0] == 0.20 && g.max_dup_ngram_frac[5] == 0.10);
    /* Short reviews: kept by the project defaults, rejected by Gopher's. */
    const char *short_ok[] = {"Great!",
                              "5 stars",
                              "Works...",
                              "Love it, smells great.",
                              "- works as described",
                              "it 's a charming and often affecting journey ."};
    for (size_t i = 0; i < sizeof short_ok / sizeof short_ok[0]; i++) {
        assert_string_equal(verdict(&d, short_ok[i]), "keep");
        assert_string_not_equal(verdict(&g, short_ok[i]), "keep");
    }
    /* Garbage is still rejected by the defaults. */
    assert_string_equal(verdict(&d, ""), "too_few_words");
    assert_string_equal(verdict(&d, "#### #### ####"), "symbol_ratio");
    assert_string_equal(verdict(&d, "!!!! ???? 1234 5678 ...."), "alpha_words");
    assert_string_equal(verdict(&d, rep("buy now", " ", 30)), "top_ngram");
    /* ...but rhetorical repetition in one sentence is kept (SST-2). */
    assert_string_equal(verdict(&d, "low , very low , very very low"), "keep");
    assert_string_equal(verdict(&g, "low , very low , very very low"), "too_few_words");
    assert_string_equal(verdict(&d, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
                        "mean_word_len_high");
}

static void test_from_cfg(void **state) {
    const char *yaml =
        "quality:\n  preset: gopher\n  min_words: 3\n  max_top_ngram_frac: [0.3, 0.25, 0.2]\n"
        "  max_dup_ngram_frac: 0.5\n";
    rf_cfg *root;
    assert_int_equal(rf_cfg_load_string(yaml, strlen(yaml), "t.yaml", &root), 0);
    rf_quality_opts o;
    rf_quality_opts_default(&o);
    assert_int_equal(rf_quality_opts_from_cfg(rf_cfg_get(root, "quality"), &o), 0);
    assert_int_equal(o.min_words, 3);
    assert_true(o.min_mean_word_len == 3); /* from the gopher preset */
    assert_true(o.max_top_ngram_frac[1] == 0.25);
    for (size_t i = 0; i < 6; i++)
        assert_true(o.max_dup_ngram_frac[i] == 0.5);
    rf_cfg_free(root);
    const char *bad[] = {"quality:\n  min_word: 3\n",
                         "quality:\n  max_top_ngram_frac: [0.1, 0.2]\n",
                         "quality:\n  min_alpha_word_frac: 2\n", "quality:\n  preset: c4\n"};
    const char *named[] = {"min_word", "max_top_ngram_frac", "min_alpha_word_frac", "preset"};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(rf_cfg_load_string(bad[i], strlen(bad[i]), "t.yaml", &root), 0);
        assert_int_equal(rf_quality_opts_from_cfg(rf_cfg_get(root, "quality"), &o), RF_ERR_INVALID);
        if (!strstr(rf_errmsg(), named[i]))
            fail_msg("'%s' does not name %s", rf_errmsg(), named[i]);
        rf_cfg_free(root);
    }
}

/* Long documents take the heap paths (more than 256 words, big tables). */
static void test_long_document(void **state) {
    static const char *const VOCAB[] = {
        "the",    "and",     "of",      "to",      "with",   "river",   "stone",  "garden",
        "window", "quiet",   "morning", "travel",  "silver", "market",  "letter", "winter",
        "orange", "bridge",  "paper",   "forest",  "candle", "ladder",  "pocket", "summer",
        "violin", "meadow",  "harbor",  "lantern", "pebble", "thunder", "velvet", "canyon",
        "marble", "feather", "compass", "island",  "saddle", "timber",  "anchor", "basket",
        "copper", "dragon",  "fabric",  "glacier", "hammer", "jungle",  "kettle", "lemon",
        "mirror", "needle"};
    rf_buf b = RF_BUF_INIT;
    uint64_t x = 7;
    /* 5000 lines of 10 words drawn at random: long, varied, well-formed. */
    for (int i = 0; i < 5000; i++) {
        for (int k = 0; k < 10; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            rf_buf_printf(&b, "%s%s", k ? " " : "", VOCAB[(x >> 33) % 50]);
        }
        rf_buf_puts(&b, ".\n");
    }
    rf_quality_opts o;
    rf_quality_opts_gopher(&o);
    const char *reason;
    assert_int_equal(rf_quality_check(&o, b.data, b.len, &reason), 0);
    assert_null(reason);
    rf_buf_reset(&b);
    for (int i = 0; i < 5000; i++)
        rf_buf_puts(&b, "the same sentence is repeated and repeated here.\n");
    assert_int_equal(rf_quality_check(&o, b.data, b.len, &reason), 0);
    assert_string_equal(reason, "dup_lines");
    /* 50 MB of one-letter words: rejected by the word count without holding
     * 25 million words (ASan would report the allocation otherwise). */
    rf_buf_reset(&b);
    assert_int_equal(rf_buf_reserve(&b, 50u << 20), 0);
    for (size_t i = 0; i < (50u << 20); i += 2)
        memcpy(b.data + i, "a ", 2);
    b.len = 50u << 20;
    assert_int_equal(rf_quality_check(&o, b.data, b.len, &reason), 0);
    assert_string_equal(reason, "too_many_words");
    rf_buf_free(&b);
}

/* SST-2 sentences are all real English: the defaults keep nearly all of them
 * (the few rejects are printed), while Gopher's web rules drop most. */
static void test_defaults_on_sst2(void **state) {
    const char *shared = getenv("SHARED");
    if (!shared) fail_msg("SHARED is not set: run through tests/run.sh (needs ../shared/data)");
    char path[4096];
    snprintf(path, sizeof path, "%s/data/sst2/train.tsv", shared);
    FILE *fp = fopen(path, "rb");
    if (!fp) fail_msg("cannot open %s (shared data missing?)", path);
    rf_quality_opts d, g;
    rf_quality_opts_default(&d);
    rf_quality_opts_gopher(&g);
    char *line = NULL;
    size_t cap = 0, n = 0, kept_d = 0, kept_g = 0;
    ssize_t len;
    assert_true(getline(&line, &cap, fp) > 0); /* header */
    while ((len = getline(&line, &cap, fp)) > 0) {
        char *tab = memchr(line, '\t', (size_t)len);
        assert_non_null(tab);
        const char *r;
        assert_int_equal(rf_quality_check(&d, line, (size_t)(tab - line), &r), 0);
        if (!r)
            kept_d++;
        else if (n - kept_d < 10)
            print_message("default rejects (%s): %.*s\n", r, (int)(tab - line), line);
        assert_int_equal(rf_quality_check(&g, line, (size_t)(tab - line), &r), 0);
        kept_g += r == NULL;
        n++;
    }
    free(line);
    fclose(fp);
    print_message("sst2 train: %zu sentences, defaults keep %zu, gopher keeps %zu\n", n, kept_d,
                  kept_g);
    assert_int_equal(n, 67349);
    assert_true(kept_d >= n - n / 1000); /* at least 99.9% */
    assert_true(kept_g < n / 10);
}

/* The repetition rules written plainly (quadratic, string comparisons), to
 * check the hashed, pruned sweep of filter.c against. */
typedef struct rword {
    const char *s;
    size_t len, chars;
} rword;

static bool same_gram(const rword *w, size_t a, size_t b, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (w[a + k].len != w[b + k].len || memcmp(w[a + k].s, w[b + k].s, w[a + k].len) != 0)
            return false;
    return true;
}

static size_t gram_chars(const rword *w, size_t i, size_t n) {
    size_t c = 0;
    for (size_t k = 0; k < n; k++)
        c += w[i + k].chars;
    return c;
}

static const char *reference_ngrams(const rf_quality_opts *o, const rword *w, size_t nw) {
    size_t total = 0;
    for (size_t i = 0; i < nw; i++)
        total += w[i].chars;
    if (nw < 2 || total == 0) return NULL;
    for (size_t n = 2; n <= 4 && n <= nw; n++) {
        size_t best = 0;
        for (size_t i = 0; i + n <= nw; i++) {
            size_t count = 0;
            for (size_t j = 0; j + n <= nw; j++)
                count += same_gram(w, i, j, n);
            if (count >= 2 && count * gram_chars(w, i, n) > best)
                best = count * gram_chars(w, i, n);
        }
        if ((double)best / (double)total > o->max_top_ngram_frac[n - 2]) return "top_ngram";
    }
    for (size_t n = 5; n <= 10 && n <= nw; n++) {
        size_t seen[4096], nseen = 0, dup = 0;
        for (size_t i = 0; i + n <= nw;) {
            bool found = false;
            for (size_t k = 0; k < nseen && !found; k++)
                found = same_gram(w, seen[k], i, n);
            if (found) {
                dup += gram_chars(w, i, n);
                i += n;
            } else {
                assert_true(nseen < 4096);
                seen[nseen++] = i;
                i++;
            }
        }
        if ((double)dup / (double)total > o->max_dup_ngram_frac[n - 5]) return "dup_ngram";
    }
    return NULL;
}

/* Every line of WikiText-2 valid, with only the repetition rules on at three
 * threshold scales: same verdict as the plain reference. */
static void test_ngrams_match_reference(void **state) {
    const char *shared = getenv("SHARED");
    if (!shared) fail_msg("SHARED is not set: run through tests/run.sh (needs ../shared/data)");
    char path[4096];
    snprintf(path, sizeof path, "%s/data/wikitext2/wiki.valid.raw", shared);
    FILE *fp = fopen(path, "rb");
    if (!fp) fail_msg("cannot open %s (shared data missing?)", path);
    static rword w[4096];
    char *line = NULL;
    size_t cap = 0, lines = 0, rejects[3] = {0};
    ssize_t len;
    const double scale[3] = {0.3, 1, 2};
    rf_quality_scratch *scratch = rf_quality_scratch_new();
    assert_non_null(scratch);
    while ((len = getline(&line, &cap, fp)) > 0) {
        size_t nw = 0;
        for (size_t i = 0; i < (size_t)len && nw < 4096;) {
            while (i < (size_t)len && (line[i] == ' ' || (line[i] >= '\t' && line[i] <= '\r')))
                i++;
            size_t start = i, chars = 0;
            for (; i < (size_t)len && !(line[i] == ' ' || (line[i] >= '\t' && line[i] <= '\r'));
                 i++)
                chars += ((unsigned char)line[i] & 0xC0) != 0x80;
            if (i > start) w[nw++] = (rword){line + start, i - start, chars};
        }
        for (size_t k = 0; k < 3; k++) {
            rf_quality_opts o = none();
            rf_quality_opts g;
            rf_quality_opts_gopher(&g);
            for (size_t i = 0; i < 3; i++)
                o.max_top_ngram_frac[i] = g.max_top_ngram_frac[i] * scale[k];
            for (size_t i = 0; i < 6; i++)
                o.max_dup_ngram_frac[i] = g.max_dup_ngram_frac[i] * scale[k];
            const char *got, *want = reference_ngrams(&o, w, nw);
            assert_int_equal(rf_quality_check(&o, line, (size_t)len, &got), 0);
            if ((got == NULL) != (want == NULL) || (got && strcmp(got, want) != 0))
                fail_msg("line %zu, scale %.1f: got %s, reference %s", lines + 1, scale[k],
                         got ? got : "keep", want ? want : "keep");
            /* Scratch memory reused across lines of every length: same answer. */
            const char *again;
            assert_int_equal(rf_quality_check_with(&o, scratch, line, (size_t)len, &again), 0);
            if (again != got) fail_msg("line %zu: scratch changed the result", lines + 1);
            rejects[k] += got != NULL;
        }
        lines++;
    }
    rf_quality_scratch_free(scratch);
    free(line);
    fclose(fp);
    print_message("wikitext valid: %zu lines, rejected %zu / %zu / %zu\n", lines, rejects[0],
                  rejects[1], rejects[2]);
    assert_true(rejects[0] > 100 && rejects[2] > 10);
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Throughput of cleaning and of cleaning + quality filters (project defaults),
 * one document per line of SST-2 train and the musical-instrument CSV, in CPU
 * seconds so that a busy machine does not distort it. Printed, not asserted:
 * the figure depends on the machine (and on ASan). */
static void test_throughput_real_data(void **state) {
    const char *shared = getenv("SHARED");
    if (!shared) fail_msg("SHARED is not set: run through tests/run.sh (needs ../shared/data)");
    const char *files[] = {"data/sst2/train.tsv",
                           "data/amazon/Musical_instruments_reviews.PARTIAL.csv"};
    rf_buf all = RF_BUF_INIT, out = RF_BUF_INIT;
    for (size_t f = 0; f < 2; f++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", shared, files[f]);
        FILE *fp = fopen(path, "rb");
        if (!fp) fail_msg("cannot open %s (shared data missing?)", path);
        char chunk[65536];
        size_t got;
        while ((got = fread(chunk, 1, sizeof chunk, fp)) > 0)
            rf_buf_append(&all, chunk, got);
        fclose(fp);
    }
    rf_clean_opts co;
    rf_clean_opts_default(&co);
    rf_quality_opts qo;
    rf_quality_opts_default(&qo);
    for (int with_quality = 0; with_quality < 2; with_quality++) {
        double t0 = cpu_seconds();
        size_t docs = 0, kept = 0;
        for (const char *p = all.data, *end = all.data + all.len; p < end; docs++) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            if (!nl) nl = end;
            rf_clean_result res;
            assert_int_equal(rf_clean_text(&co, p, (size_t)(nl - p), &out, &res), 0);
            const char *reason = res.reject;
            if (!reason && with_quality)
                assert_int_equal(rf_quality_check(&qo, out.data, out.len, &reason), 0);
            kept += reason == NULL;
            p = nl + 1;
        }
        double dt = cpu_seconds() - t0;
        print_message("%-16s %zu docs (%zu kept), %.1f MB: %.0f MB/s, %.0f docs/s per core\n",
                      with_quality ? "clean+quality" : "clean", docs, kept, (double)all.len / 1e6,
                      (double)all.len / 1e6 / dt, (double)docs / dt);
    }
    rf_buf_free(&all);
    rf_buf_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_off_keeps_anything),
        cmocka_unit_test(test_word_count),
        cmocka_unit_test(test_mean_word_len),
        cmocka_unit_test(test_symbol_ratio),
        cmocka_unit_test(test_bullet_and_ellipsis_lines),
        cmocka_unit_test(test_alpha_words),
        cmocka_unit_test(test_stop_words),
        cmocka_unit_test(test_dup_lines),
        cmocka_unit_test(test_top_ngram),
        cmocka_unit_test(test_dup_ngram),
        cmocka_unit_test(test_line_rules_fineweb),
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_from_cfg),
        cmocka_unit_test(test_long_document),
        cmocka_unit_test(test_defaults_on_sst2),
        cmocka_unit_test(test_ngrams_match_reference),
        cmocka_unit_test(test_throughput_real_data),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
