/* The communication layer at world size 1 (the self backend), the mesh layout,
 * shards, and how the environment picks a way to start. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "comm/comm.h"
#include "common/error.h"

static const char *launch_vars[] = {"OMPI_COMM_WORLD_RANK",
                                    "OMPI_COMM_WORLD_SIZE",
                                    "OMPI_COMM_WORLD_LOCAL_RANK",
                                    "RANK",
                                    "WORLD_SIZE",
                                    "JOB_COMPLETION_INDEX",
                                    "REFINERY_WORLD_SIZE",
                                    "MASTER_ADDR",
                                    "MASTER_PORT",
                                    "LOCAL_RANK",
                                    "REFINERY_RUN_ID",
                                    "REFINERY_ATTEMPT",
                                    "REFINERY_COMM_TIMEOUT"};

static int clear_env(void **state) {
    for (size_t i = 0; i < sizeof launch_vars / sizeof *launch_vars; i++)
        unsetenv(launch_vars[i]);
    return 0;
}

static rf_comm *open_self(void) {
    rf_comm *c = NULL;
    assert_int_equal(rf_comm_init_from_env(NULL, &c), RF_OK);
    assert_non_null(c);
    assert_string_equal(rf_comm_backend_name(c), "self");
    assert_int_equal(rf_comm_rank(c), 0);
    assert_int_equal(rf_comm_world(c), 1);
    return c;
}

static void test_reductions_are_identity(void **state) {
    rf_comm *c = open_self();
    enum { N = 7 };
    float src[N], dst[N];
    for (int i = 0; i < N; i++)
        src[i] = 0.5f * (float)i - 1.25f;
    rf_comm_op ops[] = {RF_COMM_SUM, RF_COMM_AVG, RF_COMM_MAX, RF_COMM_MIN};
    for (size_t o = 0; o < 4; o++) {
        memset(dst, 0xff, sizeof dst);
        assert_int_equal(rf_comm_allreduce(c, src, dst, N, RF_COMM_F32, ops[o]), RF_OK);
        assert_memory_equal(dst, src, sizeof src);
        memcpy(dst, src, sizeof src); /* in place */
        assert_int_equal(rf_comm_allreduce(c, dst, dst, N, RF_COMM_F32, ops[o]), RF_OK);
        assert_memory_equal(dst, src, sizeof src);
    }
    int64_t a[3] = {-5, 0, INT64_MAX}, b[3] = {0};
    assert_int_equal(rf_comm_allreduce(c, a, b, 3, RF_COMM_I64, RF_COMM_SUM), RF_OK);
    assert_memory_equal(a, b, sizeof a);
    uint8_t f = 1, g = 0;
    assert_int_equal(rf_comm_allreduce(c, &f, &g, 1, RF_COMM_U8, RF_COMM_MAX), RF_OK);
    assert_int_equal(g, 1);
    /* Averages are for floating point only. */
    assert_int_equal(rf_comm_allreduce(c, a, b, 3, RF_COMM_I64, RF_COMM_AVG), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "average"));
    /* Overlapping buffers other than the in-place layouts are refused. */
    assert_int_equal(rf_comm_allreduce(c, src, src + 1, 3, RF_COMM_F32, RF_COMM_SUM),
                     RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "overlapping"));
    assert_int_equal(rf_comm_allgather(c, src + 1, src, 3, RF_COMM_F32), RF_ERR_INVALID);
    assert_int_equal(rf_comm_reduce_scatter(c, src, src + 2, 3, RF_COMM_F32, RF_COMM_SUM),
                     RF_ERR_INVALID);
    assert_int_equal(rf_comm_reduce_scatter(c, src, src, 3, RF_COMM_F32, RF_COMM_SUM), RF_OK);
    assert_int_equal(rf_comm_allgather(c, src, src, 3, RF_COMM_F32), RF_OK);
    /* Reduce-scatter of world*count = count elements, all-gather of one block. */
    memset(dst, 0, sizeof dst);
    assert_int_equal(rf_comm_reduce_scatter(c, src, dst, N, RF_COMM_F32, RF_COMM_SUM), RF_OK);
    assert_memory_equal(dst, src, sizeof src);
    memset(dst, 0, sizeof dst);
    assert_int_equal(rf_comm_allgather(c, src, dst, N, RF_COMM_F32), RF_OK);
    assert_memory_equal(dst, src, sizeof src);
    rf_comm_destroy(c);
}

