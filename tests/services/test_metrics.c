/* The metrics registry (common/prom.h), its text exposition, the HTTP request
 * line parser and the /metrics server (runtime/metrics_http.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/obs.h"
#include "common/prom.h"
#include "runtime/metrics_http.h"

static char *expose(rf_prom *r) {
    rf_buf b = RF_BUF_INIT;
    assert_int_equal(rf_prom_expose(r, &b), 0);
    return rf_buf_steal(&b);
}

static void test_counter_gauge_format(void **state) {
    rf_prom *r = rf_prom_new();
    rf_prom_family *c = rf_prom_family_get(r, RF_PROM_COUNTER, "refinery_x_total",
                                           "Things.\nSecond \\ line", "stage,reason", NULL, 0);
    rf_prom_family *g =
        rf_prom_family_get(r, RF_PROM_GAUGE, "refinery_g", "A gauge.", NULL, NULL, 0);
    assert_non_null(c);
    assert_non_null(g);
    rf_prom_add(c, 2, "ingest", "too \"short\"\n\\");
    rf_prom_add(c, 3, "ingest", "too \"short\"\n\\");
    rf_prom_add(c, -5, "ingest", "too \"short\"\n\\"); /* a counter never goes down */
    rf_prom_add(c, 1, "dedup", NULL);
    rf_prom_set(g, 0.1);
    rf_prom_set(g, -2.5);
    assert_true(rf_prom_value(c, "ingest", "too \"short\"\n\\") == 5);
    assert_true(rf_prom_value(c, "dedup", "") == 1);
    assert_true(rf_prom_value(c, "nope", "") == 0);
    char *out = expose(r);
    assert_string_equal(out,
                        "# HELP refinery_g A gauge.\n"
                        "# TYPE refinery_g gauge\n"
                        "refinery_g -2.5\n"
                        "# HELP refinery_metrics_dropped_series_total Metric updates dropped: "
                        "a family's series limit or no memory.\n"
                        "# TYPE refinery_metrics_dropped_series_total counter\n"
                        "refinery_metrics_dropped_series_total 0\n"
                        "# HELP refinery_x_total Things.\\nSecond \\\\ line\n"
                        "# TYPE refinery_x_total counter\n"
                        "refinery_x_total{stage=\"ingest\",reason=\"too \\\"short\\\"\\n\\\\\"} 5\n"
                        "refinery_x_total{stage=\"dedup\",reason=\"\"} 1\n");
    free(out);
    rf_prom_free(r);
}

static void test_histogram(void **state) {
    rf_prom *r = rf_prom_new();
    const double b[] = {0.1, 1, 10};
    rf_prom_family *h =
        rf_prom_family_get(r, RF_PROM_HISTOGRAM, "refinery_h_seconds", "Latency.", "m", b, 3);
    assert_non_null(h);
    rf_prom_observe(h, 0.05, "a");
    rf_prom_observe(h, 0.1, "a"); /* le is inclusive */
    rf_prom_observe(h, 5, "a");
    rf_prom_observe(h, 100, "a");
    assert_true(rf_prom_value(h, "a") == 4);
    char *out = expose(r);
    assert_non_null(strstr(out, "# TYPE refinery_h_seconds histogram\n"
                                "refinery_h_seconds_bucket{m=\"a\",le=\"0.1\"} 2\n"
                                "refinery_h_seconds_bucket{m=\"a\",le=\"1\"} 2\n"
                                "refinery_h_seconds_bucket{m=\"a\",le=\"10\"} 3\n"
                                "refinery_h_seconds_bucket{m=\"a\",le=\"+Inf\"} 4\n"
                                "refinery_h_seconds_sum{m=\"a\"} 105.15\n"
                                "refinery_h_seconds_count{m=\"a\"} 4\n"));
    free(out);
    rf_prom_free(r);
}

