/* The communication layer under mpirun (run by tests/comm/mpi.test.sh through
 * scripts/mpirun.sh; not a cmocka test, because it needs N processes).
 *
 *   mpi_check all          every collective against values computed locally,
 *                          async overlap, split and every mesh of this size
 *   mpi_check fault-kill   the last rank kill -9s itself before a collective
 *   mpi_check fault-silent the last rank stays alive but never calls it
 *   mpi_check sync-send    (2 ranks, REFINERY_COMM_SYNC_SEND=1) a blocking
 *                          exchange in matching order completes, the same
 *                          with both ranks sending first must time out
 *
 * Exit 0 when every check holds; 1 on a wrong result (with "FAIL: ..." on
 * stderr); in the fault modes the surviving ranks exit 3 after printing
 * "rank R: <error>" once their collective has failed, and 1 if it did not. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/error.h"
#include "common/sys.h"

static int rank, world;
static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL rank %d (%s:%d): ", rank, __FILE__, __LINE__);                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define OK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != RF_OK) {                                                                        \
            fprintf(stderr, "FAIL rank %d: %s -> %s: %s\n", rank, #call, rf_err_name(rc_),         \
                    rf_errmsg());                                                                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Rank r's value at i: small integers, so every sum is exact in f32. */
static float val(int r, size_t i) {
    return (float)((r + 1) * (int)(i % 13 + 1));
}
static double sum_ranks_plus1(int w) {
    return w * (w + 1) / 2.0;
}

static void check_allreduce(rf_comm *c, size_t n) {
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
        x[i] = val(rank, i);
    rf_comm_op ops[] = {RF_COMM_SUM, RF_COMM_AVG, RF_COMM_MAX, RF_COMM_MIN};
    for (int o = 0; o < 4; o++)
        for (int in_place = 0; in_place < 2; in_place++) {
            if (in_place) memcpy(y, x, n * sizeof *y);
            OK(rf_comm_allreduce(c, in_place ? y : x, y, n, RF_COMM_F32, ops[o]));
            size_t bad = n;
            for (size_t i = 0; i < n && bad == n; i++) {
                double k = (double)(i % 13 + 1),
                       want = ops[o] == RF_COMM_SUM   ? sum_ranks_plus1(world) * k
                              : ops[o] == RF_COMM_AVG ? sum_ranks_plus1(world) * k / world
                              : ops[o] == RF_COMM_MAX ? world * k
                                                      : k;
                if (fabs(y[i] - want) > 1e-6 * want) bad = i;
            }
            CHECK(bad == n, "all-reduce op %d in_place %d n %zu: wrong at %zu (%g)", o, in_place, n,
                  bad, bad < n ? y[bad] : 0.0);
        }
    free(x);
    free(y);
}

static void check_allreduce_types(rf_comm *c) {
    int64_t a[3] = {rank * 1000000000000LL, -rank, 1}, b[3];
    OK(rf_comm_allreduce(c, a, b, 3, RF_COMM_I64, RF_COMM_SUM));
    int64_t s = (int64_t)world * (world - 1) / 2;
    CHECK(b[0] == s * 1000000000000LL && b[1] == -s && b[2] == world, "i64 sum %lld %lld %lld",
          (long long)b[0], (long long)b[1], (long long)b[2]);
    /* Flags: "any rank" is MAX, "every rank" is MIN. */
    uint8_t f = rank == world - 1, any = 0, all = 0;
    OK(rf_comm_allreduce(c, &f, &any, 1, RF_COMM_U8, RF_COMM_MAX));
    OK(rf_comm_allreduce(c, &f, &all, 1, RF_COMM_U8, RF_COMM_MIN));
    CHECK(any == 1 && all == (world == 1), "u8 flags any %d all %d", any, all);
    double d = 0.25 * rank, e;
    OK(rf_comm_allreduce(c, &d, &e, 1, RF_COMM_F64, RF_COMM_SUM));
    CHECK(e == 0.25 * world * (world - 1) / 2, "f64 sum %g", e);
}

