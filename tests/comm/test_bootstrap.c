/* The TCP bootstrap (comm/bootstrap.h) with real forked processes on
 * 127.0.0.1: every client gets rank 0's 128-byte blob, late clients and a late
 * server still meet, a stale or foreign client is refused and times out
 * saying why, and nothing waits past its deadline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "comm/bootstrap.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"

#define BLOB 128

/* Exit codes of a client process. */
enum { CHILD_OK = 0, CHILD_WRONG_BLOB = 10, CHILD_FAILED = 11, CHILD_WRONG_ERROR = 12 };

static void blob_for(unsigned char *b, uint32_t seed) {
    for (int i = 0; i < BLOB; i++)
        b[i] = (unsigned char)(seed * 2654435761u >> (i % 24)) ^ (unsigned char)i;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Forks a client that waits `delay` seconds, fetches, and exits CHILD_OK when
 * it got the blob of `seed`, or, when `want_error` is set, when the fetch
 * failed with a detail containing every string of want_error. */
static pid_t client(int port, rf_boot_opts o, double delay, uint32_t seed,
                    const char *const *want_error) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid > 0) return pid;
    sleep_s(delay);
    unsigned char got[BLOB] = {0}, want[BLOB];
    blob_for(want, seed);
    int rc = rf_boot_fetch("127.0.0.1", port, &o, got, BLOB);
    if (want_error) {
        if (rc == RF_OK) _exit(CHILD_WRONG_ERROR);
        for (; *want_error; want_error++)
            if (!strstr(rf_errmsg(), *want_error)) {
                fprintf(stderr, "child: '%s' lacks '%s'\n", rf_errmsg(), *want_error);
                _exit(CHILD_WRONG_ERROR);
            }
        _exit(CHILD_OK);
    }
    if (rc != RF_OK) {
        fprintf(stderr, "child rank %d: %s\n", o.rank, rf_errmsg());
        _exit(CHILD_FAILED);
    }
    _exit(memcmp(got, want, BLOB) == 0 ? CHILD_OK : CHILD_WRONG_BLOB);
}