static void test_broadcast_barrier_send_recv(void **state) {
    rf_comm *c = open_self();
    double v[2] = {3.5, -1}, w[2];
    assert_int_equal(rf_comm_broadcast(c, v, 2, RF_COMM_F64, 0), RF_OK);
    assert_true(v[0] == 3.5 && v[1] == -1);
    assert_int_equal(rf_comm_broadcast(c, v, 2, RF_COMM_F64, 1), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "root 1"));
    assert_int_equal(rf_comm_barrier(c), RF_OK);
    /* A send to oneself is buffered until received, in order. */
    int32_t m1[3] = {1, 2, 3}, m2 = 9, r1[3] = {0}, r2 = 0;
    assert_int_equal(rf_comm_send(c, m1, 3, RF_COMM_I32, 0), RF_OK);
    assert_int_equal(rf_comm_send(c, &m2, 1, RF_COMM_I32, 0), RF_OK);
    m1[0] = 100; /* the message was copied */
    assert_int_equal(rf_comm_recv(c, r1, 3, RF_COMM_I32, 0), RF_OK);
    assert_int_equal(r1[0], 1);
    assert_int_equal(r1[2], 3);
    assert_int_equal(rf_comm_recv(c, &r2, 2, RF_COMM_I32, 0), RF_ERR_INVALID); /* wrong size */
    assert_int_equal(rf_comm_recv(c, &r2, 1, RF_COMM_I32, 0), RF_OK);
    assert_int_equal(r2, 9);
    /* Nothing left: MPI would hang, the self backend says why. */
    assert_int_equal(rf_comm_recv(c, &r2, 1, RF_COMM_I32, 0), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "no message"));
    assert_int_equal(rf_comm_send(c, &m2, 1, RF_COMM_I32, 1), RF_ERR_INVALID);
    /* A receive posted before the send (irecv from prev, isend to next). */
    rf_comm_req *rr, *rs;
    int32_t ring_in[2] = {0}, ring_out[2] = {7, 8};
    assert_int_equal(rf_comm_irecv(c, ring_in, 2, RF_COMM_I32, 0, &rr), RF_OK);
    assert_int_equal(rf_comm_isend(c, ring_out, 2, RF_COMM_I32, 0, &rs), RF_OK);
    assert_int_equal(rf_comm_wait(rs), RF_OK);
    assert_int_equal(rf_comm_wait(rr), RF_OK);
    assert_memory_equal(ring_in, ring_out, sizeof ring_out);
    /* A posted receive of the wrong size fails when the send arrives. */
    assert_int_equal(rf_comm_irecv(c, ring_in, 1, RF_COMM_I32, 0, &rr), RF_OK);
    assert_int_equal(rf_comm_send(c, ring_out, 2, RF_COMM_I32, 0), RF_OK);
    assert_int_equal(rf_comm_wait(rr), RF_ERR_INVALID);
    assert_false(rf_comm_broken(c)); /* a usage error, not a broken group */
    /* A failure seen by rf_comm_test is reported again by rf_comm_wait. */
    assert_int_equal(rf_comm_irecv(c, ring_in, 2, RF_COMM_I32, 0, &rr), RF_OK);
    int done = 0;
    assert_int_equal(rf_comm_test(rr, &done), RF_ERR_INVALID);
    assert_int_equal(done, 0);
    assert_int_equal(rf_comm_wait(rr), RF_ERR_INVALID);
    /* A ring shift over one rank is a copy. */
    int32_t sr_in[2] = {0};
    assert_int_equal(rf_comm_sendrecv(c, ring_out, 0, sr_in, 0, 2, RF_COMM_I32), RF_OK);
    assert_memory_equal(sr_in, ring_out, sizeof ring_out);
    assert_int_equal(rf_comm_sendrecv(c, ring_out, 0, sr_in, 1, 2, RF_COMM_I32), RF_ERR_INVALID);
    /* With two counts: equal ones are the same copy, unequal ones cannot
     * match a rank's own receive. */
    int32_t sr_n[2] = {0};
    assert_int_equal(rf_comm_sendrecv_n(c, ring_out, 2, 0, sr_n, 2, 0, RF_COMM_I32), RF_OK);
    assert_memory_equal(sr_n, ring_out, sizeof ring_out);
    assert_int_equal(rf_comm_sendrecv_n(c, ring_out, 2, 0, sr_n, 1, 0, RF_COMM_I32),
                     RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "sizes differ"));
    assert_int_equal(rf_comm_sendrecv_n(c, ring_out, 1, 0, NULL, 1, 0, RF_COMM_I32),
                     RF_ERR_INVALID); /* a NULL receive buffer */
    /* Ordering after a device stream is for device groups only. */
    int not_a_stream;
    assert_int_equal(rf_comm_order_after(c, &not_a_stream), RF_ERR_UNSUPPORTED);
    assert_non_null(strstr(rf_errmsg(), "needs a device group"));
    assert_int_equal(rf_comm_order_after(c, NULL), RF_ERR_INVALID);
    assert_false(rf_comm_ordered(c));
    /* A message never received is freed with the communicator. */
    assert_int_equal(rf_comm_send(c, w, 0, RF_COMM_F64, 0), RF_OK);
    assert_false(rf_comm_broken(c));
    rf_comm_destroy(c);
}

