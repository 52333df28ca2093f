/* The run report (services/report/report.h) on a synthetic run directory:
 * escaping of every data string, the sections' numbers, and notes for the
 * files that are missing. The browser test is tests/pipeline/report.test.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/buf.h"
#include "common/sys.h"
#include "report/report.h"

static char dir[64];

static void put_file(const char *rel, const char *text) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    char *slash = strrchr(p, '/');
    *slash = 0;
    assert_int_equal(rf_mkdir_p(p), 0);
    *slash = '/';
    assert_int_equal(rf_write_file_atomic(p, text, strlen(text)), 0);
}

static int setup(void **state) {
    snprintf(dir, sizeof dir, "/tmp/rf-report-test.XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static void test_escape(void **state) {
    rf_buf b = RF_BUF_INIT;
    const char s[] = "a<b>&\"'\0z";
    assert_int_equal(rf_html_escape(&b, s, sizeof s - 1), 0);
    assert_string_equal(b.data, "a&lt;b&gt;&amp;&quot;&#39;\xEF\xBF\xBDz");
    rf_buf_free(&b);
}

static char *build(void) {
    rf_buf b = RF_BUF_INIT;
    assert_int_equal(rf_report_build(dir, &b), 0);
    return rf_buf_steal(&b);
}

static void test_sections(void **state) {
    put_file("stats.json", "{\"ingest\":{\"records_in\":10,\"kept\":7,\"rejected\":{\"bad<x>\":3},"
                           "\"cached\":true,\"key\":\"k&1\",\"attempts\":2,\"seconds\":0.5},"
                           "\"dedup\":{\"kept\":6,\"exact\":1,\"near\":0,\"clusters\":6,"
                           "\"cluster_size\":{\"2\":1,\"1\":5}},\"run\":{\"ok\":1,\"seconds\":3}}");
    put_file("spec.yaml", "run:\n  name: <b>x</b>\n");
    put_file(
        "ingest/rejects.jsonl",
        "{\"source\":\"s.jsonl\",\"line\":4,\"reason\":\"bad<x>\",\"excerpt\":\"<img src=x>\"}\n"
        "not json\n");
    put_file("ingest/docs.jsonl", "{\"id\":\"d1\",\"text\":\"kept & well\"}\n"
                                  "{\"id\":\"d2\",\"text\":\"kept & well\"}\n");
    put_file("dedup/dups.jsonl", "{\"id\":\"d2\",\"kept_id\":\"d1\",\"kind\":\"exact\"}\n");
    put_file("trainer/metrics.jsonl", "{\"step\":1,\"loss\":0.7,\"lr\":1e-4,\"grad_norm\":2}\n"
                                      "{\"step\":2,\"loss\":0.5,\"lr\":5e-5,\"grad_norm\":1}\n");
    put_file("evaluator/report.json",
             "{\"examples\":4,\"accuracy\":0.75,\"macro\":{\"f1\":0.7},\"confusion\":[[1,1],[0,2]],"
             "\"per_class\":[{\"class\":0,\"precision\":1,\"recall\":0.5,\"f1\":0.667,"
             "\"support\":2}]}");
    put_file("evaluator/predictions.jsonl",
             "{\"text\":\"fine\",\"label\":1,\"pred\":1,\"probs\":[0.2,0.8]}\n"
             "{\"text\":\"<i>worst</i>\",\"label\":0,\"pred\":1,\"probs\":[0.1,0.9]}\n");
    char *h = build();
    /* data strings are escaped wherever they appear */
    assert_null(strstr(h, "<img"));
    assert_null(strstr(h, "<b>x</b>"));
    assert_null(strstr(h, "<i>worst"));
    assert_non_null(strstr(h, "&lt;img src=x&gt;"));
    assert_non_null(strstr(h, "name: &lt;b&gt;x&lt;/b&gt;"));
    assert_non_null(strstr(h, "ingest: bad&lt;x&gt;"));
    /* cache decisions */
    assert_non_null(
        strstr(h, "<td>ingest</td><td>yes</td><td class=\"mono\">k&amp;1</td><td>2</td>"));
    /* the duplicate example carries both texts, looked up in docs.jsonl */
    assert_non_null(strstr(h, "d2 <q>kept &amp; well</q>"));
    /* the worst-classified example comes first: p(true) 0.1 */
    char *worst = strstr(h, "<td>0.1000</td>"), *fine = strstr(h, "<td>0.8000</td>");
    assert_true(worst && fine && worst < fine);
    /* charts */
    static const char *const charts[] = {"funnel", "rejects",   "clusters",  "loss",
                                         "lr",     "grad-norm", "confusion", "stage-seconds"};
    for (size_t i = 0; i < sizeof charts / sizeof charts[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "data-chart=\"%s\"", charts[i]);
        assert_non_null(strstr(h, want));
    }
    /* clusters sorted by size: "size 1" before "size 2" */
    assert_true(strstr(h, ">size 1<") < strstr(h, ">size 2<"));
    /* no token shards: a note instead of the histograms */
    assert_non_null(strstr(h, "No token shards"));
    assert_null(strstr(h, "<script"));
    free(h);
}

static void test_empty_dir(void **state) {
    char *h = build(); /* nothing at all: every section says what is missing */
    assert_non_null(strstr(h, "stats.json is missing"));
    assert_non_null(strstr(h, "No trainer/metrics.jsonl"));
    assert_non_null(strstr(h, "No evaluator/report.json"));
    assert_non_null(strstr(h, "</html>"));
    free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape),
        cmocka_unit_test_setup_teardown(test_sections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_dir, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