static void test_registration_rules(void **state) {
    rf_prom *r = rf_prom_new();
    rf_prom_family *a = rf_prom_family_get(r, RF_PROM_COUNTER, "a_total", "", "x", NULL, 0);
    assert_non_null(a);
    /* the same name and shape: the same family */
    assert_ptr_equal(rf_prom_family_get(r, RF_PROM_COUNTER, "a_total", "", "x", NULL, 0), a);
    /* another type or other labels: refused */
    assert_null(rf_prom_family_get(r, RF_PROM_GAUGE, "a_total", "", "x", NULL, 0));
    assert_null(rf_prom_family_get(r, RF_PROM_COUNTER, "a_total", "", "y", NULL, 0));
    /* bad names, bad labels, bad buckets */
    assert_null(rf_prom_family_get(r, RF_PROM_GAUGE, "9lives", "", NULL, NULL, 0));
    assert_null(rf_prom_family_get(r, RF_PROM_GAUGE, "has-dash", "", NULL, NULL, 0));
    assert_null(rf_prom_family_get(r, RF_PROM_GAUGE, "g", "", "ok,__reserved", NULL, 0));
    assert_null(rf_prom_family_get(r, RF_PROM_GAUGE, "g2", "", "a,b,c,d,e", NULL, 0));
    const double down[] = {1, 0.5};
    assert_null(rf_prom_family_get(r, RF_PROM_HISTOGRAM, "h", "", NULL, down, 2));
    const double one[] = {1};
    assert_null(rf_prom_family_get(r, RF_PROM_HISTOGRAM, "h2", "", "le", one, 1));
    /* updates on NULL and on the wrong type are ignored */
    rf_prom_add(NULL, 1);
    rf_prom_observe(a, 1, "v");
    rf_prom_set(a, 7, "v"); /* set on a counter mirrors an outside total */
    assert_true(rf_prom_value(a, "v") == 7);
    rf_prom_free(r);
}

static void test_series_limit(void **state) {
    rf_prom *r = rf_prom_new();
    rf_prom_family *c = rf_prom_family_get(r, RF_PROM_COUNTER, "c_total", "", "k", NULL, 0);
    char v[32];
    for (int i = 0; i < RF_PROM_MAX_SERIES + 10; i++) {
        snprintf(v, sizeof v, "%d", i);
        rf_prom_add(c, 1, v);
    }
    char *out = expose(r);
    assert_non_null(strstr(out, "refinery_metrics_dropped_series_total 10\n"));
    free(out);
    rf_prom_free(r);
}

typedef struct {
    rf_prom_family *c, *h;
} fams;

static void *hammer(void *arg) {
    fams *f = arg;
    for (int i = 0; i < 20000; i++) {
        rf_prom_add(f->c, 0.5, i % 2 ? "odd" : "even");
        rf_prom_observe(f->h, 0.001 * (i % 100));
    }
    return NULL;
}

static void test_threads(void **state) {
    rf_prom *r = rf_prom_new();
    fams f = {rf_prom_family_get(r, RF_PROM_COUNTER, "t_total", "", "p", NULL, 0),
              rf_prom_family_get(r, RF_PROM_HISTOGRAM, "t_seconds", "", NULL,
                                 rf_prom_latency_buckets, rf_prom_nlatency_buckets)};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, hammer, &f);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_true(rf_prom_value(f.c, "odd") == 4 * 10000 * 0.5);
    assert_true(rf_prom_value(f.c, "even") == 4 * 10000 * 0.5);
    assert_true(rf_prom_value(f.h) == 80000);
    rf_prom_free(r);
}

static void test_parse_request_line(void **state) {
    rf_http_request q;
    const char *ok = "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_int_equal(rf_http_parse_request_line(ok, strlen(ok), &q), 27);
    assert_string_equal(q.method, "GET");
    assert_string_equal(q.path, "/metrics");
    assert_int_equal(q.minor, 1);
    assert_int_equal(rf_http_parse_request_line("GET /m HTTP/1.0\n", 16, &q), 16);
    assert_int_equal(q.minor, 0);
    /* incomplete: more bytes needed */
    assert_int_equal(rf_http_parse_request_line("GET /metr", 9, &q), 0);
    /* malformed */
    const char *bad[] = {"get /metrics HTTP/1.1\r\n",         "GET metrics HTTP/1.1\r\n",
                         "GET /metrics HTTP/2.0\r\n",         "GET /metrics  HTTP/1.1\r\n",
                         "GET /me\x01trics HTTP/1.1\r\n",     "GET /metrics\r\n",
                         "VERYLONGMETHODNAME / HTTP/1.1\r\n", " / HTTP/1.1\r\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(rf_http_parse_request_line(bad[i], strlen(bad[i]), &q), -1);
    char longpath[400] = "GET /";
    memset(longpath + 5, 'a', 300);
    strcpy(longpath + 305, " HTTP/1.1\r\n");
    assert_int_equal(rf_http_parse_request_line(longpath, strlen(longpath), &q), -1);
}

/* Sends req to 127.0.0.1:port and returns the whole response (malloc'd). */
static char *http(int port, const char *req) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    rf_buf b = RF_BUF_INIT;
    char chunk[4096];
    ssize_t n;
    while ((n = recv(fd, chunk, sizeof chunk, 0)) > 0)
        rf_buf_append(&b, chunk, (size_t)n);
    close(fd);
    return b.data ? rf_buf_steal(&b) : strdup("");
}