static int exit_code(pid_t pid) {
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static rf_boot_opts opts(const char *run, uint32_t attempt, int rank, int world, double t) {
    return (rf_boot_opts){.run_id = run,
                          .attempt = attempt,
                          .rank = rank,
                          .world = world,
                          .timeout_s = t,
                          .io_timeout_s = 1,
                          .backoff_max_s = 0.2};
}

static int serve(rf_boot_server *s, rf_boot_opts o, const unsigned char *blob) {
    return rf_boot_serve(s, &o, blob, BLOB);
}

/* A port nobody listens on now (another process could take it, unlikely). */
static int free_port(void) {
    rf_boot_server *s;
    assert_int_equal(rf_boot_listen("127.0.0.1", 0, &s), RF_OK);
    int port = rf_boot_server_port(s);
    rf_boot_server_close(s);
    return port;
}

static void test_every_rank_gets_the_blob(void **state) {
    enum { WORLD = 4 };
    rf_boot_server *s;
    assert_int_equal(rf_boot_listen("127.0.0.1", 0, &s), RF_OK);
    int port = rf_boot_server_port(s);
    assert_true(port > 0);
    pid_t kids[WORLD];
    for (int r = 1; r < WORLD; r++)
        kids[r] = client(port, opts("run-a", 0, r, WORLD, 10), 0, 77, NULL);
    unsigned char blob[BLOB];
    blob_for(blob, 77);
    assert_int_equal(serve(s, opts("run-a", 0, 0, WORLD, 10), blob), RF_OK);
    rf_boot_server_close(s);
    for (int r = 1; r < WORLD; r++)
        assert_int_equal(exit_code(kids[r]), CHILD_OK);
}

static void test_late_client_and_late_server(void **state) {
    unsigned char blob[BLOB];
    blob_for(blob, 5);
    /* A client that starts 1 s after rank 0 still gets the blob, and rank 0
     * waits for it. */
    rf_boot_server *s;
    assert_int_equal(rf_boot_listen("127.0.0.1", 0, &s), RF_OK);
    int port = rf_boot_server_port(s);
    pid_t early = client(port, opts("run-b", 1, 1, 3, 10), 0, 5, NULL);
    pid_t late = client(port, opts("run-b", 1, 2, 3, 10), 1.0, 5, NULL);
    double t0 = rf_now();
    assert_int_equal(serve(s, opts("run-b", 1, 0, 3, 10), blob), RF_OK);
    assert_true(rf_now() - t0 >= 0.9);
    rf_boot_server_close(s);
    assert_int_equal(exit_code(early), CHILD_OK);
    assert_int_equal(exit_code(late), CHILD_OK);

    /* Rank 0 coming up 1 s after its clients: they retry until it listens. */
    port = free_port();
    pid_t a = client(port, opts("run-b", 2, 1, 3, 10), 0, 6, NULL);
    pid_t b = client(port, opts("run-b", 2, 2, 3, 10), 0, 6, NULL);
    sleep_s(1.0);
    blob_for(blob, 6);
    assert_int_equal(rf_boot_listen("127.0.0.1", port, &s), RF_OK);
    assert_int_equal(serve(s, opts("run-b", 2, 0, 3, 10), blob), RF_OK);
    rf_boot_server_close(s);
    assert_int_equal(exit_code(a), CHILD_OK);
    assert_int_equal(exit_code(b), CHILD_OK);
}

static void test_stale_and_foreign_clients_are_refused(void **state) {
    unsigned char blob[BLOB];
    blob_for(blob, 9);
    rf_boot_server *s;
    assert_int_equal(rf_boot_listen("127.0.0.1", 0, &s), RF_OK);
    int port = rf_boot_server_port(s);
    /* Rank 0 of attempt 2 serves; a client of attempt 1 (a restarted group's
     * leftover), a client of another run and a client that believes in
     * another world size are all refused, keep trying, and give up at their
     * deadline saying why; the real rank 1 is served. */
    static const char *const stale[] = {"timeout:", "attempt 1", "stale or foreign", NULL};
    static const char *const foreign[] = {"timeout:", "run other", NULL};
    static const char *const world[] = {"timeout:", "world size differs", NULL};
    pid_t k1 = client(port, opts("run-c", 1, 1, 2, 1.5), 0, 9, stale);
    pid_t k2 = client(port, opts("other", 2, 1, 2, 1.5), 0, 9, foreign);
    pid_t k3 = client(port, opts("run-c", 2, 1, 3, 1.5), 0, 9, world);
    pid_t good = client(port, opts("run-c", 2, 1, 2, 10), 1.0, 9, NULL);
    assert_int_equal(serve(s, opts("run-c", 2, 0, 2, 10), blob), RF_OK);
    assert_int_equal(exit_code(good), CHILD_OK);
    /* The refused ones are still retrying while the server listens: keep it
     * open until they give up, so that the last answer they saw is a refusal. */
    int codes[3] = {exit_code(k1), exit_code(k2), exit_code(k3)};
    rf_boot_server_close(s);
    assert_int_equal(codes[0], CHILD_OK);
    assert_int_equal(codes[1], CHILD_OK);
    assert_int_equal(codes[2], CHILD_OK);
}

static void test_timeouts_are_bounded_and_clear(void **state) {
    unsigned char blob[BLOB] = {0};
    /* No rank 0 at all: the client gives up after its timeout. */
    int port = free_port();
    rf_boot_opts o = opts("run-d", 0, 1, 2, 0.6);
    double t0 = rf_now();
    assert_int_equal(rf_boot_fetch("127.0.0.1", port, &o, blob, BLOB), RF_ERR_IO);
    double took = rf_now() - t0;
    assert_true(took >= 0.55 && took < 2.0);
    assert_non_null(strstr(rf_errmsg(), "timeout:"));
    assert_non_null(strstr(rf_errmsg(), "refused"));
    assert_non_null(strstr(rf_errmsg(), "run-d"));

    /* A rank 0 that accepts nothing (listening, never serving): each try
     * times out on receive and the whole fetch within its deadline. */
    rf_boot_server *s;
    assert_int_equal(rf_boot_listen("127.0.0.1", 0, &s), RF_OK);
    o.io_timeout_s = 0.2;
    t0 = rf_now();
    assert_int_equal(rf_boot_fetch("127.0.0.1", rf_boot_server_port(s), &o, blob, BLOB), RF_ERR_IO);
    took = rf_now() - t0;
    assert_true(took >= 0.55 && took < 2.0);
    assert_non_null(strstr(rf_errmsg(), "timed out"));

    /* Rank 0 whose ranks never come names the missing ones. */
    rf_boot_opts so = opts("run-d", 0, 0, 3, 0.5);
    t0 = rf_now();
    assert_int_equal(rf_boot_serve(s, &so, blob, BLOB), RF_ERR_IO);
    assert_true(rf_now() - t0 < 2.0);
    assert_non_null(strstr(rf_errmsg(), "timeout:"));
    assert_non_null(strstr(rf_errmsg(), "missing: 1 2"));
    rf_boot_server_close(s);

    /* An unresolvable name is "not up yet" too, not an immediate failure. */
    o.timeout_s = 0.4;
    assert_int_equal(rf_boot_fetch("no-such-host.invalid", 1234, &o, blob, BLOB), RF_ERR_IO);
    assert_non_null(strstr(rf_errmsg(), "timeout:"));
    assert_non_null(strstr(rf_errmsg(), "resolve"));
}

static void test_bad_arguments(void **state) {
    unsigned char blob[BLOB];
    rf_boot_opts o = opts("x", 0, 0, 2, 1);
    assert_int_equal(rf_boot_fetch("127.0.0.1", 1234, &o, blob, BLOB), RF_ERR_INVALID);
    o.rank = 1;
    assert_int_equal(rf_boot_fetch("127.0.0.1", 0, &o, blob, BLOB), RF_ERR_INVALID);
    assert_int_equal(rf_boot_fetch("127.0.0.1", 1234, &o, blob, 0), RF_ERR_INVALID);
    o.rank = 2;
    assert_int_equal(rf_boot_fetch("127.0.0.1", 1234, &o, blob, BLOB), RF_ERR_INVALID);
    rf_boot_server *s;
    assert_int_equal(rf_boot_listen("127.0.0.1", 0, &s), RF_OK);
    o.rank = 1;
    assert_int_equal(rf_boot_serve(s, &o, blob, BLOB), RF_ERR_INVALID); /* only rank 0 serves */
    rf_boot_server_close(s);
    assert_int_equal(rf_boot_listen("127.0.0.1", 70000, &s), RF_ERR_INVALID);
}

int main(void) {
    rf_log_set_level(RF_LOG_ERROR); /* the refusals are expected here */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_rank_gets_the_blob),
        cmocka_unit_test(test_late_client_and_late_server),
        cmocka_unit_test(test_stale_and_foreign_clients_are_refused),
        cmocka_unit_test(test_timeouts_are_bounded_and_clear),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
