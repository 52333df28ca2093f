/* The 1F1B executor (trainer/pipeline.h) against one process, run by
 * tests/trainer/pp.test.sh under scripts/mpirun.sh.
 *
 * A toy model: a chain of 8 layers y = tanh(W x + b) of width 13, a squared
 * error loss on the last layer's output; micro-batch i has 1 to 4 rows (so
 * the boundary sizes change per micro-batch) and data that depend on the
 * data-parallel index too. Stage s of p holds layers [8s/p, 8(s+1)/p). Every
 * rank also runs the whole chain by itself, micro-batch after micro-batch (F0
 * B0 F1 B1 ..., one process's gradient accumulation), with the same layer
 * code, and compares its stage's weight and bias gradients and (last stage)
 * the loss: they must be bitwise equal (the same arithmetic in the same
 * order) and are reported as relative errors (bound 1e-6). The operations a
 * stage ran must be rf_pp_schedule's order. Meshes: pp = world, and at 4
 * ranks also dp 2 x pp 2 (the executor on the comm layer's pp sub-groups);
 * m = 1, 2, 4, 8 micro-batches; each with the overlapped executor and with
 * the paired one (pipeline.h), whose buffers come from the stage's alloc
 * filled with NaN and must all be given back. pp.test.sh runs this program
 * again with synchronous sends (REFINERY_COMM_SYNC_SEND=1), under which a
 * paired schedule that needed MPI's buffering would time out.
 *
 * Then the bubble: the same executor with stages that sleep (forward 10 ms,
 * backward 20 ms: equal stages whose timing does not depend on how many
 * cores the ranks share) for m = 8 (and 2 at 2 stages); each stage's measured
 * idle share must be within 0.06 of (p - 1) / (m + p - 1), in one of at most
 * 3 runs (test_bubble). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "common/error.h"
#include "trainer/pipeline.h"

#define LAYERS 8
#define D      13
#define TOL    1e-6

static rf_comm *g_world;
static int g_fail;

static void die(const char *what, int rc) {
    fprintf(stderr, "rank %d: %s: %s (%d)\n", rf_comm_rank(g_world), what, rf_errmsg(), rc);
    exit(2);
}
#define OK(x)                                                                                      \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) die(#x, rc_);                                                                     \
    } while (0)

static void *xcalloc(size_t n, size_t s) {
    void *p = calloc(n ? n : 1, s);
    if (!p) abort();
    return p;
}

static float rnd(uint64_t *s) { /* uniform in [-1, 1) */
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 8388608.0) - 1.0);
}

/* ---- the toy model ---- */

typedef struct toy {
    float *W, *b;   /* [LAYERS][D][D], [LAYERS][D] */
    float *dW, *db; /* gradients, same layout */
} toy;

static void toy_init(toy *t) {
    uint64_t s = 7;
    t->W = xcalloc((size_t)LAYERS * D * D, sizeof(float));
    t->b = xcalloc((size_t)LAYERS * D, sizeof(float));
    t->dW = xcalloc((size_t)LAYERS * D * D, sizeof(float));
    t->db = xcalloc((size_t)LAYERS * D, sizeof(float));
    for (size_t i = 0; i < (size_t)LAYERS * D * D; i++)
        t->W[i] = 0.5f * rnd(&s);
    for (size_t i = 0; i < (size_t)LAYERS * D; i++)
        t->b[i] = 0.2f * rnd(&s);
}

static void toy_free(toy *t) {
    free(t->W);
    free(t->b);
    free(t->dW);
    free(t->db);
}

static int rows_of(int micro, int dp_i) {
    return 1 + (micro * 3 + dp_i) % 4;
}

/* Micro-batch i's input x and target y, [rows, D] each. */
static void micro_data(int micro, int dp_i, float *x, float *y) {
    uint64_t s = 1000 + 37 * (uint64_t)micro + 1000003 * (uint64_t)dp_i;
    int n = rows_of(micro, dp_i);
    for (int k = 0; k < n * D; k++)
        x[k] = rnd(&s);
    for (int k = 0; k < n * D; k++)
        y[k] = 0.8f * rnd(&s);
}