static void test_http_server(void **state) {
    rf_prom *r = rf_prom_new();
    rf_prom_family *c = rf_prom_family_get(r, RF_PROM_COUNTER, "served_total", "S.", NULL, NULL, 0);
    rf_prom_add(c, 3);
    rf_metrics_http *h = NULL;
    assert_int_equal(rf_metrics_http_start("127.0.0.1:0", r, &h), 0);
    int port = rf_metrics_http_port(h);
    assert_true(port > 0);
    char *resp = http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_true(!strncmp(resp, "HTTP/1.1 200 OK\r\n", 17));
    assert_non_null(strstr(resp, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    assert_non_null(strstr(resp, "\r\n\r\n# HELP"));
    assert_non_null(strstr(resp, "\nserved_total 3\n"));
    free(resp);
    resp = http(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
    assert_true(!strncmp(resp, "HTTP/1.1 200 OK\r\n", 17));
    assert_null(strstr(resp, "served_total"));
    free(resp);
    resp = http(port, "GET / HTTP/1.1\r\n\r\n");
    assert_true(!strncmp(resp, "HTTP/1.1 404 ", 13));
    free(resp);
    resp = http(port, "POST /metrics HTTP/1.1\r\n\r\n");
    assert_true(!strncmp(resp, "HTTP/1.1 405 ", 13));
    free(resp);
    resp = http(port, "garbage\r\n\r\n");
    assert_true(!strncmp(resp, "HTTP/1.1 400 ", 13));
    free(resp);
    /* a busy port is an error that names the address */
    rf_metrics_http *h2 = NULL;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    assert_true(rf_metrics_http_start(addr, r, &h2) < 0);
    assert_null(h2);
    rf_metrics_http_stop(h);
    rf_prom_free(r);
}

/* The catalogue's families land in the default registry with their names. */
static void test_obs_names(void **state) {
    rf_obs_init("test");
    rf_obs_docs_in("dedup", 10);
    rf_obs_docs_rejected("ingest", "invalid_json", 2);
    rf_obs_grpc("/refinery.v1.Ingest/Push", "OK", 0.02);
    rf_obs_train_step_done(&(rf_obs_train_step){.loss = 0.5,
                                                .lr = 1e-4,
                                                .grad_norm = 1,
                                                .tokens = 100,
                                                .seconds = 0.5,
                                                .nparams = 1000,
                                                .layers = 2,
                                                .hidden = 8,
                                                .seq_len = 16});
    char *out = expose(rf_prom_default());
    assert_non_null(strstr(out, "refinery_documents_in_total{stage=\"dedup\"} 10\n"));
    assert_non_null(strstr(
        out, "refinery_documents_rejected_total{stage=\"ingest\",reason=\"invalid_json\"} 2\n"));
    assert_non_null(strstr(out, "refinery_grpc_server_handled_total{grpc_service=\"refinery.v1."
                                "Ingest\",grpc_method=\"Push\",grpc_code=\"OK\"} 1\n"));
    /* 200 tokens/s x (6 x 1000 + 12 x 2 x 8 x 16) = 200 x 9072 */
    assert_non_null(strstr(out, "refinery_trainer_model_flops 1814400\n"));
    assert_non_null(strstr(out, "refinery_service_info{service=\"test\"} 1\n"));
    assert_non_null(strstr(out, "# TYPE process_resident_memory_bytes gauge\n"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_gauge_format),
        cmocka_unit_test(test_histogram),
        cmocka_unit_test(test_registration_rules),
        cmocka_unit_test(test_series_limit),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_parse_request_line),
        cmocka_unit_test(test_http_server),
        cmocka_unit_test(test_obs_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
