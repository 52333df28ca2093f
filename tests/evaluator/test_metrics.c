/* Metrics against values worked out by hand (they equal scikit-learn's
 * precision_recall_fscore_support with zero_division=0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/buf.h"
#include "common/json.h"
#include "evaluator/metrics.h"

static void test_three_classes(void **state) {
    int truth[] = {0, 0, 0, 1, 1, 2}, pred[] = {0, 1, 0, 1, 2, 2};
    rf_metrics m;
    assert_int_equal(rf_metrics_init(&m, 3), 0);
    for (int i = 0; i < 6; i++)
        rf_metrics_add(&m, truth[i], pred[i], 0.5 * i);
    assert_float_equal(rf_metrics_accuracy(&m), 4.0 / 6, 1e-12);
    assert_float_equal(rf_metrics_loss(&m), 7.5 / 6, 1e-12);
    rf_class_scores c0 = rf_metrics_class(&m, 0), c1 = rf_metrics_class(&m, 1),
                    c2 = rf_metrics_class(&m, 2), mac = rf_metrics_macro(&m);
    assert_float_equal(c0.precision, 1.0, 1e-12);
    assert_float_equal(c0.recall, 2.0 / 3, 1e-12);
    assert_float_equal(c0.f1, 0.8, 1e-12);
    assert_float_equal(c1.f1, 0.5, 1e-12);
    assert_float_equal(c2.precision, 0.5, 1e-12);
    assert_float_equal(c2.recall, 1.0, 1e-12);
    assert_int_equal(c0.support, 3);
    assert_float_equal(mac.precision, 2.0 / 3, 1e-12);
    assert_float_equal(mac.recall, (2.0 / 3 + 0.5 + 1.0) / 3, 1e-12);
    assert_float_equal(mac.f1, (0.8 + 0.5 + 2.0 / 3) / 3, 1e-12);

    rf_buf b = RF_BUF_INIT;
    assert_int_equal(rf_metrics_to_json(&m, &b), 0);
    rf_json_doc *d = rf_json_doc_new();
    const rf_json *root;
    assert_int_equal(rf_json_parse(d, b.data, b.len, &root), 0);
    const rf_json *conf = rf_json_get(root, "confusion");
    assert_non_null(conf);
    assert_int_equal(conf->len, 3);
    int64_t v;
    assert_int_equal(rf_json_int64(&conf->u.items[0].u.items[1], &v), 0);
    assert_int_equal(v, 1); /* one true 0 predicted as 1 */
    assert_float_equal(rf_json_get(rf_json_get(root, "macro"), "f1")->num, mac.f1, 1e-6);
    rf_json_doc_free(d);
    rf_buf_free(&b);
    rf_metrics_free(&m);
}

/* A class never predicted has precision 0 (not NaN), F1 0. */
static void test_never_predicted(void **state) {
    rf_metrics m;
    assert_int_equal(rf_metrics_init(&m, 2), 0);
    for (int i = 0; i < 5; i++)
        rf_metrics_add(&m, i < 4 ? 0 : 1, 0, 0);
    rf_class_scores c1 = rf_metrics_class(&m, 1);
    assert_true(c1.precision == 0 && c1.recall == 0 && c1.f1 == 0);
    assert_int_equal(c1.support, 1);
    assert_float_equal(rf_metrics_accuracy(&m), 0.8, 1e-12);
    rf_metrics_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_three_classes),
                                       cmocka_unit_test(test_never_predicted)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