static void layer_fwd(const toy *t, int l, const float *x, float *y, int n) {
    const float *W = t->W + (size_t)l * D * D, *b = t->b + (size_t)l * D;
    for (int r = 0; r < n; r++)
        for (int o = 0; o < D; o++) {
            float z = b[o];
            for (int i = 0; i < D; i++)
                z += W[o * D + i] * x[r * D + i];
            y[r * D + o] = tanhf(z);
        }
}

/* dx += d(loss)/dx; dW, db accumulate. dy is the gradient of y. */
static void layer_bwd(toy *t, int l, const float *x, const float *y, const float *dy, float *dx,
                      int n) {
    const float *W = t->W + (size_t)l * D * D;
    float *dW = t->dW + (size_t)l * D * D, *db = t->db + (size_t)l * D;
    for (int r = 0; r < n; r++)
        for (int o = 0; o < D; o++) {
            float dz = dy[r * D + o] * (1.0f - y[r * D + o] * y[r * D + o]);
            db[o] += dz;
            for (int i = 0; i < D; i++) {
                dW[o * D + i] += dz * x[r * D + i];
                if (dx) dx[r * D + i] += dz * W[o * D + i];
            }
        }
}

/* Squared error 0.5 * sum (y - target)^2 / m over a micro-batch; dy = (y - target) / m. */
static double loss_bwd(const float *y, const float *target, float *dy, int n, int m) {
    double loss = 0;
    for (int k = 0; k < n * D; k++) {
        float e = y[k] - target[k];
        loss += 0.5 * (double)e * e / m;
        dy[k] = e / (float)m;
    }
    return loss;
}

/* Layers [l0, l1) on micro-batch rows n: forward from acts[0] (the input),
 * acts[k] the output of layer l0 + k - 1. */
static void range_fwd(const toy *t, int l0, int l1, float **acts, int n) {
    for (int l = l0; l < l1; l++)
        layer_fwd(t, l, acts[l - l0], acts[l - l0 + 1], n);
}

/* Backward of layers [l1-1 .. l0]; dy the gradient of the range's output;
 * din (NULL: not wanted) += the gradient of its input. */
static void range_bwd(toy *t, int l0, int l1, float **acts, const float *dy, float *din, int n) {
    float *g = xcalloc((size_t)n * D, sizeof(float)), *gx = xcalloc((size_t)n * D, sizeof(float));
    memcpy(g, dy, (size_t)n * D * sizeof(float));
    for (int l = l1 - 1; l >= l0; l--) {
        float *dx = l == l0 ? din : gx;
        if (dx == gx) memset(gx, 0, (size_t)n * D * sizeof(float));
        layer_bwd(t, l, acts[l - l0], acts[l - l0 + 1], g, dx, n);
        if (dx == gx) memcpy(g, gx, (size_t)n * D * sizeof(float));
    }
    free(g);
    free(gx);
}

/* One process: F0 B0 F1 B1 ... over the whole chain; returns the summed loss. */
static double reference(toy *t, int m, int dp_i) {
    double loss = 0;
    for (int i = 0; i < m; i++) {
        int n = rows_of(i, dp_i);
        float *acts[LAYERS + 1], *target = xcalloc((size_t)n * D, sizeof(float)),
                                 *dy = xcalloc((size_t)n * D, sizeof(float));
        for (int k = 0; k <= LAYERS; k++)
            acts[k] = xcalloc((size_t)n * D, sizeof(float));
        micro_data(i, dp_i, acts[0], target);
        range_fwd(t, 0, LAYERS, acts, n);
        loss += loss_bwd(acts[LAYERS], target, dy, n, m);
        range_bwd(t, 0, LAYERS, acts, dy, NULL, n);
        for (int k = 0; k <= LAYERS; k++)
            free(acts[k]);
        free(target);
        free(dy);
    }
    return loss;
}