static void test_async_then_wait(void **state) {
    rf_comm *c = open_self();
    float g[5] = {1, 2, 3, 4, 5}, h[5] = {0}, all[5] = {0};
    rf_comm_req *r[4];
    assert_int_equal(rf_comm_iallreduce(c, g, g, 5, RF_COMM_F32, RF_COMM_AVG, &r[0]), RF_OK);
    assert_int_equal(rf_comm_ireduce_scatter(c, g, h, 5, RF_COMM_F32, RF_COMM_SUM, &r[1]), RF_OK);
    assert_int_equal(rf_comm_iallgather(c, g, all, 5, RF_COMM_F32, &r[2]), RF_OK);
    assert_int_equal(rf_comm_ibarrier(c, &r[3]), RF_OK);
    int done = 0;
    assert_int_equal(rf_comm_test(r[3], &done), RF_OK);
    assert_int_equal(done, 1);
    for (int i = 0; i < 4; i++)
        assert_int_equal(rf_comm_wait(r[i]), RF_OK);
    assert_memory_equal(h, g, sizeof g);
    assert_memory_equal(all, g, sizeof g);
    assert_int_equal(rf_comm_wait(NULL), RF_OK);
    /* A rejected call leaves no request behind. */
    rf_comm_req *bad = (rf_comm_req *)&done;
    assert_int_equal(rf_comm_iallreduce(c, NULL, h, 5, RF_COMM_F32, RF_COMM_SUM, &bad),
                     RF_ERR_INVALID);
    assert_null(bad);
    assert_int_equal(rf_comm_iallreduce(c, g, h, 5, (rf_comm_dtype)99, RF_COMM_SUM, &bad),
                     RF_ERR_INVALID);
    assert_null(bad);
    rf_comm_destroy(c);
}

static void test_split_and_mesh_of_one(void **state) {
    rf_comm *c = open_self(), *s = NULL;
    assert_int_equal(rf_comm_split(c, 3, 0, &s), RF_OK);
    assert_int_equal(rf_comm_world(s), 1);
    float x = 2, y = 0;
    assert_int_equal(rf_comm_allreduce(s, &x, &y, 1, RF_COMM_F32, RF_COMM_SUM), RF_OK);
    assert_true(y == 2);
    rf_comm_destroy(s);
    rf_comm_mesh m;
    assert_int_equal(rf_comm_mesh_init(c, 1, 1, 1, &m), RF_OK);
    assert_int_equal(rf_comm_world(m.dp_comm), 1);
    assert_int_equal(rf_comm_world(m.tp_comm), 1);
    assert_int_equal(rf_comm_world(m.pp_comm), 1);
    assert_int_equal(m.dp_i + m.tp_i + m.pp_i, 0);
    assert_int_equal(rf_comm_mesh_destroy(&m), RF_OK);
    /* The product of the axes must be the world size, and the error says so. */
    assert_int_equal(rf_comm_mesh_init(c, 2, 1, 1, &m), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "world size 1"));
    assert_null(m.dp_comm);
    rf_comm_destroy(c);
}

static void test_mesh_layout_tp_fastest(void **state) {
    int meshes[][3] = {{2, 2, 1}, {1, 2, 2}, {4, 1, 1}, {2, 3, 4}, {3, 1, 2}};
    for (size_t k = 0; k < sizeof meshes / sizeof *meshes; k++) {
        int dp = meshes[k][0], tp = meshes[k][1], pp = meshes[k][2], n = dp * tp * pp;
        for (int r = 0; r < n; r++) {
            int d, t, p;
            assert_int_equal(rf_comm_mesh_coords(r, dp, tp, pp, &d, &t, &p), RF_OK);
            assert_int_equal(rf_comm_mesh_rank(dp, tp, pp, d, t, p), r);
            assert_int_equal(r, (d * pp + p) * tp + t); /* the documented formula */
            if (t + 1 < tp) { /* the next rank is the next tp coordinate */
                int d2, t2, p2;
                assert_int_equal(rf_comm_mesh_coords(r + 1, dp, tp, pp, &d2, &t2, &p2), RF_OK);
                assert_int_equal(d2, d);
                assert_int_equal(p2, p);
                assert_int_equal(t2, t + 1);
            }
        }
    }
    int d, t, p;
    /* dp=2 tp=2 pp=2: rank 5 = (1*2 + 0)*2 + 1. */
    assert_int_equal(rf_comm_mesh_coords(5, 2, 2, 2, &d, &t, &p), RF_OK);
    assert_true(d == 1 && p == 0 && t == 1);
    assert_int_equal(rf_comm_mesh_coords(8, 2, 2, 2, &d, &t, &p), RF_ERR_INVALID);
    assert_int_equal(rf_comm_mesh_coords(0, 0, 2, 2, &d, &t, &p), RF_ERR_INVALID);
    assert_int_equal(rf_comm_mesh_rank(2, 2, 2, 0, 2, 0), RF_ERR_INVALID);
}

