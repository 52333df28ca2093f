/* services/runtime options: flag > environment > default, types, errors that
 * name the option, --help; the Kafka property list splitter. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/error.h"
#include "runtime/svc.h"

typedef struct vals {
    const char *listen, *tls;
    int64_t workers;
    double grace;
    bool verbose;
} vals;

static int parse(vals *v, int argc, char **argv) {
    const rf_opt opts[] = {
        {"listen", "TEST_SVC_LISTEN", RF_OPT_STR, &v->listen, "127.0.0.1:1", "address"},
        {"tls", "TEST_SVC_TLS", RF_OPT_STR, &v->tls, NULL, "cert"},
        {"workers", "TEST_SVC_WORKERS", RF_OPT_INT, &v->workers, "4", "workers"},
        {"grace", "TEST_SVC_GRACE", RF_OPT_REAL, &v->grace, "30", "grace"},
        {"verbose", "TEST_SVC_VERBOSE", RF_OPT_BOOL, &v->verbose, "false", "verbose"},
    };
    return rf_svc_parse("t", "test", opts, sizeof opts / sizeof opts[0], argc, argv);
}

static void test_precedence(void **state) {
    vals v;
    char *none[] = {"t"};
    unsetenv("TEST_SVC_WORKERS");
    assert_int_equal(parse(&v, 1, none), 0);
    assert_string_equal(v.listen, "127.0.0.1:1");
    assert_null(v.tls);
    assert_int_equal(v.workers, 4);
    assert_true(v.grace == 30.0);
    assert_false(v.verbose);

    setenv("TEST_SVC_WORKERS", "8", 1);
    setenv("TEST_SVC_VERBOSE", "yes", 1);
    assert_int_equal(parse(&v, 1, none), 0);
    assert_int_equal(v.workers, 8);
    assert_true(v.verbose);

    char *flags[] = {"t", "--workers=16", "--listen", "0.0.0.0:9", "--grace", "1.5", "--verbose"};
    setenv("TEST_SVC_VERBOSE", "false", 1);
    assert_int_equal(parse(&v, 7, flags), 0);
    assert_int_equal(v.workers, 16); /* flag beats environment */
    assert_string_equal(v.listen, "0.0.0.0:9");
    assert_true(v.grace == 1.5);
    assert_true(v.verbose);
    unsetenv("TEST_SVC_WORKERS");
    unsetenv("TEST_SVC_VERBOSE");
}

static void test_errors(void **state) {
    vals v;
    char *bad_int[] = {"t", "--workers", "many"};
    assert_int_equal(parse(&v, 3, bad_int), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "--workers"));
    setenv("TEST_SVC_GRACE", "soon", 1);
    char *none[] = {"t"};
    assert_int_equal(parse(&v, 1, none), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "TEST_SVC_GRACE"));
    unsetenv("TEST_SVC_GRACE");
    char *unknown[] = {"t", "--wokers=3"};
    assert_int_equal(parse(&v, 2, unknown), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "--wokers"));
    char *missing[] = {"t", "--listen"};
    assert_int_equal(parse(&v, 2, missing), RF_ERR_INVALID);
    char *stray[] = {"t", "extra"};
    assert_int_equal(parse(&v, 2, stray), RF_ERR_INVALID);
    char *help[] = {"t", "--help"};
    assert_int_equal(parse(&v, 2, help), 1);
}

static void test_split_props(void **state) {
    char *storage;
    const char **kv;
    assert_int_equal(
        rf_svc_split_props("security.protocol=ssl;ssl.ca.location=/a=b", &storage, &kv), 0);
    assert_string_equal(kv[0], "security.protocol");
    assert_string_equal(kv[1], "ssl");
    assert_string_equal(kv[2], "ssl.ca.location");
    assert_string_equal(kv[3], "/a=b");
    assert_null(kv[4]);
    free(kv);
    free(storage);
    assert_int_equal(rf_svc_split_props(NULL, &storage, &kv), 0);
    assert_null(kv[0]);
    free(kv);
    free(storage);
    assert_int_equal(rf_svc_split_props("a=1;oops", &storage, &kv), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "oops"));
    assert_null(kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_split_props),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