/* n elements split in blocks of ceil(n/world), the tail padded with zeros. */
static void check_reduce_scatter(rf_comm *c, size_t n) {
    size_t lo, hi, block = rf_comm_shard(n, world, rank, &lo, &hi);
    float *x = calloc(block * world, sizeof *x), *y = malloc(block * sizeof *y);
    for (int avg = 0; avg < 2; avg++)
        for (int in_place = 0; in_place < 2; in_place++) {
            memset(x, 0, block * world * sizeof *x);
            for (size_t i = 0; i < n; i++)
                x[i] = val(rank, i);
            float *out = in_place ? x + (size_t)rank * block : y;
            OK(rf_comm_reduce_scatter(c, x, out, block, RF_COMM_F32,
                                      avg ? RF_COMM_AVG : RF_COMM_SUM));
            size_t bad = block;
            for (size_t j = 0; j < block && bad == block; j++) {
                size_t i = lo + j;
                double want = i < n ? sum_ranks_plus1(world) * (double)(i % 13 + 1) : 0;
                if (avg) want /= world;
                if (fabs(out[j] - want) > 1e-6 * want) bad = j;
            }
            CHECK(bad == block, "reduce-scatter n %zu avg %d in_place %d: wrong at %zu", n, avg,
                  in_place, bad);
            CHECK(hi - lo <= block, "shard %zu..%zu of block %zu", lo, hi, block);
        }
    free(x);
    free(y);
}

static void check_allgather(rf_comm *c, size_t count) {
    float *mine = malloc(count * sizeof *mine), *all = malloc(count * world * sizeof *all);
    for (size_t i = 0; i < count; i++)
        mine[i] = (float)(rank * 1000 + (int)(i % 1000));
    for (int in_place = 0; in_place < 2; in_place++) {
        memset(all, 0xff, count * world * sizeof *all);
        if (in_place) memcpy(all + (size_t)rank * count, mine, count * sizeof *mine);
        OK(rf_comm_allgather(c, in_place ? all + (size_t)rank * count : mine, all, count,
                             RF_COMM_F32));
        size_t bad = count * world;
        for (size_t j = 0; j < count * world && bad == count * world; j++)
            if (all[j] != (float)((int)(j / count) * 1000 + (int)(j % count % 1000))) bad = j;
        CHECK(bad == count * world, "all-gather count %zu in_place %d: wrong at %zu", count,
              in_place, bad);
    }
    free(mine);
    free(all);
}

static void check_broadcast(rf_comm *c, size_t n, int root) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = rank == root ? (float)(i % 4096) * 0.5f : -1.0f;
    OK(rf_comm_broadcast(c, x, n, RF_COMM_F32, root));
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (x[i] != (float)(i % 4096) * 0.5f) bad = i;
    CHECK(bad == n, "broadcast n %zu from %d: wrong at %zu", n, root, bad);
    int64_t v = rank == root ? -42 : 0;
    OK(rf_comm_broadcast(c, &v, 1, RF_COMM_I64, root));
    CHECK(v == -42, "broadcast i64 %lld", (long long)v);
    free(x);
}