static void test_shard_ranges(void **state) {
    size_t lo, hi;
    size_t want[][2] = {{0, 2}, {2, 4}, {4, 6}, {6, 7}};
    for (int r = 0; r < 4; r++) {
        assert_int_equal(rf_comm_shard(7, 4, r, &lo, &hi), 2);
        assert_int_equal(lo, want[r][0]);
        assert_int_equal(hi, want[r][1]);
    }
    /* Fewer elements than ranks: trailing ranks hold empty ranges. */
    assert_int_equal(rf_comm_shard(1, 4, 0, &lo, &hi), 1);
    assert_true(lo == 0 && hi == 1);
    assert_int_equal(rf_comm_shard(1, 4, 3, &lo, &hi), 1);
    assert_true(lo == 1 && hi == 1);
    assert_int_equal(rf_comm_shard(0, 2, 1, &lo, &hi), 0);
    assert_true(lo == 0 && hi == 0);
    /* The ranges cover [0, n) exactly. */
    for (size_t n = 0; n < 50; n++)
        for (int w = 1; w <= 6; w++) {
            size_t next = 0;
            for (int r = 0; r < w; r++) {
                size_t b = rf_comm_shard(n, w, r, &lo, &hi);
                assert_int_equal(lo, next);
                assert_true(hi - lo <= b && b * (size_t)w >= n);
                next = hi;
            }
            assert_int_equal(next, n);
        }
}

static void test_env_launch_paths(void **state) {
    rf_comm_env e;
    assert_int_equal(rf_comm_env_read(&e), RF_OK);
    assert_int_equal(e.launch, RF_COMM_LAUNCH_SINGLE);
    assert_int_equal(e.world, 1);

    setenv("RANK", "1", 1);
    assert_int_equal(rf_comm_env_read(&e), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "WORLD_SIZE"));
    setenv("WORLD_SIZE", "4", 1);
    assert_int_equal(rf_comm_env_read(&e), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "MASTER_ADDR"));
    setenv("MASTER_ADDR", "job-master-0.job", 1);
    setenv("MASTER_PORT", "70000", 1);
    assert_int_equal(rf_comm_env_read(&e), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "MASTER_PORT"));
    setenv("MASTER_PORT", "29500", 1);
    setenv("REFINERY_RUN_ID", "run-42", 1);
    setenv("REFINERY_ATTEMPT", "3", 1);
    assert_int_equal(rf_comm_env_read(&e), RF_OK);
    assert_int_equal(e.launch, RF_COMM_LAUNCH_ENV);
    assert_true(e.rank == 1 && e.world == 4 && e.master_port == 29500 && e.attempt == 3);
    assert_string_equal(e.master_addr, "job-master-0.job");
    assert_string_equal(e.run_id, "run-42");
    /* A CPU group from the environment is refused (CPU groups use mpirun). */
    rf_comm *c = (rf_comm *)&e;
    assert_int_equal(rf_comm_init_from_env(NULL, &c), RF_ERR_UNSUPPORTED);
    assert_null(c);
    assert_non_null(strstr(rf_errmsg(), "mpirun"));
    setenv("RANK", "4", 1);
    assert_int_equal(rf_comm_env_read(&e), RF_ERR_INVALID);
    clear_env(state);

    /* An Indexed Job: the completion index and a count. */
    setenv("JOB_COMPLETION_INDEX", "2", 1);
    assert_int_equal(rf_comm_env_read(&e), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "REFINERY_WORLD_SIZE"));
    setenv("REFINERY_WORLD_SIZE", "3", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "1234", 1);
    assert_int_equal(rf_comm_env_read(&e), RF_OK);
    assert_true(e.launch == RF_COMM_LAUNCH_ENV && e.rank == 2 && e.world == 3);
    assert_string_equal(e.run_id, "default");
    clear_env(state);

    /* One rank from the environment needs no address and costs nothing. */
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    c = open_self();
    rf_comm_destroy(c);
    clear_env(state);

    /* mpirun -np 1 needs no MPI either. */
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    c = open_self();
    rf_comm_destroy(c);
    clear_env(state);

    /* mpirun's variables win. */
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("RANK", "0", 1);
    assert_int_equal(rf_comm_env_read(&e), RF_OK);
    assert_true(e.launch == RF_COMM_LAUNCH_MPIRUN && e.rank == 3 && e.world == 4 &&
                e.local_rank == 1);
    clear_env(state);

    setenv("REFINERY_COMM_TIMEOUT", "soon", 1);
    assert_int_equal(rf_comm_init_from_env(NULL, &c), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "REFINERY_COMM_TIMEOUT"));
    clear_env(state);
}

