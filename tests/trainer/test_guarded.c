/* The test device "cpu-guarded" (backend.h, backend_guarded.c): its buffers
 * are readable by its slots and by nothing else. The slots and the copies
 * work on them (the CPU's results); a host read and a host write of one, in
 * a child process, die of SIGSEGV with the handler's message naming the
 * buffer; a collective (world 1, the self backend) moves them, the others
 * staying closed while it is in flight, and they are closed again after it;
 * every slot of its table is a wrapper of the guard's; free refuses a pointer
 * it did not allocate.
 * guarded.test.sh and the *_staged tests train the models on it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "common/error.h"
#include "trainer/backend.h"

static const rf_backend *be;

static int setup(void **state) {
    (void)state;
    return rf_backend_for("cpu-guarded", &be);
}

/* Runs touch(p) in a child with stderr to a pipe; returns what it printed
 * and how it ended. */
static void in_child(void (*touch)(float *), float *p, int *status, char *err, size_t cap) {
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        /* cmocka's handler would carry on with the next test: the default
         * one, under the guard's (which an allocation installs) */
        signal(SIGSEGV, SIG_DFL);
        if (!rf_backend_alloc(be, 1)) _exit(3);
        touch(p);
        _exit(0); /* reached only when the access went through */
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd[0], err + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    err[n] = 0;
    close(fd[0]);
    assert_int_equal(waitpid(pid, status, 0), pid);
}

static volatile float sink;
static void host_read(float *p) {
    sink = p[3];
}
static void host_write(float *p) {
    p[5] = 1.0f;
}