static void check_ring(rf_comm *c, size_t n) {
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    int32_t *out = malloc(n * sizeof *out), *in = malloc(n * sizeof *in);
    for (size_t i = 0; i < n; i++)
        out[i] = rank * 100000 + (int32_t)i, in[i] = -1;
    rf_comm_req *s, *r;
    OK(rf_comm_irecv(c, in, n, RF_COMM_I32, prev, &r));
    OK(rf_comm_isend(c, out, n, RF_COMM_I32, next, &s));
    OK(rf_comm_wait(s));
    OK(rf_comm_wait(r));
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (in[i] != prev * 100000 + (int32_t)i) bad = i;
    CHECK(bad == n, "ring n %zu: wrong at %zu", n, bad);
    /* The same shift as one send-recv, both ways round. */
    for (int dir = 0; dir < 2; dir++) {
        int to = dir ? prev : next, from = dir ? next : prev;
        for (size_t i = 0; i < n; i++)
            in[i] = -1;
        OK(rf_comm_sendrecv(c, out, to, in, from, n, RF_COMM_I32));
        bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (in[i] != from * 100000 + (int32_t)i) bad = i;
        CHECK(bad == n, "send-recv dir %d n %zu: wrong at %zu", dir, n, bad);
    }
    /* Sizes that differ by direction (a pipeline stage's activation out,
     * gradient in): rank r sends 3 + r % 5 + n elements, receives its
     * source's count. */
    for (int dir = 0; dir < 2; dir++) {
        int to = dir ? prev : next, from = dir ? next : prev;
        size_t ns = n + 3 + (size_t)(rank % 5), nr = n + 3 + (size_t)(from % 5);
        int32_t *o2 = malloc(ns * sizeof *o2), *i2 = malloc(nr * sizeof *i2);
        for (size_t i = 0; i < ns; i++)
            o2[i] = rank * 100000 + (int32_t)i;
        for (size_t i = 0; i < nr; i++)
            i2[i] = -1;
        OK(rf_comm_sendrecv_n(c, o2, ns, to, i2, nr, from, RF_COMM_I32));
        bad = nr;
        for (size_t i = 0; i < nr && bad == nr; i++)
            if (i2[i] != from * 100000 + (int32_t)i) bad = i;
        CHECK(bad == nr, "send-recv of %zu, receiving %zu, dir %d: wrong at %zu", ns, nr, dir, bad);
        free(o2);
        free(i2);
    }
    /* Blocking pairs: even ranks send first, odd ranks receive first. */
    if (world % 2 == 0) {
        int peer = rank ^ 1;
        int32_t v = rank, w = -1;
        if (rank % 2 == 0) {
            OK(rf_comm_send(c, &v, 1, RF_COMM_I32, peer));
            OK(rf_comm_recv(c, &w, 1, RF_COMM_I32, peer));
        } else {
            OK(rf_comm_recv(c, &w, 1, RF_COMM_I32, peer));
            OK(rf_comm_send(c, &v, 1, RF_COMM_I32, peer));
        }
        CHECK(w == peer, "pair exchange got %d from %d", w, peer);
    }
    free(out);
    free(in);
}

/* Two collectives in flight while this rank computes, then waited on. */
static void check_async_overlap(rf_comm *c) {
    size_t n = 1000003, g = 4099;
    float *x = malloc(n * sizeof *x), *mine = malloc(g * sizeof *mine),
          *all = malloc(g * world * sizeof *all);
    for (size_t i = 0; i < n; i++)
        x[i] = val(rank, i);
    for (size_t i = 0; i < g; i++)
        mine[i] = (float)(rank + 1);
    rf_comm_req *ra, *rg;
    OK(rf_comm_iallreduce(c, x, x, n, RF_COMM_F32, RF_COMM_SUM, &ra));
    OK(rf_comm_iallgather(c, mine, all, g, RF_COMM_F32, &rg));
    /* "Backward": local work that touches neither buffer, nudging progress. */
    double acc = 0;
    int done = 0;
    for (int step = 0; step < 200; step++) {
        for (int i = 0; i < 20000; i++)
            acc += sin(i * 1e-3 + step);
        OK(rf_comm_test(ra, &done));
    }
    OK(rf_comm_wait(ra));
    OK(rf_comm_wait(rg));
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (x[i] != (float)(sum_ranks_plus1(world) * (double)(i % 13 + 1))) bad = i;
    CHECK(bad == n, "overlapped all-reduce wrong at %zu", bad);
    for (size_t j = 0; j < g * world; j++)
        if (all[j] != (float)(j / g + 1)) {
            CHECK(0, "overlapped all-gather wrong at %zu", j);
            break;
        }
    CHECK(acc == acc, "local work");
    free(x);
    free(mine);
    free(all);
}

static void check_split(rf_comm *c) {
    /* By parity, in reverse rank order within each group. */
    rf_comm *s;
    OK(rf_comm_split(c, rank % 2, -rank, &s));
    int members = 0, before = 0, sum = 0;
    for (int r = rank % 2; r < world; r += 2) {
        members++;
        sum += r;
        if (r > rank) before++;
    }
    CHECK(rf_comm_world(s) == members && rf_comm_rank(s) == before,
          "split: rank %d of %d, want %d of %d", rf_comm_rank(s), rf_comm_world(s), before,
          members);
    int got = 0;
    OK(rf_comm_allreduce(s, &rank, &got, 1, RF_COMM_I32, RF_COMM_SUM));
    CHECK(got == sum, "split all-reduce %d want %d", got, sum);
    OK(rf_comm_destroy(s));
}

