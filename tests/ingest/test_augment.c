/* EDA augmentation: WordNet loading and lookups, each operation doing what it
 * says, determinism under a seed, and options from YAML. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "ingest/augment.h"

static rf_augmenter *load(double sr, double ri, double rs, double rd) {
    rf_augment_opts o;
    rf_augment_opts_default(&o);
    o.alpha_sr = sr;
    o.alpha_ri = ri;
    o.alpha_rs = rs;
    o.alpha_rd = rd;
    rf_augmenter *a = NULL;
    int rc = rf_augmenter_new(&o, &a);
    if (rc) fail_msg("rf_augmenter_new: %s (needs Debian wordnet-base)", rf_errmsg());
    return a;
}

static const char *TEXT = "The shampoo smells wonderful and my hair feels soft, thick and healthy.";

/* Splits s into words (static storage, up to 64 of 64 chars). */
static size_t split(const char *s, char words[64][64]) {
    size_t n = 0;
    while (*s && n < 64) {
        while (*s == ' ')
            s++;
        if (!*s) break;
        size_t k = 0;
        while (s[k] && s[k] != ' ' && k < 63)
            k++;
        memcpy(words[n], s, k);
        words[n++][k] = '\0';
        s += k;
    }
    return n;
}

static bool contains(char words[64][64], size_t n, const char *w) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(words[i], w) == 0) return true;
    return false;
}

static void test_wordnet(void **state) {
    rf_augmenter *a = load(0.1, 0.1, 0.1, 0.1);
    size_t count;
    const char *const *s = rf_augmenter_synonyms(a, "happy", 5, &count);
    assert_non_null(s);
    assert_int_equal(count, 3); /* felicitous, glad, well chosen (WordNet 3.0) */
    assert_string_equal(s[0], "felicitous");
    assert_string_equal(s[1], "glad");
    assert_string_equal(s[2], "well chosen");
    assert_null(s[3]);
    /* Sorted, without the word itself, only a-z and spaces. */
    s = rf_augmenter_synonyms(a, "car", 3, &count);
    assert_true(count >= 4);
    for (size_t i = 0; i < count; i++) {
        assert_string_not_equal(s[i], "car");
        if (i) assert_true(strcmp(s[i - 1], s[i]) < 0);
        assert_int_equal(strspn(s[i], "abcdefghijklmnopqrstuvwxyz "), strlen(s[i]));
    }
    /* Inflected forms through morphy: exception list and suffix rules. */
    assert_non_null(rf_augmenter_synonyms(a, "geese", 5, NULL));  /* goose */
    assert_non_null(rf_augmenter_synonyms(a, "smells", 6, NULL)); /* smell */
    assert_null(rf_augmenter_synonyms(a, "qzxv", 4, NULL));
    rf_augmenter_free(a);
}

static void test_missing_wordnet(void **state) {
    rf_augment_opts o;
    rf_augment_opts_default(&o);
    o.wordnet_dir = "/nonexistent/wordnet";
    rf_augmenter *a = (rf_augmenter *)&o;
    assert_int_equal(rf_augmenter_new(&o, &a), RF_ERR_NOT_FOUND);
    assert_null(a);
    assert_non_null(strstr(rf_errmsg(), "/nonexistent/wordnet"));
}

/* A two-synset WordNet in a temporary directory; index.noun's second line is
 * given so tests can corrupt it. */
static void write_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int load_mini(const char *index_line, rf_augmenter **a, char *dir) {
    strcpy(dir, "/tmp/rf_wordnet_XXXXXX");
    assert_non_null(mkdtemp(dir));
    static const char *const EMPTY[] = {"data.verb", "data.adj",  "data.adv", "index.verb",
                                        "index.adj", "index.adv", "noun.exc", "verb.exc",
                                        "adj.exc",   "adv.exc"};
    for (size_t i = 0; i < sizeof EMPTY / sizeof EMPTY[0]; i++)
        write_file(dir, EMPTY[i], "");
    write_file(dir, "data.noun",
               "  1 licence header line\n"
               "00000024 05 n 02 big_cat 0 Lion 0 000 | a large cat\n"
               "00000078 05 n 02 car 0 auto 0 000 | a motor vehicle\n");
    char index[256];
    snprintf(index, sizeof index, "lion n 1 0 1 0 00000024\n%s\n", index_line);
    write_file(dir, "index.noun", index);
    rf_augment_opts o;
    rf_augment_opts_default(&o);
    o.wordnet_dir = dir;
    return rf_augmenter_new(&o, a);
}