/* ---- the stage ---- */

typedef struct stage {
    toy *t;
    int p, s, m, dp_i, l0, l1;
    float ***acts; /* per micro-batch: the range's activations, kept from forward to backward */
    double loss;
    rf_pp_op *ran; /* the operations in the order they ran */
    int nran;
    double sleep_f; /* seconds: the sleeping stages of the bubble test (then no arithmetic) */
    long live;      /* buffers of st_alloc not yet released (paired runs) */
} stage;

/* The paired executor's buffers: malloc'd and filled with NaN, so a stage
 * that read a buffer before it was written would show it in the checks. */
static float *st_alloc(void *user, size_t n) {
    stage *s = user;
    float *p = xcalloc(n, sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    s->live++;
    return p;
}

static void st_release(void *user, float *p) {
    stage *s = user;
    s->live--;
    free(p);
}

static size_t st_boundary(void *user, int edge, int micro) {
    stage *s = user;
    (void)edge; /* every layer keeps the width */
    return (size_t)rows_of(micro, s->dp_i) * D;
}

static void nap(double sec) {
    struct timespec ts = {(time_t)sec, (long)((sec - (double)(time_t)sec) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static int st_forward(void *user, int micro, const float *in, float *out) {
    stage *s = user;
    s->ran[s->nran++] = (rf_pp_op){RF_PP_FWD, micro};
    if (s->sleep_f > 0) {
        nap(s->sleep_f);
        return RF_OK;
    }
    int n = rows_of(micro, s->dp_i), nl = s->l1 - s->l0;
    float **a = s->acts[micro] = xcalloc((size_t)nl + 1, sizeof(float *));
    for (int k = 0; k <= nl; k++)
        a[k] = xcalloc((size_t)n * D, sizeof(float));
    if (s->s == 0) {
        float *target = xcalloc((size_t)n * D, sizeof(float));
        micro_data(micro, s->dp_i, a[0], target);
        free(target);
    } else {
        memcpy(a[0], in, (size_t)n * D * sizeof(float));
    }
    range_fwd(s->t, s->l0, s->l1, a, n);
    if (out) memcpy(out, a[nl], (size_t)n * D * sizeof(float));
    return RF_OK;
}

static int st_backward(void *user, int micro, const float *in, const float *dout, float *din) {
    stage *s = user;
    (void)in;
    s->ran[s->nran++] = (rf_pp_op){RF_PP_BWD, micro};
    if (s->sleep_f > 0) {
        nap(2 * s->sleep_f);
        return RF_OK;
    }
    int n = rows_of(micro, s->dp_i), nl = s->l1 - s->l0;
    float **a = s->acts[micro];
    float *dy = xcalloc((size_t)n * D, sizeof(float));
    if (s->s == s->p - 1) { /* the loss */
        float *x = xcalloc((size_t)n * D, sizeof(float)), *target = xcalloc((size_t)n * D, 4);
        micro_data(micro, s->dp_i, x, target);
        s->loss += loss_bwd(a[nl], target, dy, n, s->m);
        free(x);
        free(target);
    } else {
        memcpy(dy, dout, (size_t)n * D * sizeof(float));
    }
    if (din) memset(din, 0, (size_t)n * D * sizeof(float)); /* range_bwd adds into it */
    range_bwd(s->t, s->l0, s->l1, a, dy, din, n);
    free(dy);
    for (int k = 0; k <= nl; k++)
        free(a[k]);
    free(a);
    s->acts[micro] = NULL;
    return RF_OK;
}

/* Largest |a - b| over the largest |b|, and whether every element is equal. */
static double rel_err(const float *a, const float *b, size_t n, int *bitwise) {
    double worst = 0, scale = 0;
    *bitwise = memcmp(a, b, n * sizeof *a) == 0;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(b[i]));
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
    }
    return scale > 0 ? worst / scale : worst;
}

static void report(const char *mesh, const char *what, double err, int bitwise) {
    double e = err;
    int bw = bitwise;
    OK(rf_comm_allreduce(g_world, &e, &e, 1, RF_COMM_F64, RF_COMM_MAX));
    OK(rf_comm_allreduce(g_world, &bw, &bw, 1, RF_COMM_I32, RF_COMM_MIN));
    int bad = !(e <= TOL) || !bw;
    if (rf_comm_rank(g_world) == 0)
        printf("%-5s %-22s %-28s rel err %.2e %s\n", bad ? "FAIL" : "ok", mesh, what, e,
               bw ? "(bitwise)" : "(not bitwise)");
    g_fail |= bad;
}

/* The stage callbacks, for the overlapped or the paired executor. */
static rf_pp_stage callbacks(stage *st, bool paired) {
    return (rf_pp_stage){.user = st,
                         .boundary = st_boundary,
                         .forward = st_forward,
                         .backward = st_backward,
                         .paired = paired,
                         .alloc = paired ? st_alloc : NULL,
                         .release = paired ? st_release : NULL};
}

static void test_equiv(rf_comm *pp, int dp_i, int m, const char *meshname, bool paired) {
    int p = rf_comm_world(pp), s = rf_comm_rank(pp);
    toy run, ref;
    toy_init(&run);
    toy_init(&ref);
    stage st = {.t = &run, .p = p, .s = s, .m = m, .dp_i = dp_i};
    st.l0 = LAYERS * s / p;
    st.l1 = LAYERS * (s + 1) / p;
    st.acts = xcalloc((size_t)m, sizeof *st.acts);
    st.ran = xcalloc(2 * (size_t)m, sizeof *st.ran);
    rf_pp_stage cb = callbacks(&st, paired);
    rf_pp_stats stats;
    OK(rf_pp_run(pp, m, &cb, &stats));
    double loss_ref = reference(&ref, m, dp_i);

    char what[64], mesh[64];
    snprintf(mesh, sizeof mesh, "%s m=%d%s", meshname, m, paired ? " paired" : "");
    /* the order the operations ran in */
    rf_pp_op *want = xcalloc(2 * (size_t)m, sizeof *want);
    OK(rf_pp_schedule(p, s, m, want));
    int order_ok = st.nran == 2 * m && !memcmp(want, st.ran, 2 * (size_t)m * sizeof *want);
    OK(rf_comm_allreduce(g_world, &order_ok, &order_ok, 1, RF_COMM_I32, RF_COMM_MIN));
    if (rf_comm_rank(g_world) == 0)
        printf("%-5s %-22s %-28s\n", order_ok ? "ok" : "FAIL", mesh, "ops in rf_pp_schedule order");
    g_fail |= !order_ok;

    int bw;
    size_t w0 = (size_t)st.l0 * D * D, nw = (size_t)(st.l1 - st.l0) * D * D;
    double e = rel_err(run.dW + w0, ref.dW + w0, nw, &bw);
    snprintf(what, sizeof what, "weight gradients");
    report(mesh, what, e, bw);
    e = rel_err(run.db + (size_t)st.l0 * D, ref.db + (size_t)st.l0 * D, (size_t)(st.l1 - st.l0) * D,
                &bw);
    report(mesh, "bias gradients", e, bw);
    if (s == p - 1) {
        bw = st.loss == loss_ref;
        e = fabs(st.loss - loss_ref) / fmax(fabs(loss_ref), 1e-30);
    } else {
        bw = 1, e = 0;
    }
    report(mesh, "loss (last stage)", e, bw);
    /* nothing left in flight */
    int clean = 1;
    for (int i = 0; i < m; i++)
        clean &= st.acts[i] == NULL;
    clean &= st.live == 0; /* every buffer of st_alloc given back */
    OK(rf_comm_allreduce(g_world, &clean, &clean, 1, RF_COMM_I32, RF_COMM_MIN));
    if (!clean) {
        if (rf_comm_rank(g_world) == 0) printf("FAIL  %-22s activations left over\n", mesh);
        g_fail = 1;
    }
    if (rf_comm_rank(g_world) == 0)
        printf("      %-22s stage 0: peak boundary floats %zu, sent %llu B\n", mesh,
               stats.peak_floats, (unsigned long long)stats.bytes_sent);
    free(want);
    free(st.acts);
    free(st.ran);
    toy_free(&run);
    toy_free(&ref);
}

/* Sleeping stages: each one's measured idle share against the theory. A
 * rank that the OS does not wake on time (4 ranks share 2 cores, beside other
 * work) adds idle time that is not the schedule's, so a run outside the
 * bound is repeated, up to 3 runs; every run is printed, and the check fails
 * when none is within it. */
static void test_bubble(rf_comm *pp, int m, const char *meshname, bool paired) {
    int p = rf_comm_world(pp), s = rf_comm_rank(pp);
    stage st = {.p = p, .s = s, .m = m, .sleep_f = 0.010};
    st.ran = xcalloc(2 * (size_t)m, sizeof *st.ran);
    rf_pp_stage cb = callbacks(&st, paired);
    char nm[64];
    snprintf(nm, sizeof nm, "%s%s", meshname, paired ? " paired" : "");
    int bad = 1;
    for (int run = 1; run <= 3 && bad; run++) {
        rf_pp_stats stats;
        OK(rf_pp_run(pp, m, &cb, &stats));
        double lo = stats.bubble, hi = stats.bubble, step = stats.step_s;
        OK(rf_comm_allreduce(g_world, &lo, &lo, 1, RF_COMM_F64, RF_COMM_MIN));
        OK(rf_comm_allreduce(g_world, &hi, &hi, 1, RF_COMM_F64, RF_COMM_MAX));
        OK(rf_comm_allreduce(g_world, &step, &step, 1, RF_COMM_F64, RF_COMM_MAX));
        bad = !(fabs(lo - stats.theory) <= 0.06 && fabs(hi - stats.theory) <= 0.06);
        if (rf_comm_rank(g_world) == 0)
            printf("%-5s %-22s bubble (sleeping stages, F 10 ms, B 20 ms) measured %.3f..%.3f "
                   "over the stages, theory (p-1)/(m+p-1) = %.3f, step %.3f s (run %d of at most "
                   "3)\n",
                   bad ? (run < 3 ? "again" : "FAIL") : "ok", nm, lo, hi, stats.theory, step, run);
        st.nran = 0; /* the next run records its operations afresh */
    }
    g_fail |= bad;
    free(st.ran);
}

int main(void) {
    OK(rf_comm_init_from_env(NULL, &g_world));
    int world = rf_comm_world(g_world);
    int meshes[2][2] = {{1, world}, {2, world / 2}}; /* {dp, pp} */
    int nmesh = world == 4 ? 2 : 1;
    for (int k = 0; k < nmesh; k++) {
        rf_comm_mesh mesh;
        OK(rf_comm_mesh_init(g_world, meshes[k][0], 1, meshes[k][1], &mesh));
        char name[32];
        snprintf(name, sizeof name, "dp%d x pp%d", mesh.dp, mesh.pp);
        for (int paired = 0; paired < 2; paired++) {
            for (int m = 1; m <= 8; m *= 2)
                test_equiv(mesh.pp_comm, mesh.dp_i, m, name, paired);
            if (mesh.pp > 1 && mesh.dp == 1) {
                test_bubble(mesh.pp_comm, 8, name, paired);
                if (mesh.pp == 2) test_bubble(mesh.pp_comm, 2, name, paired);
            }
        }
        OK(rf_comm_mesh_destroy(&mesh));
    }
    if (rf_comm_rank(g_world) == 0 && !g_fail) printf("all checks passed at %d rank(s)\n", world);
    rf_comm_destroy(g_world);
    return g_fail;
}