/* Checks one axis group: its size, this rank's place, and that an
 * all-gather of global ranks lists the mesh neighbours in axis order. */
static void check_axis(rf_comm *g, const char *axis, int size, int idx, int dp, int tp, int pp,
                       int d, int t, int p) {
    CHECK(rf_comm_world(g) == size && rf_comm_rank(g) == idx, "%s group: rank %d of %d", axis,
          rf_comm_rank(g), rf_comm_world(g));
    int32_t me = rank, got[64] = {0}, sum = 0, want_sum = 0;
    OK(rf_comm_allgather(g, &me, got, 1, RF_COMM_I32));
    OK(rf_comm_allreduce(g, &me, &sum, 1, RF_COMM_I32, RF_COMM_SUM));
    for (int k = 0; k < size; k++) {
        int want = axis[0] == 'd'   ? rf_comm_mesh_rank(dp, tp, pp, k, t, p)
                   : axis[0] == 't' ? rf_comm_mesh_rank(dp, tp, pp, d, k, p)
                                    : rf_comm_mesh_rank(dp, tp, pp, d, t, k);
        want_sum += want;
        CHECK(got[k] == want, "%s group of rank %d: member %d is rank %d, want %d", axis, rank, k,
              got[k], want);
    }
    CHECK(sum == want_sum, "%s all-reduce %d want %d", axis, sum, want_sum);
}

static void check_meshes(rf_comm *c) {
    int n = 0, meshes[16][3];
    for (int dp = 1; dp <= world; dp++)
        for (int tp = 1; tp <= world; tp++)
            if (world % (dp * tp) == 0) {
                meshes[n][0] = dp, meshes[n][1] = tp, meshes[n][2] = world / (dp * tp);
                n++;
            }
    for (int k = 0; k < n; k++) {
        int dp = meshes[k][0], tp = meshes[k][1], pp = meshes[k][2];
        rf_comm_mesh m;
        OK(rf_comm_mesh_init(c, dp, tp, pp, &m));
        CHECK(rank == (m.dp_i * pp + m.pp_i) * tp + m.tp_i, "mesh %dx%dx%d coordinates", dp, tp,
              pp);
        check_axis(m.dp_comm, "dp", dp, m.dp_i, dp, tp, pp, m.dp_i, m.tp_i, m.pp_i);
        check_axis(m.tp_comm, "tp", tp, m.tp_i, dp, tp, pp, m.dp_i, m.tp_i, m.pp_i);
        check_axis(m.pp_comm, "pp", pp, m.pp_i, dp, tp, pp, m.dp_i, m.tp_i, m.pp_i);
        OK(rf_comm_mesh_destroy(&m));
    }
    CHECK(n >= 3 || world < 4, "only %d meshes", n);
    rf_comm_mesh bad;
    CHECK(rf_comm_mesh_init(c, world + 1, 1, 1, &bad) == RF_ERR_INVALID &&
              strstr(rf_errmsg(), "does not match the world size"),
          "a wrong mesh must be refused: %s", rf_errmsg());
}

static int fault(rf_comm *c, int silent) {
    float x = 1, y = 0;
    OK(rf_comm_allreduce(c, &x, &y, 1, RF_COMM_F32, RF_COMM_SUM));
    rf_comm *half; /* a group split before the failure breaks with its world */
    OK(rf_comm_split(c, rank % 2, rank, &half));
    OK(rf_comm_barrier(c));
    if (rank == world - 1) {
        if (!silent) raise(SIGKILL);
        sleep(60); /* alive but silent: mpirun ends it once the others exit */
        return 0;
    }
    double t0 = rf_now();
    int rc = rf_comm_allreduce(c, &x, &y, 1, RF_COMM_F32, RF_COMM_SUM);
    double took = rf_now() - t0;
    if (rc == RF_OK) {
        fprintf(stderr, "FAIL rank %d: the all-reduce with a dead peer succeeded\n", rank);
        return 1;
    }
    fprintf(stderr, "rank %d: %s after %.1f s: %s\n", rank, rf_err_name(rc), took, rf_errmsg());
    /* The group is unusable now, and says so at once. */
    rc = rf_comm_barrier(c);
    if (rc == RF_OK || !strstr(rf_errmsg(), "unusable") || !rf_comm_broken(c)) {
        fprintf(stderr, "FAIL rank %d: a broken group took another call\n", rank);
        return 1;
    }
    t0 = rf_now();
    rc = rf_comm_allreduce(half, &x, &y, 1, RF_COMM_F32, RF_COMM_SUM);
    if (rc == RF_OK || !strstr(rf_errmsg(), "unusable") || rf_now() - t0 > 0.5) {
        fprintf(stderr, "FAIL rank %d: a group split from the broken world took a call\n", rank);
        return 1;
    }
    rf_comm_destroy(half);
    rf_comm_destroy(c);
    return 3;
}