static void test_device_memory_needs_cuda(void **state) {
#ifndef REFINERY_CUDA
    rf_comm_opts o = rf_comm_opts_default();
    o.mem = RF_COMM_DEVICE;
    rf_comm *c = NULL;
    assert_int_equal(rf_comm_init_from_env(&o, &c), RF_ERR_UNSUPPORTED);
    assert_non_null(strstr(rf_errmsg(), "CUDA=1"));
    assert_null(c);
#else
    /* The CUDA build picks NCCL for device tensors: one rank on a GPU
     * machine; without a GPU, an error that says so (never a crash or hang). */
    rf_comm_opts o = rf_comm_opts_default();
    o.mem = RF_COMM_DEVICE;
    o.timeout_s = 20;
    rf_comm *c = NULL;
    int rc = rf_comm_init_from_env(&o, &c);
    if (rc == RF_OK) {
        assert_string_equal(rf_comm_backend_name(c), "nccl");
        assert_int_equal(rf_comm_world(c), 1);
        assert_int_equal(rf_comm_barrier(c), RF_OK);
        assert_int_equal(rf_comm_destroy(c), RF_OK);
    } else {
        assert_null(c);
        assert_non_null(strstr(rf_errmsg(), "comm (nccl)"));
    }
#endif
}

/* rf_comm_dup_mem: a host group's device twin (the trainer's data-parallel
 * group on a GPU). On a world of one: NCCL with a GPU, else a clear error;
 * host to host (or from a device group) is refused. */
static void test_dup_to_device(void **state) {
    (void)state;
    rf_comm *c = NULL, *d = NULL;
    assert_int_equal(rf_comm_init_from_env(NULL, &c), RF_OK);
    assert_int_equal(rf_comm_mem_of(c), RF_COMM_HOST);
    assert_int_equal(rf_comm_dup_mem(c, RF_COMM_HOST, &d), RF_ERR_UNSUPPORTED);
    assert_null(d);
    int rc = rf_comm_dup_mem(c, RF_COMM_DEVICE, &d);
#ifndef REFINERY_CUDA
    assert_int_equal(rc, RF_ERR_UNSUPPORTED);
    assert_non_null(strstr(rf_errmsg(), "CUDA=1"));
    assert_null(d);
#else
    if (rc == RF_OK) {
        assert_string_equal(rf_comm_backend_name(d), "nccl");
        assert_int_equal(rf_comm_mem_of(d), RF_COMM_DEVICE);
        assert_int_equal(rf_comm_world(d), 1);
        assert_int_equal(rf_comm_barrier(d), RF_OK);
        assert_int_equal(rf_comm_destroy(d), RF_OK);
    } else {
        assert_null(d);
        assert_non_null(strstr(rf_errmsg(), "comm (nccl)"));
    }
#endif
    assert_int_equal(rf_comm_barrier(c), RF_OK); /* c is untouched */
    assert_int_equal(rf_comm_destroy(c), RF_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_reductions_are_identity, clear_env),
        cmocka_unit_test_setup(test_broadcast_barrier_send_recv, clear_env),
        cmocka_unit_test_setup(test_async_then_wait, clear_env),
        cmocka_unit_test_setup(test_split_and_mesh_of_one, clear_env),
        cmocka_unit_test(test_mesh_layout_tp_fastest),
        cmocka_unit_test(test_shard_ranges),
        cmocka_unit_test_setup(test_env_launch_paths, clear_env),
        cmocka_unit_test_setup(test_device_memory_needs_cuda, clear_env),
        cmocka_unit_test_setup(test_dup_to_device, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
