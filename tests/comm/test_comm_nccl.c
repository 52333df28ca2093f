/* The NCCL backend of the communication layer on device buffers, world size
 * 1 (issue 14): every collective moves the right bytes between device
 * buffers, in place and out of place, blocking and asynchronous, for each
 * element type; a host group's NCCL twin (rf_comm_dup_mem, the trainer's
 * data-parallel path) does the same. Multi-GPU groups are not available to
 * the project; their logic is tested on the CPU (tests/trainer/dp_staged).
 *
 * Without a CUDA build or a GPU every case is skipped and says why (`make
 * test-gpu` runs it on a GPU machine and fails on a skip). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../support/skip.h"
#include "comm/comm.h"
#include "common/error.h"

#ifdef REFINERY_CUDA
#include <cuda_runtime.h>

#define N 1027 /* odd, so no size is a multiple of a vector width */

static void need_gpu(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) RF_SKIP("no usable GPU (%s)", cudaGetErrorString(e));
    if (n == 0) RF_SKIP("no CUDA device on this machine");
    static const char *vars[] = {
        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "RANK",
        "WORLD_SIZE",           "JOB_COMPLETION_INDEX", "REFINERY_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
}

static rf_comm *open_nccl(void) {
    rf_comm_opts o = rf_comm_opts_default();
    o.mem = RF_COMM_DEVICE;
    o.timeout_s = 60;
    rf_comm *c = NULL;
    if (rf_comm_init_from_env(&o, &c)) fail_msg("nccl init: %s", rf_errmsg());
    assert_string_equal(rf_comm_backend_name(c), "nccl");
    assert_int_equal(rf_comm_mem_of(c), RF_COMM_DEVICE);
    assert_int_equal(rf_comm_rank(c), 0);
    assert_int_equal(rf_comm_world(c), 1);
    return c;
}

static void *dev(const void *host, size_t bytes) {
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, bytes), cudaSuccess);
    if (host)
        assert_int_equal(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    else
        assert_int_equal(cudaMemset(d, 0xff, bytes), cudaSuccess);
    /* cudaMemset may still be queued on the legacy stream, which the NCCL
     * stream (non-blocking) does not wait for */
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    return d;
}

