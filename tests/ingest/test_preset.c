/* Presets and the `ingest:` section: what each preset sets, explicit keys
 * winning over it, comma-separated lists, and errors naming the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "common/config.h"
#include "common/error.h"
#include "ingest/ingest.h"
#include "ingest/preset.h"

static rf_cfg *load(const char *yaml) {
    rf_cfg *root = NULL;
    assert_int_equal(rf_cfg_load_string(yaml, strlen(yaml), "test.yaml", &root), 0);
    return root;
}

static int opts_from(const char *yaml, rf_ingest_opts *o, rf_cfg **root) {
    *root = load(yaml);
    rf_ingest_opts_default(o);
    return rf_ingest_opts_from_cfg(rf_cfg_get(*root, "ingest"), o);
}

static void test_amazon(void **state) {
    rf_ingest_opts o;
    rf_ingest_opts_default(&o);
    assert_int_equal(rf_ingest_preset_apply(&o, "amazon"), 0);
    assert_int_equal(o.format, RF_FORMAT_AUTO);
    assert_int_equal(o.n_text_fields, 2);
    assert_string_equal(o.text_fields[0], "summary");
    assert_string_equal(o.text_fields[1], "reviewText");
    assert_string_equal(o.label_field, "overall");
    assert_false(o.header);
    assert_int_equal(o.n_columns, 9);
    assert_string_equal(o.columns[4], "reviewText");
    assert_string_equal(o.columns[5], "overall");
    int32_t label;
    assert_null(rf_label_apply(&o.label_map, 2.0, &label));
    assert_int_equal(label, 0);
    assert_null(rf_label_apply(&o.label_map, 3.0, &label));
    assert_int_equal(label, 1);
}

static void test_sst2_and_wikitext(void **state) {
    rf_ingest_opts o;
    rf_ingest_opts_default(&o);
    assert_int_equal(rf_ingest_preset_apply(&o, "sst2"), 0);
    assert_int_equal(o.format, RF_FORMAT_TSV);
    assert_true(o.header);
    assert_int_equal(o.quote, -1);
    assert_string_equal(o.text_fields[0], "sentence");
    assert_string_equal(o.label_field, "label");
    assert_int_equal(o.label_map.n, 0);

    rf_ingest_opts_default(&o);
    assert_int_equal(rf_ingest_preset_apply(&o, "wikitext"), 0);
    assert_int_equal(o.format, RF_FORMAT_TEXT);
    assert_true(o.skip_headings);
    assert_false(o.paragraphs);
    assert_null(o.label_field);

    assert_int_equal(rf_ingest_preset_apply(&o, "imdb"), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "amazon, sst2, wikitext or sft"));
}

static void test_keys_override_preset(void **state) {
    rf_ingest_opts o;
    rf_cfg *root;
    assert_int_equal(opts_from("ingest:\n"
                               "  preset: amazon\n"
                               "  text_fields: reviewText\n"
                               "  label_map: '1-3:0,4-5:1'\n"
                               "  id_field: reviewerID\n"
                               "  threads: 3\n"
                               "  quality_filter: false\n"
                               "  clean: {lowercase: true}\n",
                               &o, &root),
                     0);
    assert_int_equal(o.n_text_fields, 1);
    assert_string_equal(o.text_fields[0], "reviewText");
    assert_string_equal(o.label_field, "overall"); /* from the preset */
    assert_string_equal(o.id_field, "reviewerID");
    int32_t label;
    assert_null(rf_label_apply(&o.label_map, 3.0, &label));
    assert_int_equal(label, 0);
    assert_int_equal(o.threads, 3);
    assert_false(o.quality_enabled);
    assert_true(o.clean.lowercase);
    rf_ingest_opts_free(&o);
    rf_cfg_free(root);
}

static void test_lists_and_clearing(void **state) {
    rf_ingest_opts o;
    rf_cfg *root;
    assert_int_equal(opts_from("ingest:\n"
                               "  preset: amazon\n"
                               "  columns: a,b,c\n"
                               "  text_fields: [title, body]\n"
                               "  label_field: none\n"
                               "  label_map: none\n"
                               "  format: csv\n"
                               "  quote: none\n",
                               &o, &root),
                     0);
    assert_int_equal(o.n_columns, 3);
    assert_string_equal(o.columns[2], "c");
    assert_int_equal(o.n_text_fields, 2);
    assert_string_equal(o.text_fields[1], "body");
    assert_null(o.label_field);
    assert_int_equal(o.label_map.n, 0);
    assert_int_equal(o.format, RF_FORMAT_CSV);
    assert_int_equal(o.quote, -1);
    rf_ingest_opts_free(&o);
    rf_cfg_free(root);
}

static void expect_error(const char *yaml, const char *needle) {
    rf_ingest_opts o;
    rf_cfg *root;
    assert_int_not_equal(opts_from(yaml, &o, &root), 0);
    if (!strstr(rf_errmsg(), needle)) fail_msg("'%s' not in '%s'", needle, rf_errmsg());
    rf_ingest_opts_free(&o);
    rf_cfg_free(root);
}

static void test_errors_name_the_key(void **state) {
    expect_error("ingest:\n  threads: many\n", "ingest.threads");
    expect_error("ingest:\n  format: xml\n", "ingest.format");
    expect_error("ingest:\n  preset: imdb\n", "ingest.preset");
    expect_error("ingest:\n  label_map: '1-2'\n", "ingest.label_map");
    expect_error("ingest:\n  quote: '<>'\n", "ingest.quote");
    expect_error("ingest:\n  text_feilds: x\n", "text_feilds");
    expect_error("ingest:\n  clean: {nfkd: true}\n", "nfkd");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amazon),
        cmocka_unit_test(test_sst2_and_wikitext),
        cmocka_unit_test(test_keys_override_preset),
        cmocka_unit_test(test_lists_and_clearing),
        cmocka_unit_test(test_errors_name_the_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