static void remove_mini(const char *dir) {
    static const char *const ALL[] = {"data.noun",  "data.verb",  "data.adj",  "data.adv",
                                      "index.noun", "index.verb", "index.adj", "index.adv",
                                      "noun.exc",   "verb.exc",   "adj.exc",   "adv.exc"};
    char path[512];
    for (size_t i = 0; i < sizeof ALL / sizeof ALL[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, ALL[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void test_wordnet_parser(void **state) {
    char dir[64];
    rf_augmenter *a = NULL;
    /* Valid: synonyms come from the synset, lowercased, '_' as space. */
    assert_int_equal(load_mini("car n 1 1 @ 1 0 00000078", &a, dir), 0);
    size_t count;
    const char *const *s = rf_augmenter_synonyms(a, "lion", 4, &count);
    assert_non_null(s);
    assert_int_equal(count, 1); /* "Lion" lowercases to the word itself: dropped */
    assert_string_equal(s[0], "big cat");
    assert_null(s[1]);
    s = rf_augmenter_synonyms(a, "car", 3, &count);
    assert_int_equal(count, 1);
    assert_string_equal(s[0], "auto");
    rf_augmenter_free(a);
    remove_mini(dir);
    /* An offset that names no synset, a bad count, a truncated line. */
    const char *bad[] = {"car n 1 0 1 0 00000099", "car n x 0 1 0 00000078",
                         "car n 2 0 1 0 00000078"};
    for (size_t i = 0; i < 3; i++) {
        a = (rf_augmenter *)dir;
        assert_int_equal(load_mini(bad[i], &a, dir), RF_ERR_CORRUPT);
        assert_null(a);
        if (!strstr(rf_errmsg(), "index.noun line 2"))
            fail_msg("'%s' should name index.noun line 2", rf_errmsg());
        remove_mini(dir);
    }
}

static void run(const rf_augmenter *a, uint64_t seed, rf_buf *outs, size_t n) {
    assert_int_equal(rf_augment(a, TEXT, strlen(TEXT), seed, outs, n), 0);
}

static void free_outs(rf_buf *outs, size_t n) {
    for (size_t i = 0; i < n; i++)
        rf_buf_free(&outs[i]);
}

static void test_deterministic(void **state) {
    rf_augmenter *a = load(0.1, 0.1, 0.1, 0.1);
    rf_buf x[8] = {0}, y[8] = {0}, z[8] = {0};
    uint64_t s1 = rf_augment_seed(42, "doc-1", 5), s2 = rf_augment_seed(42, "doc-2", 5);
    assert_true(s1 != s2);
    assert_true(s1 == rf_augment_seed(42, "doc-1", 5));
    assert_true(s1 != rf_augment_seed(43, "doc-1", 5));
    run(a, s1, x, 8);
    run(a, s1, y, 8);
    run(a, s2, z, 8);
    size_t differ = 0, changed = 0;
    for (size_t i = 0; i < 8; i++) {
        assert_string_equal(x[i].data, y[i].data);
        differ += strcmp(x[i].data, z[i].data) != 0;
        changed += strcmp(x[i].data, TEXT) != 0;
    }
    assert_true(differ >= 4);
    assert_true(changed >= 6);
    free_outs(x, 8);
    free_outs(y, 8);
    free_outs(z, 8);
    rf_augmenter_free(a);
}

/* Synonym replacement: same number of tokens; every changed word is a WordNet
 * synonym of the original and not a stop word; punctuation stays attached. */
static void test_synonym_replacement(void **state) {
    rf_augmenter *a = load(0.3, 0, 0, 0);
    char orig[64][64], got[64][64];
    size_t n = split(TEXT, orig);
    for (uint64_t seed = 1; seed <= 20; seed++) {
        rf_buf out = RF_BUF_INIT;
        assert_int_equal(rf_augment(a, TEXT, strlen(TEXT), seed, &out, 1), 0);
        assert_string_not_equal(out.data, TEXT);
        /* Multi-word synonyms add tokens; compare via the first and last word. */
        size_t m = split(out.data, got);
        assert_true(m >= n);
        assert_true(strcmp(got[m - 1], "healthy.") == 0 || strchr(got[m - 1], '.') != NULL);
        assert_true(contains(got, m, "and") && contains(got, m, "my")); /* stop words stay */
        rf_buf_free(&out);
    }
    rf_augmenter_free(a);
}

/* One replacement (k = max(1, 0.1 * 9)): the output is the text with every
 * occurrence of one content word replaced by one of its WordNet synonyms. */
static void test_sr_replaces_all_occurrences(void **state) {
    rf_augmenter *a = load(0.1, 0, 0, 0);
    const char *text = "the hair is soft and the hair is clean";
    const char *content[] = {"hair", "soft", "clean"};
    for (uint64_t seed = 1; seed <= 10; seed++) {
        rf_buf out = RF_BUF_INIT;
        assert_int_equal(rf_augment(a, text, strlen(text), seed, &out, 1), 0);
        bool matched = false;
        for (size_t c = 0; c < 3 && !matched; c++) {
            size_t count;
            const char *const *syn =
                rf_augmenter_synonyms(a, content[c], strlen(content[c]), &count);
            assert_non_null(syn);
            for (size_t k = 0; k < count && !matched; k++) {
                char want[256] = "", words[64][64];
                size_t n = split(text, words);
                for (size_t i = 0; i < n; i++) {
                    if (i) strcat(want, " ");
                    strcat(want, strcmp(words[i], content[c]) == 0 ? syn[k] : words[i]);
                }
                matched = strcmp(want, out.data) == 0;
            }
        }
        if (!matched)
            fail_msg("seed %llu: '%s' is not a one-word synonym replacement",
                     (unsigned long long)seed, out.data);
        rf_buf_free(&out);
    }
    rf_augmenter_free(a);
}

static void test_sr_single_word_synonym(void **state) {
    rf_augmenter *a = load(0.5, 0, 0, 0);
    rf_buf out = RF_BUF_INIT;
    /* "happy" is the only content word; its synonyms are known exactly. The
     * capital and the '!' survive. */
    assert_int_equal(rf_augment(a, "Happy!", 6, 7, &out, 1), 0);
    assert_true(strcmp(out.data, "Felicitous!") == 0 || strcmp(out.data, "Glad!") == 0 ||
                strcmp(out.data, "Well chosen!") == 0);
    rf_buf_free(&out);
    rf_augmenter_free(a);
}

static void test_random_insertion(void **state) {
    rf_augmenter *a = load(0, 0.2, 0, 0);
    char orig[64][64], got[64][64];
    size_t n = split(TEXT, orig);
    rf_buf out = RF_BUF_INIT;
    assert_int_equal(rf_augment(a, TEXT, strlen(TEXT), 3, &out, 1), 0);
    size_t m = split(out.data, got);
    assert_true(m >= n + 2); /* k = max(1, 0.2 * 12) = 2 insertions (maybe multi-word) */
    /* The original words appear in order as a subsequence. */
    size_t j = 0;
    for (size_t i = 0; i < m && j < n; i++)
        if (strcmp(got[i], orig[j]) == 0) j++;
    assert_int_equal(j, n);
    rf_buf_free(&out);
    rf_augmenter_free(a);
}

static void test_random_swap(void **state) {
    rf_augmenter *a = load(0, 0, 0.2, 0);
    char orig[64][64], got[64][64];
    size_t n = split(TEXT, orig);
    rf_buf out = RF_BUF_INIT;
    assert_int_equal(rf_augment(a, TEXT, strlen(TEXT), 5, &out, 1), 0);
    assert_string_not_equal(out.data, TEXT);
    size_t m = split(out.data, got);
    assert_int_equal(m, n);
    /* Same multiset of words. */
    for (size_t i = 0; i < n; i++) {
        size_t in_orig = 0, in_got = 0;
        for (size_t k = 0; k < n; k++) {
            in_orig += strcmp(orig[k], orig[i]) == 0;
            in_got += strcmp(got[k], orig[i]) == 0;
        }
        assert_int_equal(in_orig, in_got);
    }
    rf_buf_free(&out);
    rf_augmenter_free(a);
}

static void test_random_deletion(void **state) {
    rf_augmenter *a = load(0, 0, 0, 0.3);
    char orig[64][64], got[64][64];
    size_t n = split(TEXT, orig), shorter = 0;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        rf_buf out = RF_BUF_INIT;
        assert_int_equal(rf_augment(a, TEXT, strlen(TEXT), seed, &out, 1), 0);
        size_t m = split(out.data, got), j = 0;
        assert_true(m >= 1 && m <= n);
        shorter += m < n;
        for (size_t i = 0; i < n && j < m; i++) /* a subsequence of the original */
            if (strcmp(got[j], orig[i]) == 0) j++;
        assert_int_equal(j, m);
        rf_buf_free(&out);
    }
    assert_true(shorter >= 15);
    /* A single word is never deleted. */
    rf_buf out = RF_BUF_INIT;
    assert_int_equal(rf_augment(a, "Great", 5, 1, &out, 1), 0);
    assert_string_equal(out.data, "Great");
    rf_buf_free(&out);
    rf_augmenter_free(a);
}

static void test_ops_cycle_and_empty(void **state) {
    rf_augmenter *a = load(0, 0, 0.5, 0.5); /* only swap and delete */
    rf_buf outs[4] = {0};
    char orig[64][64], got[64][64];
    size_t n = split(TEXT, orig);
    run(a, 11, outs, 4);
    /* Copies alternate swap (same length), delete (shorter). */
    assert_int_equal(split(outs[0].data, got), n);
    assert_true(split(outs[1].data, got) < n);
    assert_int_equal(split(outs[2].data, got), n);
    assert_true(split(outs[3].data, got) < n);
    free_outs(outs, 4);
    /* Empty text gives empty copies. */
    assert_int_equal(rf_augment(a, "", 0, 1, outs, 2), 0);
    assert_int_equal(outs[0].len, 0);
    assert_int_equal(outs[1].len, 0);
    free_outs(outs, 2);
    rf_augmenter_free(a);
}

static void test_from_cfg(void **state) {
    const char *yaml = "augment:\n  enabled: true\n  n_aug: 8\n  alpha_rd: 0.2\n  seed: 99\n";
    rf_cfg *root;
    assert_int_equal(rf_cfg_load_string(yaml, strlen(yaml), "t.yaml", &root), 0);
    rf_augment_opts o;
    rf_augment_opts_default(&o);
    assert_false(o.enabled);
    assert_int_equal(rf_augment_opts_from_cfg(rf_cfg_get(root, "augment"), &o), 0);
    assert_true(o.enabled);
    assert_int_equal(o.n_aug, 8);
    assert_true(o.alpha_rd == 0.2 && o.alpha_sr == 0.1);
    assert_int_equal(o.seed, 99);
    rf_cfg_free(root);
    const char *bad = "augment:\n  alpha_sr: 1.5\n";
    assert_int_equal(rf_cfg_load_string(bad, strlen(bad), "t.yaml", &root), 0);
    assert_int_equal(rf_augment_opts_from_cfg(rf_cfg_get(root, "augment"), &o), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "alpha_sr"));
    rf_cfg_free(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wordnet),
        cmocka_unit_test(test_missing_wordnet),
        cmocka_unit_test(test_wordnet_parser),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_synonym_replacement),
        cmocka_unit_test(test_sr_replaces_all_occurrences),
        cmocka_unit_test(test_sr_single_word_synonym),
        cmocka_unit_test(test_random_insertion),
        cmocka_unit_test(test_random_swap),
        cmocka_unit_test(test_random_deletion),
        cmocka_unit_test(test_ops_cycle_and_empty),
        cmocka_unit_test(test_from_cfg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