/* Under REFINERY_COMM_SYNC_SEND=1 (comm.h's sync_send) on 2 ranks: a
 * blocking send matched by a receive already waiting completes; two ranks
 * that both send first wait for each other, which MPI's buffering of a small
 * message would otherwise hide: each must fail with the timeout (exit 3 after
 * printing it, as the fault modes). */
static int sync_send(rf_comm *c) {
    if (world != 2) {
        fprintf(stderr, "FAIL: sync-send needs 2 ranks, not %d\n", world);
        return 1;
    }
    int32_t v = rank, w = -1;
    int peer = rank ^ 1;
    if (rank == 0) {
        OK(rf_comm_send(c, &v, 1, RF_COMM_I32, peer));
        OK(rf_comm_recv(c, &w, 1, RF_COMM_I32, peer));
    } else {
        OK(rf_comm_recv(c, &w, 1, RF_COMM_I32, peer));
        OK(rf_comm_send(c, &v, 1, RF_COMM_I32, peer));
    }
    if (w != peer) {
        fprintf(stderr, "FAIL rank %d: matched pair got %d\n", rank, w);
        return 1;
    }
    OK(rf_comm_barrier(c));
    double t0 = rf_now();
    int rc = rf_comm_send(c, &v, 1, RF_COMM_I32, peer); /* both first: neither receives */
    double took = rf_now() - t0;
    if (rc == RF_OK) {
        fprintf(stderr, "FAIL rank %d: a synchronous send with no receive completed\n", rank);
        return 1;
    }
    fprintf(stderr, "rank %d: %s after %.1f s: %s\n", rank, rf_err_name(rc), took, rf_errmsg());
    rf_comm_destroy(c);
    return 3;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    rf_comm *c;
    OK(rf_comm_init_from_env(NULL, &c));
    rank = rf_comm_rank(c), world = rf_comm_world(c);
    if (world > 1 && strcmp(rf_comm_backend_name(c), "mpi") != 0) {
        fprintf(stderr, "FAIL: backend %s for %d ranks\n", rf_comm_backend_name(c), world);
        return 1;
    }
    if (strcmp(mode, "fault-kill") == 0) return fault(c, 0);
    if (strcmp(mode, "fault-silent") == 0) return fault(c, 1);
    if (strcmp(mode, "sync-send") == 0) return sync_send(c);
    double t0 = rf_now();
    size_t sizes[] = {1, 7, 1000003};
    for (int k = 0; k < 3; k++) {
        check_allreduce(c, sizes[k]);
        check_reduce_scatter(c, sizes[k]);
        check_allgather(c, sizes[k] / world + 1);
        check_broadcast(c, sizes[k], world - 1);
        check_ring(c, sizes[k]);
    }
    check_allreduce_types(c);
    check_async_overlap(c);
    check_split(c);
    check_meshes(c);
    OK(rf_comm_barrier(c));
    /* Every rank reports; the group fails if any rank saw a wrong value. */
    int32_t mine = failures, total = 0;
    OK(rf_comm_allreduce(c, &mine, &total, 1, RF_COMM_I32, RF_COMM_SUM));
    if (rank == 0)
        printf("mpi_check: %d ranks (%s): %s in %.2f s\n", world, rf_comm_backend_name(c),
               total ? "FAILED" : "all checks passed", rf_now() - t0);
    OK(rf_comm_destroy(c));
    return total ? 1 : 0;
}
