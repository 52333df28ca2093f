#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/config.h"
#include "common/error.h"

static const char spec[] = "run:\n"
                           "  name: demo\n"
                           "ingest:\n"
                           "  threads: 2\n"
                           "  inputs: [a.json, b.csv]\n"
                           "  lowercase: yes\n"
                           "  ratio: 0.25\n"
                           "  format: csv\n";

static rf_cfg *load(void) {
    rf_cfg *c = NULL;
    assert_int_equal(rf_cfg_load_string(spec, sizeof spec - 1, "spec.yaml", &c), 0);
    return c;
}

static void test_typed_getters(void **state) {
    rf_cfg *c = load();
    const rf_cfg *ing = rf_cfg_get(c, "ingest");
    int64_t threads;
    assert_int_equal(rf_cfg_int(ing, "threads", 1, 1, 64, &threads), 0);
    assert_int_equal(threads, 2);
    int64_t dflt;
    assert_int_equal(rf_cfg_int(ing, "absent", 7, 1, 64, &dflt), 0);
    assert_int_equal(dflt, 7);
    bool lc;
    assert_int_equal(rf_cfg_bool(ing, "lowercase", false, &lc), 0);
    assert_true(lc);
    double ratio;
    assert_int_equal(rf_cfg_real(ing, "ratio", 0, 0, 1, &ratio), 0);
    assert_true(ratio == 0.25);
    const char **inputs;
    size_t n;
    assert_int_equal(rf_cfg_strlist(ing, "inputs", &inputs, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(inputs[1], "b.csv");
    free(inputs);
    static const char *const formats[] = {"jsonl", "csv", "tsv", NULL};
    int fmt;
    assert_int_equal(rf_cfg_enum(ing, "format", formats, 0, &fmt), 0);
    assert_int_equal(fmt, 1);
    const char *name;
    assert_int_equal(rf_cfg_str(c, "run.name", NULL, &name), 0);
    assert_string_equal(name, "demo");
    rf_cfg_free(c);
}

static void test_errors_name_the_key_and_line(void **state) {
    rf_cfg *c = load();
    int64_t v;
    assert_int_equal(rf_cfg_int(c, "ingest.threads", 1, 4, 64, &v), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "spec.yaml:4: ingest.threads"));
    bool b;
    assert_int_equal(rf_cfg_bool(c, "ingest.format", false, &b), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "ingest.format"));
    static const char *const allowed[] = {"threads", "inputs", "lowercase",
                                          "ratio",   "fromat", NULL};
    assert_int_equal(rf_cfg_check_keys(rf_cfg_get(c, "ingest"), allowed), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "unknown key 'ingest.format'"));
    assert_non_null(strstr(rf_errmsg(), "did you mean 'fromat'"));
    rf_cfg_free(c);
}

static void test_env_override(void **state) {
    rf_cfg *c = load();
    setenv("REFINERY__INGEST__THREADS", "8", 1);
    setenv("REFINERY__DEDUP__BANDS", "14", 1);
    assert_int_equal(rf_cfg_apply_env(c), 0);
    unsetenv("REFINERY__INGEST__THREADS");
    unsetenv("REFINERY__DEDUP__BANDS");
    int64_t v;
    assert_int_equal(rf_cfg_int(c, "ingest.threads", 1, 1, 64, &v), 0);
    assert_int_equal(v, 8);
    assert_int_equal(rf_cfg_int(c, "dedup.bands", 1, 1, 64, &v), 0);
    assert_int_equal(v, 14);
    /* Overriding a mapping with a scalar is refused. */
    assert_int_equal(rf_cfg_set(c, "ingest", "x"), RF_ERR_INVALID);
    rf_cfg_free(c);
}

static void test_bad_yaml(void **state) {
    rf_cfg *c = NULL;
    const char bad[] = "ingest:\n  threads: [1, 2\n";
    assert_int_equal(rf_cfg_load_string(bad, sizeof bad - 1, "bad.yaml", &c), RF_ERR_PARSE);
    assert_non_null(strstr(rf_errmsg(), "bad.yaml:"));
    const char dup[] = "a: 1\na: 2\n";
    assert_int_equal(rf_cfg_load_string(dup, sizeof dup - 1, "dup.yaml", &c), RF_ERR_PARSE);
    assert_non_null(strstr(rf_errmsg(), "duplicate key"));
    const char list[] = "- a\n- b\n";
    assert_int_equal(rf_cfg_load_string(list, sizeof list - 1, "l.yaml", &c), RF_ERR_PARSE);
    assert_int_equal(rf_cfg_load_file("/nonexistent.yaml", &c), RF_ERR_NOT_FOUND);
}

static void test_fail_can_prefix_its_own_message(void **state) {
    rf_fail(RF_ERR_PARSE, "inner %d", 42);
    assert_int_equal(rf_fail(RF_ERR_INVALID, "outer: %s (%s)", rf_errmsg(), "x"), RF_ERR_INVALID);
    assert_string_equal(rf_errmsg(), "outer: inner 42 (x)");
    assert_int_equal(rf_fail_ctx(RF_ERR_IO, "reading %s", "a.json"), RF_ERR_IO);
    assert_string_equal(rf_errmsg(), "reading a.json: outer: inner 42 (x)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_typed_getters),
        cmocka_unit_test(test_errors_name_the_key_and_line),
        cmocka_unit_test(test_env_override),
        cmocka_unit_test(test_bad_yaml),
        cmocka_unit_test(test_fail_can_prefix_its_own_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