static void test_slots_work_host_access_dies(void **state) {
    (void)state;
    float host[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        host[i] = (float)i;
    float *d = rf_backend_alloc(be, sizeof host);
    assert_non_null(d);
    assert_int_equal(be->to_device(be, d, host, sizeof host), RF_OK);
    assert_int_equal(be->scale(be, d, 1000, 0.5f), RF_OK);
    double ss = 0;
    assert_int_equal(be->sumsq(be, &ss, d, 1000), RF_OK);
    assert_int_equal(be->to_host(be, back, d, sizeof back), RF_OK);
    double want = 0;
    for (int i = 0; i < 1000; i++) {
        assert_true(back[i] == 0.5f * (float)i);
        want += (double)back[i] * back[i];
    }
    assert_true(ss == want);

    void (*touch[2])(float *) = {host_read, host_write};
    for (int k = 0; k < 2; k++) {
        int status;
        char err[4096];
        in_child(touch[k], d, &status, err, sizeof err);
        if (!WIFSIGNALED(status))
            fail_msg("host %s went through (status %d)", k ? "write" : "read", status);
        assert_int_equal(WTERMSIG(status), SIGSEGV);
        if (!strstr(err, "cpu-guarded: host code touched device memory") ||
            !strstr(err, "a buffer of 4000 bytes"))
            fail_msg("the handler's message is missing: %s", err);
        printf("host %s of a cpu-guarded buffer: SIGSEGV, \"%.*s\"\n", k ? "write" : "read",
               (int)strcspn(err, "\n"), err);
    }
    /* the parent's buffer is intact */
    assert_int_equal(be->to_host(be, back, d, sizeof back), RF_OK);
    assert_true(back[5] == 2.5f);
    rf_backend_free(be, d);
}

/* A collective on a host group reads and writes its buffers (comm.h's access
 * hooks open them, and only them, until its wait), and they are closed again
 * once it is over. */
static void test_collectives_open_the_buffers(void **state) {
    (void)state;
    rf_comm *c;
    assert_int_equal(rf_comm_init_from_env(NULL, &c), RF_OK); /* world 1: self */
    float host[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        host[i] = (float)i;
    float *a = rf_backend_alloc(be, sizeof host), *b = rf_backend_alloc(be, sizeof host);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(be->to_device(be, a, host, sizeof host), RF_OK);
    assert_int_equal(rf_comm_allreduce(c, a, b, 1000, RF_COMM_F32, RF_COMM_SUM), RF_OK);
    int status;
    char err[4096];
    /* between an asynchronous start and its wait: the buffer it moves is
     * open, the others are not */
    rf_comm_req *r;
    assert_int_equal(rf_comm_ibroadcast(c, b, 1000, RF_COMM_F32, 0, &r), RF_OK);
    in_child(host_read, b, &status, err, sizeof err);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("a read of the buffer a collective holds failed (status %d): %s", status, err);
    in_child(host_read, a, &status, err, sizeof err);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
    assert_non_null(strstr(err, "cpu-guarded: host code touched device memory"));
    assert_int_equal(rf_comm_wait(r), RF_OK);
    assert_int_equal(be->to_host(be, back, b, sizeof back), RF_OK);
    assert_memory_equal(back, host, sizeof host);
    /* and after it, closed */
    in_child(host_read, b, &status, err, sizeof err);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
    assert_non_null(strstr(err, "cpu-guarded: host code touched device memory"));
    rf_backend_free(be, a);
    rf_backend_free(be, b);
    assert_int_equal(rf_comm_destroy(c), RF_OK);
}

/* Every slot of the table is a wrapper of the guard's, none the CPU's own
 * kernel: the slots are the function pointers from `alloc` to the end of the
 * struct (backend.h), so one added there later without its GUARDED line in
 * backend_guarded.c fails here. */
static void test_every_slot_is_wrapped(void **state) {
    (void)state;
    const rf_backend *cpu = rf_backend_cpu();
    size_t first = offsetof(rf_backend, alloc), n = 0;
    for (size_t off = first; off + sizeof(void (*)(void)) <= sizeof(rf_backend);
         off += sizeof(void (*)(void)), n++) {
        void (*g)(void), (*c)(void);
        memcpy(&g, (const char *)be + off, sizeof g);
        memcpy(&c, (const char *)cpu + off, sizeof c);
        if (c && g == c)
            fail_msg("the slot at byte %zu of rf_backend is the CPU's, unguarded", off);
        if (!c != !g) fail_msg("the slot at byte %zu: NULL on one table only", off);
    }
    assert_true(n > 40);
    printf("%zu slots, each wrapped\n", n);
}

static void test_free_refuses_foreign_pointers(void **state) {
    (void)state;
    float x;
    assert_int_equal(be->free(be, &x), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "not one of its buffers"));
    assert_int_equal(be->free(be, NULL), RF_OK);
}

/* rf_inputs (backend.h): the models' one upload of a batch. Pieces lie
 * 16-byte aligned in both blocks; send(k) moves pieces [0, k) whole and
 * nothing after them; the guard lets the copies through (its buffers stay
 * closed to the host, so reading back goes through to_host). */
static void test_inputs_one_upload(void **state) {
    (void)state;
    rf_inputs in = {0};
    size_t sizes[3] = {5 * sizeof(int32_t), 3, 2 * sizeof(int32_t)};
    assert_int_equal(rf_inputs_alloc(&in, be, 0, sizes), RF_ERR_INVALID);
    assert_int_equal(rf_inputs_alloc(&in, be, RF_INPUTS_MAX + 1, sizes), RF_ERR_INVALID);
    assert_null(in.host);
    assert_int_equal(rf_inputs_alloc(&in, be, 3, sizes), RF_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(in.off[i] % 16, 0);
        assert_true(in.off[i + 1] >= in.off[i] + sizes[i]); /* no overlap */
    }
    assert_true(in.off[3] == in.off[2] + sizes[2]); /* off[n]: the end */
    int32_t ids[5] = {7, -1, 30521, 0, 42}, lab[2] = {1, 0};
    uint8_t mask[3] = {1, 1, 0};
    memcpy(rf_inputs_host(&in, 0), ids, sizeof ids);
    memcpy(rf_inputs_host(&in, 1), mask, sizeof mask);
    memcpy(rf_inputs_host(&in, 2), lab, sizeof lab);
    assert_int_equal(rf_inputs_send(&in, be, 0), RF_ERR_INVALID);
    assert_int_equal(rf_inputs_send(&in, be, 4), RF_ERR_INVALID);
    int32_t got[5], glab[2];
    uint8_t gmask[3];
    assert_int_equal(rf_inputs_send(&in, be, 2), RF_OK); /* ids and mask, not labels */
    assert_int_equal(be->to_host(be, got, rf_inputs_dev(&in, 0), sizeof got), RF_OK);
    assert_int_equal(be->to_host(be, gmask, rf_inputs_dev(&in, 1), sizeof gmask), RF_OK);
    assert_int_equal(be->to_host(be, glab, rf_inputs_dev(&in, 2), sizeof glab), RF_OK);
    assert_memory_equal(got, ids, sizeof ids);
    assert_memory_equal(gmask, mask, sizeof mask);
    assert_int_equal(glab[0], 0); /* backend memory starts zeroed */
    assert_int_equal(glab[1], 0);
    assert_int_equal(rf_inputs_send(&in, be, 3), RF_OK);
    assert_int_equal(be->to_host(be, glab, rf_inputs_dev(&in, 2), sizeof glab), RF_OK);
    assert_memory_equal(glab, lab, sizeof lab);
    /* a second block replaces the first (which is freed: the guard's leak
     * check and ASan would see it otherwise) */
    assert_int_equal(rf_inputs_alloc(&in, be, 1, sizes), RF_OK);
    assert_int_equal(in.n, 1);
    rf_inputs_free(&in, be);
    assert_null(in.host);
    assert_null(in.dev);
    rf_inputs_free(&in, be); /* a no-op */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots_work_host_access_dies),
        cmocka_unit_test(test_collectives_open_the_buffers),
        cmocka_unit_test(test_every_slot_is_wrapped),
        cmocka_unit_test(test_free_refuses_foreign_pointers),
        cmocka_unit_test(test_inputs_one_upload),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
