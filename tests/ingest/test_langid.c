/* Language identification (CLD2) and the consistency policy: reject only a
 * reliable detection of another language. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/error.h"
#include "ingest/langid.h"

static const char *EN =
    "I bought this shampoo for my wife and she loves it. It smells wonderful, leaves her hair "
    "soft and shiny, and a single bottle lasts for months. We will definitely order it again.";
static const char *DE =
    "Ich habe dieses Shampoo für meine Frau gekauft und sie liebt es. Es riecht wunderbar, "
    "macht die Haare weich und glänzend, und eine Flasche reicht monatelang. Wir bestellen "
    "es bestimmt wieder.";
static const char *JA =
    "妻のためにこのシャンプーを買いましたが、とても気に入っています。香りがとても良く、"
    "髪がやわらかくつややかになり、一本で何か月も持ちます。またきっと注文します。";

static void detect(const char *text, rf_langid_result *r) {
    assert_int_equal(rf_langid_detect(text, strlen(text), r), 0);
}

static void test_detect(void **state) {
    rf_langid_result r;
    detect(EN, &r);
    assert_string_equal(r.code, "en");
    assert_true(r.reliable);
    assert_true(r.percent >= 90);
    detect(DE, &r);
    assert_string_equal(r.code, "de");
    assert_true(r.reliable);
    detect(JA, &r);
    assert_string_equal(r.code, "ja");
    assert_true(r.reliable);
}

static void test_short_text_unreliable(void **state) {
    rf_langid_result r;
    detect("Sehr gut", &r);
    assert_false(r.reliable);
    assert_string_equal(r.code, "un");
    detect("Love it", &r);
    assert_false(r.reliable);
    detect("", &r);
    assert_false(r.reliable);
}

static void test_invalid_utf8(void **state) {
    rf_langid_result r;
    /* Valid UTF-8 that CLD2's own check refuses (noncharacter U+FDEB) is fine. */
    assert_int_equal(rf_langid_detect("caf\xEF\xB7\xAB ok", 9, &r), 0);
    assert_int_equal(rf_langid_detect("abc \xFF\xFE def", 10, &r), RF_ERR_INVALID);
}

static void test_policy(void **state) {
    rf_langid_opts o;
    rf_langid_opts_default(&o);
    const char *reason = "unset";
    rf_langid_result r;
    /* Off by default: nothing detected, nothing rejected. */
    assert_int_equal(rf_langid_check(&o, DE, strlen(DE), &reason, &r), 0);
    assert_null(reason);
    assert_string_equal(r.code, "");

    o.n_expected = 1;
    strcpy(o.expected[0], "en");
    assert_int_equal(rf_langid_check(&o, EN, strlen(EN), &reason, &r), 0);
    assert_null(reason);
    assert_int_equal(rf_langid_check(&o, DE, strlen(DE), &reason, &r), 0);
    assert_string_equal(reason, "wrong_language");
    assert_string_equal(r.code, "de");
    assert_int_equal(rf_langid_check(&o, JA, strlen(JA), &reason, NULL), 0);
    assert_string_equal(reason, "wrong_language");
    /* Two words: CLD2 is not reliable, so the text is kept... */
    o.min_bytes = 0;
    assert_int_equal(rf_langid_check(&o, "Sehr gut", 8, &reason, &r), 0);
    assert_null(reason);
    assert_false(r.reliable);
    /* ...and this reliable misdetection of English is kept by the length floor. */
    const char *phrase = "hopelessly juvenile";
    assert_int_equal(rf_langid_check(&o, phrase, strlen(phrase), &reason, &r), 0);
    assert_true(r.reliable);
    assert_string_not_equal(r.code, "en");
    assert_string_equal(reason, "wrong_language");
    rf_langid_opts_default(&o);
    o.n_expected = 1;
    strcpy(o.expected[0], "en");
    assert_int_equal(rf_langid_check(&o, phrase, strlen(phrase), &reason, &r), 0);
    assert_null(reason);
    /* A second expected language. */
    o.n_expected = 2;
    strcpy(o.expected[1], "de");
    assert_int_equal(rf_langid_check(&o, DE, strlen(DE), &reason, NULL), 0);
    assert_null(reason);
    /* min_percent above what the text reaches keeps it. */
    o.n_expected = 1;
    o.min_percent = 100;
    char mixed[1024];
    strcpy(mixed, DE);
    strcat(mixed, " ");
    strcat(mixed, EN);
    assert_int_equal(rf_langid_check(&o, mixed, strlen(mixed), &reason, &r), 0);
    assert_true(r.percent < 100);
    assert_null(reason);
}

static void test_from_cfg(void **state) {
    const char *yaml = "language:\n  expected: [en, de]\n  min_percent: 70\n  min_bytes: 10\n";
    rf_cfg *root;
    assert_int_equal(rf_cfg_load_string(yaml, strlen(yaml), "t.yaml", &root), 0);
    rf_langid_opts o;
    rf_langid_opts_default(&o);
    assert_int_equal(rf_langid_opts_from_cfg(rf_cfg_get(root, "language"), &o), 0);
    assert_int_equal(o.n_expected, 2);
    assert_string_equal(o.expected[1], "de");
    assert_int_equal(o.min_percent, 70);
    assert_int_equal(o.min_bytes, 10);
    rf_cfg_free(root);
    const char *one = "language:\n  expected: en\n";
    assert_int_equal(rf_cfg_load_string(one, strlen(one), "t.yaml", &root), 0);
    assert_int_equal(rf_langid_opts_from_cfg(rf_cfg_get(root, "language"), &o), 0);
    assert_int_equal(o.n_expected, 1);
    rf_cfg_free(root);
    const char *bad = "language:\n  expect: en\n";
    assert_int_equal(rf_cfg_load_string(bad, strlen(bad), "t.yaml", &root), 0);
    assert_int_equal(rf_langid_opts_from_cfg(rf_cfg_get(root, "language"), &o), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "expect"));
    rf_cfg_free(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),       cmocka_unit_test(test_short_text_unreliable),
        cmocka_unit_test(test_invalid_utf8), cmocka_unit_test(test_policy),
        cmocka_unit_test(test_from_cfg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