/* The device buffer d (bytes) equals the host one h, byte for byte. */
static void same(const void *d, const void *h, size_t bytes) {
    unsigned char *got = malloc(bytes);
    assert_int_equal(cudaMemcpy(got, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(got, h, bytes);
    free(got);
}

static void fill(float *x, size_t n, float base) {
    for (size_t i = 0; i < n; i++)
        x[i] = base + (float)i * 0.25f - (float)(i % 7);
}

/* All-reduce (SUM, AVG, MAX, MIN), reduce-scatter, all-gather and broadcast
 * of a world of one: each result is its input, in place or copied. */
static void test_collectives(void **state) {
    (void)state;
    need_gpu();
    rf_comm *c = open_nccl();
    float h[N];
    fill(h, N, 3.5f);
    float *a = dev(h, sizeof h), *b = dev(NULL, sizeof h);
    const rf_comm_op ops[] = {RF_COMM_SUM, RF_COMM_AVG, RF_COMM_MAX, RF_COMM_MIN};
    for (size_t k = 0; k < 4; k++) {
        assert_int_equal(rf_comm_allreduce(c, a, b, N, RF_COMM_F32, ops[k]), RF_OK);
        same(b, h, sizeof h);
        assert_int_equal(rf_comm_allreduce(c, a, a, N, RF_COMM_F32, ops[k]), RF_OK);
        same(a, h, sizeof h);
    }
    assert_int_equal(cudaMemset(b, 0, sizeof h), cudaSuccess);
    assert_int_equal(rf_comm_reduce_scatter(c, a, b, N, RF_COMM_F32, RF_COMM_SUM), RF_OK);
    same(b, h, sizeof h);
    assert_int_equal(cudaMemset(b, 0, sizeof h), cudaSuccess);
    assert_int_equal(rf_comm_allgather(c, a, b, N, RF_COMM_F32), RF_OK);
    same(b, h, sizeof h);
    assert_int_equal(rf_comm_broadcast(c, a, N, RF_COMM_F32, 0), RF_OK);
    same(a, h, sizeof h);
    assert_int_equal(rf_comm_barrier(c), RF_OK);
    cudaFree(a);
    cudaFree(b);
    assert_int_equal(rf_comm_destroy(c), RF_OK);
}

/* The other element types (the trainer's flags, counts and norms). */
static void test_types(void **state) {
    (void)state;
    need_gpu();
    rf_comm *c = open_nccl();
    double hd[N];
    int32_t hi[N];
    int64_t hl[N];
    uint8_t hu[N];
    for (int i = 0; i < N; i++)
        hd[i] = i * 1e-3 - 0.5, hi[i] = i - 500, hl[i] = (int64_t)i << 33, hu[i] = (uint8_t)(i % 2);
    struct {
        void *h;
        size_t size;
        rf_comm_dtype t;
        rf_comm_op op;
    } cases[] = {{hd, sizeof hd, RF_COMM_F64, RF_COMM_SUM},
                 {hi, sizeof hi, RF_COMM_I32, RF_COMM_MAX},
                 {hl, sizeof hl, RF_COMM_I64, RF_COMM_SUM},
                 {hu, sizeof hu, RF_COMM_U8, RF_COMM_MIN}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        void *s = dev(cases[k].h, cases[k].size), *r = dev(NULL, cases[k].size);
        assert_int_equal(rf_comm_allreduce(c, s, r, N, cases[k].t, cases[k].op), RF_OK);
        same(r, cases[k].h, cases[k].size);
        cudaFree(s);
        cudaFree(r);
    }
    assert_int_equal(rf_comm_destroy(c), RF_OK);
}

/* Asynchronous variants, several in flight, then waited for in reverse. */
static void test_async(void **state) {
    (void)state;
    need_gpu();
    rf_comm *c = open_nccl();
    float h[N];
    fill(h, N, -2.0f);
    float *a = dev(h, sizeof h), *b = dev(NULL, sizeof h), *g = dev(NULL, sizeof h);
    rf_comm_req *r1 = NULL, *r2 = NULL, *r3 = NULL;
    assert_int_equal(rf_comm_iallreduce(c, a, b, N, RF_COMM_F32, RF_COMM_SUM, &r1), RF_OK);
    assert_int_equal(rf_comm_iallgather(c, a, g, N, RF_COMM_F32, &r2), RF_OK);
    assert_int_equal(rf_comm_ibarrier(c, &r3), RF_OK);
    assert_int_equal(rf_comm_wait(r3), RF_OK);
    assert_int_equal(rf_comm_wait(r2), RF_OK);
    assert_int_equal(rf_comm_wait(r1), RF_OK);
    same(b, h, sizeof h);
    same(g, h, sizeof h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(g);
    assert_int_equal(rf_comm_destroy(c), RF_OK);
}

/* The trainer's path under mpirun: a host group's NCCL twin on the current
 * device, then a collective on it. */
static void test_dup_from_host(void **state) {
    (void)state;
    need_gpu();
    rf_comm *h = NULL, *d = NULL;
    assert_int_equal(rf_comm_init_from_env(NULL, &h), RF_OK);
    if (rf_comm_dup_mem(h, RF_COMM_DEVICE, &d)) fail_msg("dup: %s", rf_errmsg());
    assert_string_equal(rf_comm_backend_name(d), "nccl");
    float x[N];
    fill(x, N, 1.0f);
    float *a = dev(x, sizeof x);
    assert_int_equal(rf_comm_allreduce(d, a, a, N, RF_COMM_F32, RF_COMM_AVG), RF_OK);
    same(a, x, sizeof x);
    cudaFree(a);
    assert_int_equal(rf_comm_destroy(d), RF_OK);
    assert_int_equal(rf_comm_destroy(h), RF_OK);
}

/* rf_comm_sendrecv_n to oneself (a world of one): the grouped send and
 * receive of the pipeline's exchange. */
static void test_sendrecv_n(void **state) {
    (void)state;
    need_gpu();
    rf_comm *c = open_nccl();
    float h[N];
    fill(h, N, 5.0f);
    float *a = dev(h, sizeof h), *b = dev(NULL, sizeof h);
    /* to oneself the send is the receive: unequal sizes are refused (comm.c) */
    assert_int_equal(rf_comm_sendrecv_n(c, a, N, 0, b, N - 1, 0, RF_COMM_F32), RF_ERR_INVALID);
    assert_int_equal(rf_comm_sendrecv_n(c, a, N, 0, b, N, 0, RF_COMM_F32), RF_OK);
    same(b, h, sizeof h);
    cudaFree(a);
    cudaFree(b);
    assert_int_equal(rf_comm_destroy(c), RF_OK);
}

/* rf_comm_order_after: a collective reads what the caller's stream wrote
 * before it was issued, with no host wait between (the trainer's device
 * groups after the backend's stream). The stream is kept busy first (20
 * memsets of 256 MiB), then copies the values in; the all-reduce issued at
 * once must still see them. */
static void test_order_after(void **state) {
    (void)state;
    need_gpu();
    rf_comm *c = open_nccl();
    assert_false(rf_comm_ordered(c));
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(rf_comm_order_after(c, NULL), RF_ERR_INVALID);
    assert_int_equal(rf_comm_order_after(c, s), RF_OK);
    assert_true(rf_comm_ordered(c));
    float *h = NULL;
    assert_int_equal(cudaMallocHost((void **)&h, N * sizeof *h), cudaSuccess);
    fill(h, N, 3.0f);
    size_t big = (size_t)256 << 20;
    void *busy = NULL;
    assert_int_equal(cudaMalloc(&busy, big), cudaSuccess);
    float *a = dev(NULL, N * sizeof *h), *b = dev(NULL, N * sizeof *h);
    for (int i = 0; i < 20; i++)
        assert_int_equal(cudaMemsetAsync(busy, i, big, s), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(a, h, N * sizeof *h, cudaMemcpyHostToDevice, s), cudaSuccess);
    assert_int_equal(rf_comm_allreduce(c, a, b, N, RF_COMM_F32, RF_COMM_SUM), RF_OK);
    same(b, h, N * sizeof *h);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    cudaFree(busy);
    cudaFree(a);
    cudaFree(b);
    cudaFreeHost(h);
    assert_int_equal(rf_comm_destroy(c), RF_OK);
    cudaStreamDestroy(s);
}

#else /* no CUDA in this build */

static void no_cuda(void) {
    RF_SKIP("this build has no CUDA (make CUDA=1; make test-gpu on a GPU machine)");
}
static void test_collectives(void **state) {
    (void)state;
    no_cuda();
}
static void test_types(void **state) {
    (void)state;
    no_cuda();
}
static void test_async(void **state) {
    (void)state;
    no_cuda();
}
static void test_dup_from_host(void **state) {
    (void)state;
    no_cuda();
}
static void test_sendrecv_n(void **state) {
    (void)state;
    no_cuda();
}
static void test_order_after(void **state) {
    (void)state;
    no_cuda();
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives), cmocka_unit_test(test_types),
        cmocka_unit_test(test_async),       cmocka_unit_test(test_dup_from_host),
        cmocka_unit_test(test_sendrecv_n),  cmocka_unit_test(test_order_after),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
