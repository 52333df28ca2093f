/* Every CUDA kernel against its CPU twin, through the two backends' tables
 * (backend.h), on several shapes including odd ones (1 row, channel counts
 * that are not multiples of 32, padded keys, Tq = 1). fp32 criterion: the
 * norm-wise relative error ||gpu - cpu|| / ||cpu|| within 1e-5; dropout masks
 * bit for bit (the same hash on both devices). Backward kernels start from
 * non-zero gradients, so accumulation (+=) is checked too. The cuda-bf16
 * backend's products (linear, Conv1D, the LM head, both attentions: bf16
 * tensor cores) within a stated 1e-2.
 * LoRA's slots (lora, qlinear) likewise; the quantized weights' dequantization
 * (int8, nf4, q4_1) bit for bit.
 *
 * Without a CUDA build or a GPU every case is skipped and says why (`make
 * test-gpu` runs them on a GPU machine); they never pass without running. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../support/skip.h"
#include "common/error.h"
#include "common/rng.h"
#include "parity_util.h"
#include "trainer/backend.h"
#include "trainer/ops.h"
#include "trainer/ops_causal.h"
#include "trainer/quant.h"
#ifdef REFINERY_CUDA_EMU
#include <cuda_runtime.h> /* cuemu_host_waits, the emulator's test hook */
#endif

#define TOL 1e-5

static const rf_backend *gpu, *cpu;
static rf_rng rng;

static void need_gpu(void) {
    cpu = rf_backend_cpu();
    if (rf_backend_for("cuda", &gpu)) RF_SKIP("%s", rf_errmsg());
    rf_rng_seed(&rng, 7);
}

static float *rnd(size_t n, float lo, float hi) {
    float *x = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)rf_rng_double(&rng);
    return x;
}

static void *up(const void *h, size_t bytes) {
    void *d = NULL;
    if (gpu->alloc(gpu, &d, bytes)) fail_msg("alloc: %s", rf_errmsg());
    if (h && gpu->to_device(gpu, d, h, bytes)) fail_msg("to_device: %s", rf_errmsg());
    return d;
}

/* The device buffer d into a new host array of n floats. */
static float *down(const void *d, size_t n) {
    float *h = malloc(n * sizeof(float) + 4);
    if (gpu->to_host(gpu, h, d, n * sizeof(float))) fail_msg("to_host: %s", rf_errmsg());
    return h;
}

/* Fills the device buffer d (n floats) with NaNs: what a kernel must write. */
static void scribble(void *d, size_t n) {
    void *h = malloc(n * sizeof(float) + 4);
    memset(h, 0xff, n * sizeof(float));
    if (gpu->to_device(gpu, d, h, n * sizeof(float))) fail_msg("to_device: %s", rf_errmsg());
    free(h);
}

static void gfree(void *d) {
    assert_int_equal(gpu->free(gpu, d), RF_OK);
}

/* Compares the device result d with the host one h (n floats). */
static void check(const char *what, const void *d, const float *h, size_t n, double tol) {
    float *g = down(d, n);
    double e = rel_err_floor(g, h, n, 1e-12);
    print_message("  %-34s n=%-9zu rel %.2e\n", what, n, e);
    if (!(e <= tol)) fail_msg("%s: relative error %.3e above %.0e", what, e, tol);
    free(g);
}

/* The emulator's count of device operations (tests/cuda_emu): a product
 * with a bias is one cuBLASLt call (its epilogue adds the bias; matmul.cu),
 * or two (the bias kernel, then cublasGemmEx) where cuBLASLt is not used.
 * A real GPU does not count them: ops_expect checks only on the emulator. */
static uint64_t ops_now(void) {
#ifdef REFINERY_CUDA_EMU
    return cuemu_device_ops();
#else
    return 0;
#endif
}

static void ops_expect(const char *what, uint64_t o0, uint64_t n) {
#ifdef REFINERY_CUDA_EMU
    uint64_t got = cuemu_device_ops() - o0;
    print_message("  %-34s %llu device operation(s)\n", what, (unsigned long long)got);
    if (got != n)
        fail_msg("%s: %llu device operations, expected %llu", what, (unsigned long long)got,
                 (unsigned long long)n);
#else
    (void)what, (void)o0, (void)n;
#endif
}

/* A copy of b (n floats) on the device 4 bytes past a 16-byte boundary, where
 * cuBLASLt's bias epilogue is not used; *base is the block to free. */
static float *up_unaligned(const float *b, int n, void **base) {
    *base = up(NULL, ((size_t)n + 1) * 4);
    float *p = (float *)((char *)*base + 4);
    if (gpu->to_device(gpu, p, b, (size_t)n * 4)) fail_msg("to_device: %s", rf_errmsg());
    return p;
}

/* A biased product's fallback (the bias kernel, then the product: two
 * operations) with the bias b copied 4 bytes past alignment, against the
 * host result want (N x OC). fwd is linear_fwd or conv1d_fwd. */
typedef int (*biased_fwd)(const rf_backend *, float *, const float *, const float *, const float *,
                          int, int, int);
static void unaligned_bias_case(const char *what, biased_fwd fwd, void *g_out, const void *g_x,
                                const void *g_w, const float *b, const float *want, int N, int IC,
                                int OC, double tol) {
    void *base;
    float *b4 = up_unaligned(b, OC, &base);
    uint64_t o0 = ops_now();
    assert_int_equal(fwd(gpu, g_out, g_x, g_w, b4, N, IC, OC), 0);
    ops_expect(what, o0, 2);
    check(what, g_out, want, (size_t)N * OC, tol);
    gfree(base);
}

static void check_exact(const char *what, const void *d, const float *h, size_t n) {
    float *g = down(d, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp(&g[i], &h[i], sizeof(float)) != 0;
    print_message("  %-34s n=%-9zu %zu differ\n", what, n, bad);
    if (bad) fail_msg("%s: %zu of %zu elements differ (expected bit for bit)", what, bad, n);
    free(g);
}

static void test_embedding(void **state) {
    (void)state;
    need_gpu();
    static const int shapes[][5] = {{1, 1, 1, 3, 1}, {2, 7, 37, 11, 2}, {4, 128, 384, 1000, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], V = shapes[s][3],
            TV = shapes[s][4];
        size_t N = (size_t)B * T;
        int32_t *ids = malloc(N * 4), *types = malloc(N * 4);
        for (size_t i = 0; i < N; i++) { /* few distinct ids: repeated rows accumulate */
            ids[i] = (int32_t)rf_rng_below(&rng, (uint64_t)(V < 5 ? V : 5));
            types[i] = (int32_t)rf_rng_below(&rng, (uint64_t)TV);
        }
        float *wte = rnd((size_t)V * C, -1, 1), *wpe = rnd((size_t)T * C, -1, 1),
              *wtt = rnd((size_t)TV * C, -1, 1), *out = rnd(N * C, 0, 0), *dout = rnd(N * C, -1, 1),
              *dwte = rnd((size_t)V * C, -1, 1), *dwpe = rnd((size_t)T * C, -1, 1),
              *dwtt = rnd((size_t)TV * C, -1, 1);
        void *g_ids = up(ids, N * 4), *g_types = up(types, N * 4),
             *g_wte = up(wte, (size_t)V * C * 4), *g_wpe = up(wpe, (size_t)T * C * 4),
             *g_wtt = up(wtt, (size_t)TV * C * 4), *g_out = up(NULL, N * C * 4),
             *g_dout = up(dout, N * C * 4), *g_dwte = up(dwte, (size_t)V * C * 4),
             *g_dwpe = up(dwpe, (size_t)T * C * 4), *g_dwtt = up(dwtt, (size_t)TV * C * 4);
        print_message("embedding B=%d T=%d C=%d V=%d\n", B, T, C, V);
        cpu->embed_fwd(cpu, out, ids, types, wte, wpe, wtt, B, T, C);
        assert_int_equal(gpu->embed_fwd(gpu, g_out, g_ids, g_types, g_wte, g_wpe, g_wtt, B, T, C),
                         0);
        check("embed_fwd", g_out, out, N * C, TOL);
        cpu->embed_bwd(cpu, dwte, dwpe, dwtt, dout, ids, types, B, T, C, V, TV);
        assert_int_equal(
            gpu->embed_bwd(gpu, g_dwte, g_dwpe, g_dwtt, g_dout, g_ids, g_types, B, T, C, V, TV), 0);
        check("embed_bwd dwte", g_dwte, dwte, (size_t)V * C, TOL);
        check("embed_bwd dwpe", g_dwpe, dwpe, (size_t)T * C, TOL);
        check("embed_bwd dwtt", g_dwtt, dwtt, (size_t)TV * C, TOL);
        void *gs[] = {g_ids, g_types, g_wte, g_wpe, g_wtt, g_out, g_dout, g_dwte, g_dwpe, g_dwtt};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(ids), free(types), free(wte), free(wpe), free(wtt), free(out), free(dout);
        free(dwte), free(dwpe), free(dwtt);
    }
}

static void test_layernorm(void **state) {
    (void)state;
    need_gpu();
    static const int shapes[][2] = {{1, 5}, {7, 37}, {300, 384}, {64, 768}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t n = (size_t)N * C;
        float *x = rnd(n, -3, 3), *w = rnd(C, 0.5f, 1.5f), *b = rnd(C, -0.5f, 0.5f),
              *out = rnd(n, 0, 0), *mean = rnd(N, 0, 0), *rstd = rnd(N, 0, 0),
              *dout = rnd(n, -1, 1), *dx = rnd(n, -1, 1), *dw = rnd(C, -1, 1), *db = rnd(C, -1, 1);
        void *g_x = up(x, n * 4), *g_w = up(w, C * 4), *g_b = up(b, C * 4),
             *g_out = up(NULL, n * 4), *g_mean = up(NULL, N * 4), *g_rstd = up(NULL, N * 4),
             *g_dout = up(dout, n * 4), *g_dx = up(dx, n * 4), *g_dw = up(dw, C * 4),
             *g_db = up(db, C * 4);
        print_message("layernorm N=%d C=%d\n", N, C);
        cpu->layernorm_fwd(cpu, out, mean, rstd, x, w, b, N, C, 1e-12f);
        assert_int_equal(
            gpu->layernorm_fwd(gpu, g_out, g_mean, g_rstd, g_x, g_w, g_b, N, C, 1e-12f), 0);
        check("layernorm_fwd out", g_out, out, n, TOL);
        check("layernorm_fwd mean", g_mean, mean, N, TOL);
        check("layernorm_fwd rstd", g_rstd, rstd, N, TOL);
        cpu->layernorm_bwd(cpu, dx, dw, db, dout, x, w, mean, rstd, N, C);
        assert_int_equal(
            gpu->layernorm_bwd(gpu, g_dx, g_dw, g_db, g_dout, g_x, g_w, g_mean, g_rstd, N, C), 0);
        check("layernorm_bwd dinp", g_dx, dx, n, TOL);
        check("layernorm_bwd dw", g_dw, dw, C, TOL);
        check("layernorm_bwd db", g_db, db, C, TOL);
        /* a frozen LayerNorm (LoRA's base): dw, db NULL, dinp accumulated again */
        cpu->layernorm_bwd(cpu, dx, NULL, NULL, dout, x, w, mean, rstd, N, C);
        assert_int_equal(
            gpu->layernorm_bwd(gpu, g_dx, NULL, NULL, g_dout, g_x, g_w, g_mean, g_rstd, N, C), 0);
        check("layernorm_bwd dinp (frozen)", g_dx, dx, n, TOL);
        void *gs[] = {g_x, g_w, g_b, g_out, g_mean, g_rstd, g_dout, g_dx, g_dw, g_db};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(x), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dx);
        free(dw), free(db);
    }
}

/* The linear layer on gpu (the fp32 backend, or cuda-bf16) within tol. */
static void linear_cases(double tol) {
    /* N, IC, OC, with bias, with dinp */
    static const int shapes[][5] = {
        {1, 3, 5, 1, 1}, {13, 37, 29, 1, 0}, {33, 384, 2, 0, 1}, {256, 384, 1536, 1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2], hb = shapes[s][3],
            hd = shapes[s][4];
        size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;
        float *x = rnd(ni, -1, 1), *w = rnd(nw, -0.1f, 0.1f), *b = rnd(OC, -1, 1),
              *out = rnd(no, 0, 0), *dout = rnd(no, -1, 1), *dx = rnd(ni, -1, 1),
              *dw = rnd(nw, -1, 1), *db = rnd(OC, -1, 1);
        void *g_x = up(x, ni * 4), *g_w = up(w, nw * 4), *g_b = up(b, OC * 4),
             *g_out = up(NULL, no * 4), *g_dout = up(dout, no * 4), *g_dx = up(dx, ni * 4),
             *g_dw = up(dw, nw * 4), *g_db = up(db, OC * 4);
        print_message("linear N=%d IC=%d OC=%d bias=%d dinp=%d\n", N, IC, OC, hb, hd);
        cpu->linear_fwd(cpu, out, x, w, hb ? b : NULL, N, IC, OC);
        uint64_t o0 = ops_now();
        assert_int_equal(gpu->linear_fwd(gpu, g_out, g_x, g_w, hb ? g_b : NULL, N, IC, OC), 0);
        ops_expect("linear_fwd", o0, 1);
        check("linear_fwd", g_out, out, no, tol);
        if (hb)
            unaligned_bias_case("linear_fwd (bias unaligned)", gpu->linear_fwd, g_out, g_x, g_w, b,
                                out, N, IC, OC, tol);
        cpu->linear_bwd(cpu, hd ? dx : NULL, dw, hb ? db : NULL, dout, x, w, N, IC, OC);
        assert_int_equal(gpu->linear_bwd(gpu, hd ? g_dx : NULL, g_dw, hb ? g_db : NULL, g_dout, g_x,
                                         g_w, N, IC, OC),
                         0);
        check("linear_bwd dinp", g_dx, dx, ni, tol);
        check("linear_bwd dw", g_dw, dw, nw, tol);
        check("linear_bwd db", g_db, db, OC, TOL); /* fp32 in both modes */
        if (hd) { /* a frozen weight (LoRA's base): dw and db NULL, dinp again */
            cpu->linear_bwd(cpu, dx, NULL, NULL, dout, x, w, N, IC, OC);
            assert_int_equal(gpu->linear_bwd(gpu, g_dx, NULL, NULL, g_dout, g_x, g_w, N, IC, OC),
                             0);
            check("linear_bwd dinp (frozen)", g_dx, dx, ni, tol);
        }
        void *gs[] = {g_x, g_w, g_b, g_out, g_dout, g_dx, g_dw, g_db};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(x), free(w), free(b), free(out), free(dout), free(dx), free(dw), free(db);
    }
}

static void test_linear(void **state) {
    (void)state;
    need_gpu();
    linear_cases(TOL);
}

#ifdef REFINERY_CUDA_EMU
/* What a GPU whose cuBLASLt has no pedantic fp32 algorithm, or none at all,
 * gets (the emulator's heuristic told to refuse them; new shapes, so that
 * new plans are made): plain fp32 compute in the epilogue, then the bias
 * kernel and cublasGemmEx; the same result within TOL either way. Built on
 * the emulator only (a GPU's heuristic cannot be told to refuse). */
static void test_linear_lt_fallbacks(void **state) {
    (void)state;
    need_gpu();
    static const int shapes[][3] = {{5, 7, 11}, {6, 9, 13}}; /* N, IC, OC */
    for (int s = 0; s < 2; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;
        float *x = rnd(ni, -1, 1), *w = rnd(nw, -0.1f, 0.1f), *b = rnd(OC, -1, 1),
              *out = rnd(no, 0, 0);
        void *g_x = up(x, ni * 4), *g_w = up(w, nw * 4), *g_b = up(b, OC * 4),
             *g_out = up(NULL, no * 4);
        cpu->linear_fwd(cpu, out, x, w, b, N, IC, OC);
        cuemu_lt_refuse(s == 0, s == 1);
        uint64_t o0 = ops_now();
        int rc = gpu->linear_fwd(gpu, g_out, g_x, g_w, g_b, N, IC, OC);
        cuemu_lt_refuse(0, 0);
        assert_int_equal(rc, 0);
        ops_expect(s == 0 ? "linear_fwd (no pedantic algorithm)" : "linear_fwd (no algorithm)", o0,
                   s == 0 ? 1 : 2);
        check("linear_fwd", g_out, out, no, TOL);
        void *gs[] = {g_x, g_w, g_b, g_out};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(x), free(w), free(b), free(out);
    }
}
#endif

/* cuda-bf16: the products' inputs rounded to bf16 (8 significant bits),
 * accumulated in fp32: stated tolerance 1e-2 norm-wise (the rounding of two
 * inputs, about 2^-8 each, averaged over the summed dimension). */
static void test_linear_bf16(void **state) {
    (void)state;
    need_gpu();
    if (rf_backend_for("cuda-bf16", &gpu)) RF_SKIP("%s", rf_errmsg());
    linear_cases(1e-2);
}

/* Attention on gpu (the fp32 backend, or cuda-bf16) within tol. With
 * `fused` (cuda-bf16), a forward that does not keep the probabilities runs
 * the fused kernel (flash_attention.cu: one launch) for head sizes up to 64,
 * here 12 and 48 (padded to 16 and 48) and 32 and 64, over whole and partial
 * query and key tiles, with and without dropout, and on a tensor-parallel
 * shard's heads (the dropout masks of the global heads); so do the
 * backward's recompute (one launch) and the backward (two). Head size 80
 * takes the unfused path on both backends. */
static void attention_cases(double tol, bool fused) {
    /* B, T, Tq, C, NH, dropout x 100, h0, NHall (a tensor-parallel shard's
     * heads [h0, h0 + NH) of NHall: the dropout masks of the global heads) */
    static const int shapes[][8] = {
        {1, 1, 1, 32, 1, 0, 0, 1},      {2, 13, 13, 36, 3, 0, 0, 3},
        {2, 13, 1, 36, 3, 10, 0, 3},    {3, 128, 128, 384, 12, 10, 0, 12},
        {2, 128, 1, 384, 12, 0, 0, 12}, {1, 512, 512, 128, 2, 10, 0, 2},
        {2, 13, 13, 36, 3, 10, 3, 6},   {3, 128, 128, 192, 6, 10, 6, 12},
        {2, 128, 1, 192, 6, 10, 0, 12}, {2, 150, 150, 128, 2, 0, 0, 2},
        {3, 70, 1, 96, 2, 0, 0, 2},     {2, 70, 70, 160, 2, 10, 0, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], Tq = shapes[s][2], C = shapes[s][3],
            NH = shapes[s][4], h0 = shapes[s][6], NHall = shapes[s][7];
        float p = (float)shapes[s][5] / 100.0f;
        uint64_t seed = 12345 + s;
        size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * Tq * C,
               natt = (size_t)B * NH * Tq * T;
        uint8_t *valid = malloc((size_t)B * T);
        for (int b = 0; b < B; b++) /* sequence b keeps T - 3b keys (at least 1) */
            for (int t = 0; t < T; t++)
                valid[b * T + t] = t < (T - 3 * b > 1 ? T - 3 * b : 1);
        float *qkv = rnd(nqkv, -1, 1), *out = rnd(nout, 0, 0), *att = rnd(natt, 0, 0),
              *scr = rnd(natt, 0, 0), *dout = rnd(nout, -1, 1), *dqkv = rnd(nqkv, -1e-2f, 1e-2f);
        void *g_valid = up(valid, (size_t)B * T), *g_qkv = up(qkv, nqkv * 4),
             *g_out = up(NULL, nout * 4), *g_att = up(NULL, natt * 4), *g_scr = up(NULL, natt * 4),
             *g_dout = up(dout, nout * 4), *g_dqkv = up(dqkv, nqkv * 4);
        print_message("attention B=%d T=%d Tq=%d C=%d NH=%d p=%.2f heads [%d, %d) of %d\n", B, T,
                      Tq, C, NH, p, h0, h0 + NH, NHall);
        cpu->attention_fwd(cpu, out, att, scr, qkv, valid, B, T, Tq, C, NH, h0, NHall, p, seed);
        assert_int_equal(gpu->attention_fwd(gpu, g_out, g_att, g_scr, g_qkv, g_valid, B, T, Tq, C,
                                            NH, h0, NHall, p, seed),
                         0);
        check("attention_fwd out", g_out, out, nout, tol);
        check("attention_fwd att", g_att, att, natt, tol);
        /* att NULL (not kept: the model's forward, whose backward recomputes
         * them): the same output, made from the scratch */
        scribble(g_out, nout), scribble(g_scr, natt);
        uint64_t o0 = ops_now();
        assert_int_equal(gpu->attention_fwd(gpu, g_out, NULL, g_scr, g_qkv, g_valid, B, T, Tq, C,
                                            NH, h0, NHall, p, seed),
                         0);
        int hs = C / NH;
        bool one = fused && hs <= 64, stats = !one;
        /* the models size att and the scratch by it (B NH Tq floats, or B NH Tq T) */
        assert_int_equal(gpu->attention_stats(gpu, hs, &stats), 0);
        assert_true(stats == one);
        /* lists, scores, softmax, values; or the fused kernel */
        ops_expect(one ? "attention_fwd, no att (fused)" : "attention_fwd, no att", o0,
                   one ? 1 : 4);
        check("attention_fwd out (no att)", g_out, out, nout, tol);
        assert_int_equal(gpu->attention_fwd(gpu, NULL, NULL, g_scr, g_qkv, g_valid, B, T, Tq, C, NH,
                                            h0, NHall, p, seed),
                         RF_ERR_INVALID);
        /* the backward's recompute: the probabilities only (out NULL: no values
         * product), over NaNs; the backward below reads the dropped
         * probabilities this call leaves in the scratch */
        scribble(g_att, natt), scribble(g_scr, natt);
        o0 = ops_now();
        assert_int_equal(gpu->attention_fwd(gpu, NULL, g_att, g_scr, g_qkv, g_valid, B, T, Tq, C,
                                            NH, h0, NHall, p, seed),
                         0);
        /* lists, scores, softmax; or the fused statistics, each row's
         * log-sum-exp in att (room: not the probabilities, so not compared;
         * the fused backward below reads them) */
        ops_expect(one ? "attention_fwd, no out (fused)" : "attention_fwd, no out", o0,
                   one ? 1 : 3);
        if (!one) check("attention_fwd att (no out)", g_att, att, natt, tol);
        cpu->attention_bwd(cpu, dqkv, scr, dout, qkv, att, NULL, NULL, B, T, Tq, C, NH, h0, NHall,
                           p, seed);
        o0 = ops_now();
        assert_int_equal(gpu->attention_bwd(gpu, g_dqkv, g_scr, g_dout, g_qkv, g_att, g_out,
                                            g_valid, B, T, Tq, C, NH, h0, NHall, p, seed),
                         0);
        /* lists, 4 products, softmax; or the fused queries' and keys' kernels */
        ops_expect(one ? "attention_bwd (fused)" : "attention_bwd", o0, one ? 2 : 6);
        check("attention_bwd dqkv", g_dqkv, dqkv, nqkv, tol);
        if (one) /* the fused backward wants the forward's output */
            assert_int_equal(gpu->attention_bwd(gpu, g_dqkv, g_scr, g_dout, g_qkv, g_att, NULL,
                                                g_valid, B, T, Tq, C, NH, h0, NHall, p, seed),
                             RF_ERR_INVALID);
        void *gs[] = {g_valid, g_qkv, g_out, g_att, g_scr, g_dout, g_dqkv};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(valid), free(qkv), free(out), free(att), free(scr), free(dout), free(dqkv);
    }
}

static void test_attention(void **state) {
    (void)state;
    need_gpu();
    attention_cases(TOL, false);
}

/* cuda-bf16: the scores, values and their gradients on bf16 tensor cores: the
 * linear layer's stated 1e-2 (rounding every product's inputs to bf16 in a
 * numpy emulation at these shapes gave at most 3.3e-3 norm-wise). */
static void test_attention_bf16(void **state) {
    (void)state;
    need_gpu();
    if (rf_backend_for("cuda-bf16", &gpu)) RF_SKIP("%s", rf_errmsg());
    attention_cases(1e-2, true);
}

/* Tensor parallelism's slots: the linear layer on strided views (a rank's
 * rows or columns of a bigger matrix: every leading dimension above its row
 * length), and the vocabulary-parallel embedding's rows [lo, hi). */
static void test_tp_slots(void **state) {
    (void)state;
    need_gpu();
    /* N, IC, OC, extra columns of each row (ld = len + extra), bias */
    static const int shapes[][5] = {{1, 3, 5, 2, 1}, {13, 37, 29, 7, 1}, {128, 384, 96, 288, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2], ex = shapes[s][3],
            hb = shapes[s][4], ldi = IC + ex, ldo = OC + ex, ldw = IC + ex;
        size_t ni = (size_t)N * ldi, no = (size_t)N * ldo, nw = (size_t)OC * ldw;
        float *x = rnd(ni, -1, 1), *w = rnd(nw, -0.1f, 0.1f), *b = rnd(OC, -1, 1),
              *out = rnd(no, -1, 1), *dout = rnd(no, -1, 1), *dx = rnd(ni, -1, 1),
              *dw = rnd(nw, -1, 1), *db = rnd(OC, -1, 1);
        void *g_x = up(x, ni * 4), *g_w = up(w, nw * 4), *g_b = up(b, OC * 4),
             *g_out = up(out, no * 4), *g_dout = up(dout, no * 4), *g_dx = up(dx, ni * 4),
             *g_dw = up(dw, nw * 4), *g_db = up(db, OC * 4);
        print_message("linear_ld N=%d IC=%d OC=%d +%d per row bias=%d\n", N, IC, OC, ex, hb);
        cpu->linear_ld_fwd(cpu, out, ldo, x, ldi, w, ldw, hb ? b : NULL, N, IC, OC);
        uint64_t o0 = ops_now();
        assert_int_equal(
            gpu->linear_ld_fwd(gpu, g_out, ldo, g_x, ldi, g_w, ldw, hb ? g_b : NULL, N, IC, OC), 0);
        ops_expect("linear_ld_fwd", o0, 1);
        check("linear_ld_fwd (gaps untouched)", g_out, out, no, TOL);
        cpu->linear_ld_bwd(cpu, dx, ldi, dw, ldw, hb ? db : NULL, dout, ldo, x, ldi, w, ldw, N, IC,
                           OC);
        assert_int_equal(gpu->linear_ld_bwd(gpu, g_dx, ldi, g_dw, ldw, hb ? g_db : NULL, g_dout,
                                            ldo, g_x, ldi, g_w, ldw, N, IC, OC),
                         0);
        check("linear_ld_bwd dinp", g_dx, dx, ni, TOL);
        check("linear_ld_bwd dw", g_dw, dw, nw, TOL);
        check("linear_ld_bwd db", g_db, db, OC, TOL);
        void *gs[] = {g_x, g_w, g_b, g_out, g_dout, g_dx, g_dw, g_db};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(x), free(w), free(b), free(out), free(dout), free(dx), free(dw), free(db);
    }
    { /* a shard with no output columns (ldd 0): nothing flows back, dinp untouched */
        float *dx = rnd(6, -1, 1);
        void *g_dx = up(dx, 6 * 4), *g_x = up(dx, 6 * 4);
        assert_int_equal(
            gpu->linear_ld_bwd(gpu, g_dx, 3, NULL, 3, NULL, NULL, 0, g_x, 3, NULL, 3, 2, 3, 0), 0);
        check_exact("linear_ld_bwd, no outputs", g_dx, dx, 6);
        gfree(g_dx), gfree(g_x), free(dx);
    }
    /* B, T, C, V, TV, lo, hi, position and type gradients */
    static const int emb[][8] = {
        {1, 1, 3, 4, 1, 2, 4, 1}, {2, 7, 37, 11, 2, 3, 9, 1}, {4, 128, 384, 1000, 2, 500, 1000, 0}};
    for (size_t s = 0; s < sizeof emb / sizeof emb[0]; s++) {
        int B = emb[s][0], T = emb[s][1], C = emb[s][2], V = emb[s][3], TV = emb[s][4],
            lo = emb[s][5], hi = emb[s][6], pt = emb[s][7], rows = hi - lo;
        size_t N = (size_t)B * T;
        int32_t *ids = malloc(N * 4), *types = malloc(N * 4);
        for (size_t i = 0; i < N; i++) { /* inside and outside [lo, hi), repeated */
            ids[i] = (int32_t)(i % 3 ? lo + (int)rf_rng_below(&rng, (uint64_t)(rows < 4 ? rows : 4))
                                     : (int)rf_rng_below(&rng, (uint64_t)V));
            types[i] = (int32_t)rf_rng_below(&rng, (uint64_t)TV);
        }
        float *w = rnd((size_t)rows * C, -1, 1), *wpe = rnd((size_t)T * C, -1, 1),
              *wtt = rnd((size_t)TV * C, -1, 1), *out = rnd(N * C, -1, 1),
              *dout = rnd(N * C, -1, 1), *dw = rnd((size_t)rows * C, -1, 1),
              *dwpe = rnd((size_t)T * C, -1, 1), *dwtt = rnd((size_t)TV * C, -1, 1);
        void *g_ids = up(ids, N * 4), *g_types = up(types, N * 4),
             *g_w = up(w, (size_t)rows * C * 4), *g_wpe = up(wpe, (size_t)T * C * 4),
             *g_wtt = up(wtt, (size_t)TV * C * 4), *g_out = up(out, N * C * 4),
             *g_dout = up(dout, N * C * 4), *g_dw = up(dw, (size_t)rows * C * 4),
             *g_dwpe = up(dwpe, (size_t)T * C * 4), *g_dwtt = up(dwtt, (size_t)TV * C * 4);
        print_message("embed_rows B=%d T=%d C=%d rows [%d, %d) of %d\n", B, T, C, lo, hi, V);
        cpu->embed_rows_fwd(cpu, out, ids, w, lo, hi, (int)N, C);
        assert_int_equal(gpu->embed_rows_fwd(gpu, g_out, g_ids, g_w, lo, hi, (int)N, C), 0);
        check_exact("embed_rows_fwd", g_out, out, N * C);
        /* pt: BERT's positions n % T and types; else GPT-2's: the types array
         * as positions (each < T), no types (NULL: never read) */
        cpu->embed_add_fwd(cpu, out, pt ? NULL : types, pt ? types : NULL, wpe, pt ? wtt : NULL, B,
                           T, C);
        assert_int_equal(gpu->embed_add_fwd(gpu, g_out, pt ? NULL : g_types, pt ? g_types : NULL,
                                            g_wpe, pt ? g_wtt : NULL, B, T, C),
                         0);
        check_exact("embed_add_fwd", g_out, out, N * C);
        cpu->embed_rows_bwd(cpu, dw, pt ? dwpe : NULL, pt ? dwtt : NULL, dout, ids,
                            pt ? types : NULL, lo, hi, B, T, C);
        assert_int_equal(gpu->embed_rows_bwd(gpu, g_dw, pt ? g_dwpe : NULL, pt ? g_dwtt : NULL,
                                             g_dout, g_ids, pt ? g_types : NULL, lo, hi, B, T, C),
                         0);
        check_exact("embed_rows_bwd dw", g_dw, dw, (size_t)rows * C);
        check_exact("embed_rows_bwd dwpe", g_dwpe, dwpe, (size_t)T * C);
        check_exact("embed_rows_bwd dwtt", g_dwtt, dwtt, (size_t)TV * C);
        void *gs[] = {g_ids, g_types, g_w, g_wpe, g_wtt, g_out, g_dout, g_dw, g_dwpe, g_dwtt};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(ids), free(types), free(w), free(wpe), free(wtt), free(out), free(dout);
        free(dw), free(dwpe), free(dwtt);
    }
}

/* The vocabulary-parallel cross-entropy's local steps on a rank's columns
 * [lo, hi) of wider rows (ldz), targets inside, outside and ignored; the
 * all-reduces between them are the identity here (one rank's view). */
static void test_vxent(void **state) {
    (void)state;
    need_gpu();
    static const int shapes[][4] = {{1, 5, 0, 0}, {7, 37, 3, 100}, {96, 25129, 0, 25128}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], nl = shapes[s][1], ex = shapes[s][2], lo = shapes[s][3], hi = lo + nl,
            ldz = nl + ex;
        size_t nz = (size_t)N * ldz;
        int32_t *tgt = malloc((size_t)N * 4);
        for (int r = 0; r < N; r++)
            tgt[r] = r % 5 == 4 ? -100
                     : r % 2    ? lo + (int)rf_rng_below(&rng, (uint64_t)nl)
                                : (int)rf_rng_below(&rng, (uint64_t)(hi + 50));
        float *z = rnd(nz, -8, 8), *mx = rnd(N, 0, 0), *tl = rnd(N, 0, 0), *dz = rnd(nz, -1, 1);
        double *se = malloc((size_t)N * sizeof(double));
        void *g_tgt = up(tgt, (size_t)N * 4), *g_z = up(z, nz * 4), *g_mx = up(NULL, N * 4),
             *g_tl = up(NULL, N * 4), *g_se = up(NULL, (size_t)N * sizeof(double)),
             *g_dz = up(dz, nz * 4);
        print_message("vxent N=%d columns [%d, %d) ld %d\n", N, lo, hi, ldz);
        cpu->vxent_stats(cpu, mx, tl, z, ldz, tgt, lo, hi, N);
        assert_int_equal(gpu->vxent_stats(gpu, g_mx, g_tl, g_z, ldz, g_tgt, lo, hi, N), 0);
        check_exact("vxent_stats max", g_mx, mx, N);
        check_exact("vxent_stats target logit", g_tl, tl, N);
        cpu->vxent_sumexp(cpu, se, z, ldz, mx, lo, hi, N);
        assert_int_equal(gpu->vxent_sumexp(gpu, g_se, g_z, ldz, g_mx, lo, hi, N), 0);
        double *gse = malloc((size_t)N * sizeof(double)), worst = 0;
        assert_int_equal(gpu->to_host(gpu, gse, g_se, (size_t)N * sizeof(double)), 0);
        for (int r = 0; r < N; r++) {
            double e = fabs(gse[r] - se[r]) / se[r];
            worst = e > worst ? e : worst;
        }
        print_message("  %-34s n=%-9d rel %.2e\n", "vxent_sumexp", N, worst);
        if (!(worst <= 1e-12)) fail_msg("vxent_sumexp: relative error %.3e above 1e-12", worst);
        float loss = 0, gloss = 0;
        cpu->vxent_loss(cpu, &loss, tl, mx, se, tgt, N);
        assert_int_equal(gpu->vxent_loss(gpu, &gloss, g_tl, g_mx, g_se, g_tgt, N), 0);
        check("vxent_loss losses", g_tl, tl, N, TOL);
        print_message("  vxent_loss mean %.7g (cpu %.7g)\n", gloss, loss);
        if (!(fabsf(gloss - loss) <= 1e-5f * fabsf(loss))) fail_msg("vxent_loss: the mean differs");
        cpu->vxent_bwd(cpu, dz, ldz, z, ldz, mx, se, tgt, lo, hi, N, 0.5f);
        assert_int_equal(
            gpu->vxent_bwd(gpu, g_dz, ldz, g_z, ldz, g_mx, g_se, g_tgt, lo, hi, N, 0.5f), 0);
        check("vxent_bwd dlogits", g_dz, dz, nz, TOL);
        void *gs[] = {g_tgt, g_z, g_mx, g_tl, g_se, g_dz};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(tgt), free(z), free(mx), free(tl), free(dz), free(se), free(gse);
    }
}

/* Inference's attention over a key/value cache: n new queries after len
 * cached positions, grouped-query heads, a prefill and a decode step. */
static void test_kv_attention(void **state) {
    (void)state;
    need_gpu();
    /* n, len, NH, NKV, hd */
    static const int shapes[][5] = {
        {1, 0, 1, 1, 4}, {7, 0, 4, 2, 16}, {1, 300, 9, 3, 64}, {65, 37, 12, 12, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int n = shapes[s][0], len = shapes[s][1], NH = shapes[s][2], NKV = shapes[s][3],
            hd = shapes[s][4], KW = NKV * hd, W = (NH + 2 * NKV) * hd;
        size_t nqkv = (size_t)n * W, nkv = (size_t)(len + n) * KW, nout = (size_t)n * NH * hd,
               nsc = (size_t)NH * n * (len + n);
        float *qkv = rnd(nqkv, -1, 1), *kc = rnd(nkv, -1, 1), *vc = rnd(nkv, -1, 1),
              *out = rnd(nout, 0, 0), *sc = rnd(nsc, 0, 0);
        void *g_qkv = up(qkv, nqkv * 4), *g_kc = up(kc, nkv * 4), *g_vc = up(vc, nkv * 4),
             *g_out = up(NULL, nout * 4), *g_sc = up(NULL, nsc * 4);
        print_message("kv_attention n=%d after %d, heads %d over %d, hd %d\n", n, len, NH, NKV, hd);
        cpu->kv_attention_fwd(cpu, out, sc, qkv, kc, vc, n, len, NH, NKV, hd);
        assert_int_equal(
            gpu->kv_attention_fwd(gpu, g_out, g_sc, g_qkv, g_kc, g_vc, n, len, NH, NKV, hd), 0);
        check("kv_attention_fwd", g_out, out, nout, TOL);
        void *gs[] = {g_qkv, g_kc, g_vc, g_out, g_sc};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(qkv), free(kc), free(vc), free(out), free(sc);
    }
    /* no heads: nothing to launch (a grid of no blocks is a CUDA error) */
    assert_int_equal(gpu->kv_attention_fwd(gpu, NULL, NULL, NULL, NULL, NULL, 3, 5, 0, 1, 8), 0);
}

static void test_pointwise(void **state) {
    (void)state;
    need_gpu();
    static const size_t sizes[] = {1, 1000, 100003};
    static const float ps[] = {0.0f, 0.1f, 0.5f};
    for (size_t s = 0; s < 3; s++) {
        size_t n = sizes[s];
        float p = ps[s];
        uint64_t seed = 99 + s;
        float *x = rnd(n, -5, 5), *y = rnd(n, -1, 1), *out = rnd(n, 0, 0), *dout = rnd(n, -1, 1),
              *dx = rnd(n, -1, 1), *dy = rnd(n, -1, 1);
        void *g_x = up(x, n * 4), *g_y = up(y, n * 4), *g_out = up(NULL, n * 4),
             *g_dout = up(dout, n * 4), *g_dx = up(dx, n * 4), *g_dy = up(dy, n * 4);
        print_message("pointwise n=%zu p=%.2f\n", n, p);
        cpu->gelu_fwd(cpu, out, x, n);
        assert_int_equal(gpu->gelu_fwd(gpu, g_out, g_x, n), 0);
        check("gelu_fwd", g_out, out, n, TOL);
        cpu->gelu_bwd(cpu, dx, x, dout, n);
        assert_int_equal(gpu->gelu_bwd(gpu, g_dx, g_x, g_dout, n), 0);
        check("gelu_bwd", g_dx, dx, n, TOL);
        cpu->tanh_fwd(cpu, out, x, n);
        assert_int_equal(gpu->tanh_fwd(gpu, g_out, g_x, n), 0);
        check("tanh_fwd", g_out, out, n, TOL);
        cpu->tanh_bwd(cpu, dx, out, dout, n);
        assert_int_equal(gpu->tanh_bwd(gpu, g_dx, g_out, g_dout, n), 0);
        check("tanh_bwd", g_dx, dx, n, TOL);
        cpu->dropout_fwd(cpu, out, x, n, p, seed);
        assert_int_equal(gpu->dropout_fwd(gpu, g_out, g_x, n, p, seed), 0);
        check_exact("dropout_fwd (masks bit for bit)", g_out, out, n);
        /* the backward slots accumulate: start the bit-for-bit cases from the
         * same dx on both devices (gelu_bwd/tanh_bwd left it equal only within TOL) */
        assert_int_equal(gpu->to_device(gpu, g_dx, dx, n * 4), 0);
        cpu->dropout_bwd(cpu, dx, dout, n, p, seed);
        assert_int_equal(gpu->dropout_bwd(gpu, g_dx, g_dout, n, p, seed), 0);
        check_exact("dropout_bwd", g_dx, dx, n);
        cpu->residual_fwd(cpu, out, x, y, n, p, seed);
        assert_int_equal(gpu->residual_fwd(gpu, g_out, g_x, g_y, n, p, seed), 0);
        check_exact("residual_fwd", g_out, out, n);
        cpu->residual_bwd(cpu, dx, dy, dout, n, p, seed);
        assert_int_equal(gpu->residual_bwd(gpu, g_dx, g_dy, g_dout, n, p, seed), 0);
        check_exact("residual_bwd da", g_dx, dx, n);
        check_exact("residual_bwd db", g_dy, dy, n);
        cpu->scale(cpu, x, n, 0.37f);
        assert_int_equal(gpu->scale(gpu, g_x, n, 0.37f), 0);
        check_exact("scale", g_x, x, n);
        void *gs[] = {g_x, g_y, g_out, g_dout, g_dx, g_dy};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(x), free(y), free(out), free(dout), free(dx), free(dy);
    }
}

static void test_xent_argmax(void **state) {
    (void)state;
    need_gpu();
    static const int shapes[][3] = {{1, 2, 0}, {5, 2, 1}, {33, 7, 0}, {64, 3, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], K = shapes[s][1], weighted = shapes[s][2];
        size_t n = (size_t)B * K;
        int32_t *labels = malloc(B * 4), *pred = malloc(B * 4), *gpred = malloc(B * 4);
        for (int b = 0; b < B; b++) /* every fourth row unlabelled */
            labels[b] = b % 4 == 3 ? -1 : (int32_t)rf_rng_below(&rng, (uint64_t)K);
        float *z = rnd(n, -4, 4), *w = rnd(K, 0.2f, 3), *probs = rnd(n, 0, 0),
              *losses = rnd(B, 0, 0), *dz = rnd(n, -1, 1), loss = 0, gloss = 0;
        void *g_labels = up(labels, B * 4), *g_z = up(z, n * 4), *g_w = up(w, K * 4),
             *g_probs = up(NULL, n * 4), *g_losses = up(NULL, B * 4), *g_dz = up(dz, n * 4),
             *g_pred = up(NULL, B * 4);
        print_message("xent B=%d K=%d weighted=%d\n", B, K, weighted);
        cpu->xent_fwd(cpu, &loss, probs, losses, z, labels, weighted ? w : NULL, B, K);
        assert_int_equal(gpu->xent_fwd(gpu, &gloss, g_probs, g_losses, g_z, g_labels,
                                       weighted ? g_w : NULL, B, K),
                         0);
        check("xent_fwd probs", g_probs, probs, n, TOL);
        check("xent_fwd losses", g_losses, losses, B, TOL);
        print_message("  xent_fwd loss cpu %.9g gpu %.9g\n", loss, gloss);
        assert_true(fabs((double)gloss - loss) <= TOL * fabs((double)loss) + 1e-12);
        cpu->xent_bwd(cpu, dz, probs, labels, weighted ? w : NULL, B, K, 0.5f);
        assert_int_equal(
            gpu->xent_bwd(gpu, g_dz, g_probs, g_labels, weighted ? g_w : NULL, B, K, 0.5f), 0);
        check("xent_bwd", g_dz, dz, n, TOL);
        cpu->softmax_argmax(cpu, pred, probs, z, B, K);
        assert_int_equal(gpu->softmax_argmax(gpu, g_pred, g_probs, g_z, B, K), 0);
        check("softmax_argmax probs", g_probs, probs, n, TOL);
        assert_int_equal(gpu->to_host(gpu, gpred, g_pred, B * 4), 0);
        assert_memory_equal(gpred, pred, B * 4);
        void *gs[] = {g_labels, g_z, g_w, g_probs, g_losses, g_dz, g_pred};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            gfree(gs[i]);
        free(labels), free(pred), free(gpred), free(z), free(w), free(probs), free(losses),
            free(dz);
    }
}

static void test_optimizer(void **state) {
    (void)state;
    need_gpu();
    static const size_t sizes[] = {0, 1, 1000, 1000003};
    for (size_t s = 0; s < 4; s++) {
        size_t n = sizes[s];
        float *g = rnd(n, -1, 1);
        void *g_g = up(g, n * 4 + 4), *g_ss = up(NULL, sizeof(double));
        double a = -1, b = -1, c = -1;
        assert_int_equal(cpu->sumsq(cpu, &a, g, n), 0);
        assert_int_equal(gpu->sumsq(gpu, &b, g_g, n), 0);
        rf_param_span all = {0, n, false};
        assert_int_equal(gpu->sumsq_into(gpu, g_ss, g_g, &all, 1), 0); /* into device memory */
        assert_int_equal(gpu->to_host(gpu, &c, g_ss, sizeof c), 0);
        print_message("sumsq n=%zu cpu %.17g gpu %.17g (into device memory %.17g)\n", n, a, b, c);
        assert_true(fabs(a - b) <= 1e-12 * a && fabs(a - c) <= 1e-12 * a);
        assert_true(n > 0 || (a == 0 && b == 0 && c == 0));
        gfree(g_g), gfree(g_ss);
        free(g);
    }
    /* sumsq_spans: 301 spans of one buffer, empty ones, adjacent ones and
     * gaps between others, against the CPU's (its spans' rf_op_sumsq in
     * order), then 2 large spans: one host wait however many spans, once
     * the span table has grown (counted by the emulator; on a GPU not). */
    {
        size_t n = 400000, ns = 301;
        rf_param_span *sp = malloc(ns * sizeof *sp);
        for (size_t k = 0, at = 0; k < ns; k++) {
            size_t len = k % 7 == 3 ? 0 : 1 + (k * 37) % 700;
            sp[k] = (rf_param_span){at, len, false};
            at += len + (k % 5 == 0 ? 11 : 0);
            assert_true(at <= n);
        }
        float *g = rnd(n, -1, 1);
        void *g_g = up(g, n * 4);
        size_t counts[] = {ns, 0, 1};
        double warm = 0; /* grows the span table first (cudaFree waits too) */
        assert_int_equal(gpu->sumsq_spans(gpu, &warm, g_g, sp, ns), 0);
        rf_param_span big[] = {{3, 150000, false}, {200001, 199999, false}};
        for (int c = 0; c < 4; c++) {
            const rf_param_span *s = c < 3 ? sp : big;
            size_t k = c < 3 ? counts[c] : 2;
            double a = -1, b = -1;
#ifdef REFINERY_CUDA_EMU
            uint64_t w0 = cuemu_host_waits();
#endif
            assert_int_equal(gpu->sumsq_spans(gpu, &b, g_g, s, k), 0);
#ifdef REFINERY_CUDA_EMU
            assert_int_equal(cuemu_host_waits() - w0, k > 0); /* none for nothing */
#endif
            assert_int_equal(cpu->sumsq_spans(cpu, &a, g, s, k), 0);
            print_message("sumsq_spans %zu spans: cpu %.17g gpu %.17g\n", k, a, b);
            assert_true(fabs(a - b) <= 1e-12 * a);
            assert_true(k > 0 ? a > 0 : a == 0 && b == 0);
        }
        /* sumsq_into over spans (ZeRO-2/3's and the meshes' norm): the sum in
         * device memory, equal to sumsq_spans'; a table other than the last
         * one uploaded costs one wait (its pinned source must outlive the
         * copy), the same one again none, and one span or none use no table */
        void *g_ss = up(NULL, sizeof(double));
        for (int c = 0; c < 5; c++) { /* the table on the device is big's (above) */
            const rf_param_span *s = c < 2 ? sp : c < 4 ? big : sp;
            size_t k = c < 2 ? ns : c < 4 ? 2 : 1;
            double a = -1, b = -1;
#ifdef REFINERY_CUDA_EMU
            uint64_t w0 = cuemu_host_waits();
#endif
            assert_int_equal(gpu->sumsq_into(gpu, g_ss, g_g, s, k), 0);
#ifdef REFINERY_CUDA_EMU
            assert_int_equal(cuemu_host_waits() - w0, c == 0 || c == 2); /* new tables */
#endif
            assert_int_equal(gpu->to_host(gpu, &b, g_ss, sizeof b), 0);
            assert_int_equal(cpu->sumsq_into(cpu, &a, g, s, k), 0);
            print_message("sumsq_into %zu spans: cpu %.17g gpu %.17g\n", k, a, b);
            assert_true(fabs(a - b) <= 1e-12 * a && a > 0);
        }
        gfree(g_ss);
        gfree(g_g);
        free(g), free(sp);
    }
    /* AdamW over tensors of mixed decay flags: the whole range, then a shard
     * [lo, hi) cutting tensors, with its own moments; two steps each. */
    rf_param_span spans[] = {{0, 1000, true},
                             {1000, 37, false},
                             {1037, 5000, true},
                             {6037, 1, false},
                             {6038, 2000, true}};
    size_t n = 8038, ranges[][2] = {{0, 8038}, {517, 6500}};
    for (int r = 0; r < 2; r++) {
        size_t lo = ranges[r][0], hi = ranges[r][1], k = hi - lo;
        float *p = rnd(n, -1, 1), *g = rnd(n, -1, 1), *m = rnd(k, 0, 0), *v = rnd(k, 0, 0);
        void *g_p = up(p, n * 4), *g_g = up(g, n * 4), *g_m = up(NULL, k * 4),
             *g_v = up(NULL, k * 4);
        for (long step = 0; step < 2; step++) {
            rf_adamw_hp hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step, NULL, 0};
            cpu->adamw(cpu, p, g, m, v, lo, hi, spans, 5, &hp);
            assert_int_equal(gpu->adamw(gpu, g_p, g_g, g_m, g_v, lo, hi, spans, 5, &hp), 0);
        }
        print_message("adamw [%zu, %zu) of %zu\n", lo, hi, n);
        check("adamw params", g_p, p, n, TOL);
        check("adamw m", g_m, m, k, TOL);
        check("adamw v", g_v, v, k, TOL);
        gfree(g_p), gfree(g_g), gfree(g_m), gfree(g_v);
        free(p), free(g), free(m), free(v);
    }
    /* clipping on the device: sumsq_into leaves the sum of squares in device
     * memory without a host wait, and AdamW clips with it (hp.sumsq) as the
     * CPU's update of the same sum does; a norm above the clip (coefficient
     * 0.4) and below it */
    for (int c = 0; c < 2; c++) {
        float *p = rnd(n, -1, 1), *g = rnd(n, -1, 1), *m = rnd(n, 0, 0), *v = rnd(n, 0, 0);
        void *g_p = up(p, n * 4), *g_g = up(g, n * 4), *g_m = up(m, n * 4), *g_v = up(v, n * 4),
             *g_ss = up(NULL, sizeof(double));
        double ss = 0, g_host = 0;
        rf_param_span all = {0, n, false};
        assert_int_equal(cpu->sumsq_into(cpu, &ss, g, &all, 1), 0);
#ifdef REFINERY_CUDA_EMU
        uint64_t w0 = cuemu_host_waits();
#endif
        assert_int_equal(gpu->sumsq_into(gpu, g_ss, g_g, &all, 1), 0);
        float clip = (c ? 2.5f : 0.4f) * (float)sqrt(ss);
        rf_adamw_hp hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0, &ss, clip}, ghp = hp;
        ghp.sumsq = g_ss;
        cpu->adamw(cpu, p, g, m, v, 0, n, spans, 5, &hp);
        assert_int_equal(gpu->adamw(gpu, g_p, g_g, g_m, g_v, 0, n, spans, 5, &ghp), 0);
#ifdef REFINERY_CUDA_EMU
        assert_int_equal(cuemu_host_waits() - w0, 0); /* the coefficient stays on the device */
#endif
        assert_int_equal(gpu->to_host(gpu, &g_host, g_ss, sizeof g_host), 0);
        print_message("adamw clipped by %.3f: sum of squares %.17g (cpu %.17g)\n",
                      rf_clip_coef(ss, clip), g_host, ss);
        if (!(fabs(g_host - ss) <= 1e-12 * ss)) fail_msg("sumsq_into: %.17g vs %.17g", g_host, ss);
        check("adamw (clipped) params", g_p, p, n, TOL);
        check("adamw (clipped) m", g_m, m, n, TOL);
        check("adamw (clipped) v", g_v, v, n, TOL);
        gfree(g_p), gfree(g_g), gfree(g_m), gfree(g_v), gfree(g_ss);
        free(p), free(g), free(m), free(v);
    }
    /* 130 tensors, the decay flag alternating in runs of 1-3, a gap (no
     * tensor) after every 7th, an empty one: more runs than one launch
     * takes (48), whole and as a shard cutting runs (the gaps' parameters
     * must stay as they were, as on the CPU). */
    {
        size_t nt = 130, at = 0;
        rf_param_span *many = malloc(nt * sizeof *many);
        for (size_t t = 0; t < nt; t++) {
            size_t len = t == 40 ? 0 : 1 + (t * 53) % 97;
            many[t] = (rf_param_span){at, len, (t / (1 + t % 3)) % 2 == 0};
            at += len + (t % 7 == 6 ? 5 : 0);
        }
        size_t ranges2[][2] = {{0, at}, {333, at - 200}};
        for (int r = 0; r < 2; r++) {
            size_t lo = ranges2[r][0], hi = ranges2[r][1], k = hi - lo;
            float *p = rnd(at, -1, 1), *g = rnd(at, -1, 1), *m = rnd(k, 0, 0), *v = rnd(k, 0, 0);
            void *g_p = up(p, at * 4), *g_g = up(g, at * 4), *g_m = up(NULL, k * 4),
                 *g_v = up(NULL, k * 4);
            for (long step = 0; step < 2; step++) { /* decay 0.5: a wrong flag shows */
                rf_adamw_hp hp = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.5f, step, NULL, 0};
                cpu->adamw(cpu, p, g, m, v, lo, hi, many, nt, &hp);
                assert_int_equal(gpu->adamw(gpu, g_p, g_g, g_m, g_v, lo, hi, many, nt, &hp), 0);
            }
            print_message("adamw %zu tensors [%zu, %zu) of %zu\n", nt, lo, hi, at);
            check("adamw params", g_p, p, at, TOL);
            check("adamw m", g_m, m, k, TOL);
            check("adamw v", g_v, v, k, TOL);
            gfree(g_p), gfree(g_g), gfree(g_m), gfree(g_v);
            free(p), free(g), free(m), free(v);
        }
        free(many);
    }
}

static void gfree_all(void **gs, size_t n) {
    for (size_t i = 0; i < n; i++)
        gfree(gs[i]);
}

static void test_tokpos(void **state) {
    (void)state;
    need_gpu();
    /* B, T, C, V, packed pos, wpe, dwte */
    static const int shapes[][7] = {{1, 1, 1, 3, 0, 1, 1},
                                    {2, 7, 37, 11, 1, 1, 1},
                                    {3, 64, 100, 50, 0, 0, 1},
                                    {2, 33, 64, 20, 1, 1, 0},
                                    {4, 128, 384, 1000, 1, 1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], V = shapes[s][3],
            packed = shapes[s][4], hw = shapes[s][5], hd = shapes[s][6], P = T;
        size_t N = (size_t)B * T;
        int32_t *ids = malloc(N * 4), *pos = malloc(N * 4);
        for (size_t i = 0, p = 0; i < N; i++, p++) { /* few distinct ids: rows accumulate */
            ids[i] = (int32_t)rf_rng_below(&rng, (uint64_t)(V < 5 ? V : 5));
            if (i % T == 0 || rf_rng_below(&rng, 9) == 0) p = 0; /* a document starts */
            pos[i] = (int32_t)p;
        }
        float *wte = rnd((size_t)V * C, -1, 1), *wpe = rnd((size_t)P * C, -1, 1),
              *out = rnd(N * C, 0, 0), *dout = rnd(N * C, -1, 1), *dwte = rnd((size_t)V * C, -1, 1),
              *dwpe = rnd((size_t)P * C, -1, 1);
        void *g_ids = up(ids, N * 4), *g_pos = up(pos, N * 4), *g_wte = up(wte, (size_t)V * C * 4),
             *g_wpe = up(wpe, (size_t)P * C * 4), *g_out = up(NULL, N * C * 4),
             *g_dout = up(dout, N * C * 4), *g_dwte = up(dwte, (size_t)V * C * 4),
             *g_dwpe = up(dwpe, (size_t)P * C * 4);
        print_message("tokpos B=%d T=%d C=%d V=%d packed=%d wpe=%d dwte=%d\n", B, T, C, V, packed,
                      hw, hd);
        const int32_t *cp = packed ? pos : NULL, *gp = packed ? g_pos : NULL;
        rf_op_tokpos_fwd(out, ids, cp, wte, hw ? wpe : NULL, B, T, C);
        assert_int_equal(gpu->tokpos_fwd(gpu, g_out, g_ids, gp, g_wte, hw ? g_wpe : NULL, B, T, C),
                         0);
        check_exact("tokpos_fwd", g_out, out, N * C);
        rf_op_tokpos_bwd(hd ? dwte : NULL, hw ? dwpe : NULL, dout, ids, cp, B, T, C);
        assert_int_equal(gpu->tokpos_bwd(gpu, hd ? g_dwte : NULL, hw ? g_dwpe : NULL, g_dout, g_ids,
                                         gp, B, T, C, V, P),
                         0);
        check_exact("tokpos_bwd dwte (row order)", g_dwte, dwte, (size_t)V * C);
        check_exact("tokpos_bwd dwpe (row order)", g_dwpe, dwpe, (size_t)P * C);
        void *gs[] = {g_ids, g_pos, g_wte, g_wpe, g_out, g_dout, g_dwte, g_dwpe};
        gfree_all(gs, sizeof gs / sizeof gs[0]);
        free(ids), free(pos), free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
    }
}

/* Conv1D and the LM head on gpu (the fp32 backend, or cuda-bf16) within tol. */
static void conv1d_lm_head_cases(double tol) {
    /* N, IC, OC, bias, dinp, dw */
    static const int shapes[][6] = {
        {1, 3, 5, 1, 1, 1}, {13, 37, 29, 1, 0, 1}, {33, 64, 2, 0, 1, 0}, {256, 384, 1152, 1, 1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2], hb = shapes[s][3],
            hd = shapes[s][4], hw = shapes[s][5];
        size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;
        float *x = rnd(ni, -1, 1), *w = rnd(nw, -0.1f, 0.1f), *b = rnd(OC, -1, 1),
              *out = rnd(no, 0, 0), *dout = rnd(no, -1, 1), *dx = rnd(ni, -1, 1),
              *dw = rnd(nw, -1, 1), *db = rnd(OC, -1, 1);
        void *g_x = up(x, ni * 4), *g_w = up(w, nw * 4), *g_b = up(b, OC * 4),
             *g_out = up(NULL, no * 4), *g_dout = up(dout, no * 4), *g_dx = up(dx, ni * 4),
             *g_dw = up(dw, nw * 4), *g_db = up(db, OC * 4);
        print_message("conv1d N=%d IC=%d OC=%d bias=%d dinp=%d dw=%d\n", N, IC, OC, hb, hd, hw);
        rf_op_conv1d_fwd(out, x, w, hb ? b : NULL, N, IC, OC);
        uint64_t o0 = ops_now();
        assert_int_equal(gpu->conv1d_fwd(gpu, g_out, g_x, g_w, hb ? g_b : NULL, N, IC, OC), 0);
        ops_expect("conv1d_fwd", o0, 1);
        check("conv1d_fwd", g_out, out, no, tol);
        if (hb)
            unaligned_bias_case("conv1d_fwd (bias unaligned)", gpu->conv1d_fwd, g_out, g_x, g_w, b,
                                out, N, IC, OC, tol);
        rf_op_conv1d_bwd(hd ? dx : NULL, hw ? dw : NULL, hb ? db : NULL, dout, x, w, N, IC, OC);
        assert_int_equal(gpu->conv1d_bwd(gpu, hd ? g_dx : NULL, hw ? g_dw : NULL, hb ? g_db : NULL,
                                         g_dout, g_x, g_w, N, IC, OC),
                         0);
        check("conv1d_bwd dinp", g_dx, dx, ni, tol);
        check("conv1d_bwd dw", g_dw, dw, nw, tol);
        check("conv1d_bwd db", g_db, db, OC, TOL); /* fp32 in both modes */
        void *gs[] = {g_x, g_w, g_b, g_out, g_dout, g_dx, g_dw, g_db};
        gfree_all(gs, sizeof gs / sizeof gs[0]);
        free(x), free(w), free(b), free(out), free(dout), free(dx), free(dw), free(db);
    }
    /* the LM head: N, C, V, dh, dwte (GPT-2's vocabulary last) */
    static const int heads[][5] = {
        {1, 3, 5, 1, 1}, {13, 37, 29, 0, 1}, {33, 64, 1000, 1, 0}, {8, 64, 50257, 1, 1}};
    for (size_t s = 0; s < sizeof heads / sizeof heads[0]; s++) {
        int N = heads[s][0], C = heads[s][1], V = heads[s][2], hh = heads[s][3], hw = heads[s][4];
        size_t nh = (size_t)N * C, nl = (size_t)N * V, nw = (size_t)V * C;
        float *h = rnd(nh, -1, 1), *w = rnd(nw, -0.1f, 0.1f), *lg = rnd(nl, 0, 0),
              *dl = rnd(nl, -1, 1), *dh = rnd(nh, -1, 1), *dw = rnd(nw, -1, 1);
        void *g_h = up(h, nh * 4), *g_w = up(w, nw * 4), *g_lg = up(NULL, nl * 4),
             *g_dl = up(dl, nl * 4), *g_dh = up(dh, nh * 4), *g_dw = up(dw, nw * 4);
        print_message("lm_head N=%d C=%d V=%d dh=%d dwte=%d\n", N, C, V, hh, hw);
        rf_op_lm_head_fwd(lg, h, w, N, C, V);
        assert_int_equal(gpu->lm_head_fwd(gpu, g_lg, g_h, g_w, N, C, V), 0);
        check("lm_head_fwd", g_lg, lg, nl, tol);
        rf_op_lm_head_bwd(hh ? dh : NULL, hw ? dw : NULL, dl, h, w, N, C, V);
        assert_int_equal(
            gpu->lm_head_bwd(gpu, hh ? g_dh : NULL, hw ? g_dw : NULL, g_dl, g_h, g_w, N, C, V), 0);
        check("lm_head_bwd dh", g_dh, dh, nh, tol);
        check("lm_head_bwd dwte", g_dw, dw, nw, tol);
        void *gs[] = {g_h, g_w, g_lg, g_dl, g_dh, g_dw};
        gfree_all(gs, sizeof gs / sizeof gs[0]);
        free(h), free(w), free(lg), free(dl), free(dh), free(dw);
    }
}

static void test_conv1d_lm_head(void **state) {
    (void)state;
    need_gpu();
    conv1d_lm_head_cases(TOL);
}

/* cuda-bf16: the same stated 1e-2 as its linear layer. */
static void test_conv1d_lm_head_bf16(void **state) {
    (void)state;
    need_gpu();
    if (rf_backend_for("cuda-bf16", &gpu)) RF_SKIP("%s", rf_errmsg());
    conv1d_lm_head_cases(1e-2);
}

static void test_rmsnorm(void **state) {
    (void)state;
    need_gpu();
    /* N, C, dw */
    static const int shapes[][3] = {{1, 5, 1}, {7, 37, 0}, {300, 384, 1}, {64, 576, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], C = shapes[s][1], hw = shapes[s][2];
        size_t n = (size_t)N * C;
        float *x = rnd(n, -3, 3), *w = rnd(C, 0.5f, 1.5f), *out = rnd(n, 0, 0),
              *rstd = rnd(N, 0, 0), *dout = rnd(n, -1, 1), *dx = rnd(n, -1, 1), *dw = rnd(C, -1, 1);
        void *g_x = up(x, n * 4), *g_w = up(w, C * 4), *g_out = up(NULL, n * 4),
             *g_rstd = up(NULL, N * 4), *g_dout = up(dout, n * 4), *g_dx = up(dx, n * 4),
             *g_dw = up(dw, C * 4);
        print_message("rmsnorm N=%d C=%d dw=%d\n", N, C, hw);
        rf_op_rmsnorm_fwd(out, rstd, x, w, N, C, 1e-5f);
        assert_int_equal(gpu->rmsnorm_fwd(gpu, g_out, g_rstd, g_x, g_w, N, C, 1e-5f), 0);
        check("rmsnorm_fwd out", g_out, out, n, TOL);
        check("rmsnorm_fwd rstd", g_rstd, rstd, N, TOL);
        rf_op_rmsnorm_bwd(dx, hw ? dw : NULL, dout, x, w, rstd, N, C);
        assert_int_equal(
            gpu->rmsnorm_bwd(gpu, g_dx, hw ? g_dw : NULL, g_dout, g_x, g_w, g_rstd, N, C), 0);
        check("rmsnorm_bwd dinp", g_dx, dx, n, TOL);
        check("rmsnorm_bwd dw", g_dw, dw, C, TOL);
        void *gs[] = {g_x, g_w, g_out, g_rstd, g_dout, g_dx, g_dw};
        gfree_all(gs, sizeof gs / sizeof gs[0]);
        free(x), free(w), free(out), free(rstd), free(dout), free(dx), free(dw);
    }
}

/* RoPE as Llama uses it: q and k of a fused qkv buffer rotated in place
 * (out == inp, rows `stride` apart), backward into a non-zero dqkv. */
static void test_rope(void **state) {
    (void)state;
    need_gpu();
    /* B, T, NH, NKV, hs, packed pos, theta */
    static const int shapes[][7] = {{1, 1, 1, 1, 2, 0, 10000},
                                    {2, 7, 6, 2, 64, 1, 10000},
                                    {3, 33, 3, 1, 10, 0, 100000},
                                    {2, 128, 9, 3, 64, 1, 10000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], NH = shapes[s][2], NKV = shapes[s][3],
            hs = shapes[s][4], packed = shapes[s][5], N = B * T, W = (NH + 2 * NKV) * hs;
        float theta = (float)shapes[s][6];
        size_t n = (size_t)N * W;
        int32_t *pos = malloc((size_t)N * 4);
        for (int i = 0, p = 0; i < N; i++, p++) {
            if (i % T == 0 || rf_rng_below(&rng, 9) == 0) p = 0;
            pos[i] = p;
        }
        float *qkv = rnd(n, -2, 2), *dout = rnd(n, -1, 1), *dqkv = rnd(n, -1, 1);
        void *g_pos = up(pos, (size_t)N * 4), *g_qkv = up(qkv, n * 4), *g_dout = up(dout, n * 4),
             *g_dqkv = up(dqkv, n * 4);
        const int32_t *cp = packed ? pos : NULL, *gp = packed ? g_pos : NULL;
        float *gq = g_qkv, *gk = (float *)g_qkv + (size_t)NH * hs;
        print_message("rope B=%d T=%d NH=%d NKV=%d hs=%d packed=%d theta=%g\n", B, T, NH, NKV, hs,
                      packed, theta);
        rf_op_rope_fwd(qkv, qkv, cp, N, T, NH, hs, W, theta);
        rf_op_rope_fwd(qkv + (size_t)NH * hs, qkv + (size_t)NH * hs, cp, N, T, NKV, hs, W, theta);
        assert_int_equal(gpu->rope_fwd(gpu, gq, gq, gp, N, T, NH, hs, W, theta), 0);
        assert_int_equal(gpu->rope_fwd(gpu, gk, gk, gp, N, T, NKV, hs, W, theta), 0);
        check("rope_fwd (q and k in place)", g_qkv, qkv, n, TOL);
        rf_op_rope_bwd(dqkv, dout, cp, N, T, NH, hs, W, theta);
        rf_op_rope_bwd(dqkv + (size_t)NH * hs, dout + (size_t)NH * hs, cp, N, T, NKV, hs, W, theta);
        assert_int_equal(gpu->rope_bwd(gpu, g_dqkv, g_dout, gp, N, T, NH, hs, W, theta), 0);
        assert_int_equal(gpu->rope_bwd(gpu, (float *)g_dqkv + (size_t)NH * hs,
                                       (float *)g_dout + (size_t)NH * hs, gp, N, T, NKV, hs, W,
                                       theta),
                         0);
        check("rope_bwd", g_dqkv, dqkv, n, TOL);
        void *gs[] = {g_pos, g_qkv, g_dout, g_dqkv};
        gfree_all(gs, sizeof gs / sizeof gs[0]);
        free(pos), free(qkv), free(dout), free(dqkv);
    }
}

/* copy2d: a column block of a row-major matrix (Llama's v part), bit for bit,
 * the destination's other columns untouched. */
static void test_copy2d(void **state) {
    (void)state;
    need_gpu();
    /* rows, source width, destination width, first column, columns */
    static const int shapes[][5] = {{1, 5, 5, 0, 5}, {7, 48, 40, 16, 8}, {1000, 576, 576, 448, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int R = shapes[s][0], SW = shapes[s][1], DW = shapes[s][2], c0 = shapes[s][3],
            k = shapes[s][4];
        float *src = rnd((size_t)R * SW, -1, 1), *dst = rnd((size_t)R * DW, -1, 1);
        void *g_src = up(src, (size_t)R * SW * 4), *g_dst = up(dst, (size_t)R * DW * 4);
        print_message("copy2d rows=%d src width=%d dst width=%d columns [%d, %d)\n", R, SW, DW, c0,
                      c0 + k);
        assert_int_equal(cpu->copy2d(cpu, dst + c0, (size_t)DW * 4, src + c0, (size_t)SW * 4,
                                     (size_t)k * 4, (size_t)R),
                         0);
        assert_int_equal(gpu->copy2d(gpu, (float *)g_dst + c0, (size_t)DW * 4,
                                     (const float *)g_src + c0, (size_t)SW * 4, (size_t)k * 4,
                                     (size_t)R),
                         0);
        check_exact("copy2d", g_dst, dst, (size_t)R * DW);
        void *gs[] = {g_src, g_dst};
        gfree_all(gs, sizeof gs / sizeof gs[0]);
        free(src), free(dst);
    }
}

static void test_swiglu_gelu_tanh(void **state) {
    (void)state;
    need_gpu();
    static const int shapes[][2] = {{1, 1}, {7, 37}, {64, 1536}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], F = shapes[s][1];
        size_t n = (size_t)N * F;
        float *gu = rnd(2 * n, -5, 5), *out = rnd(n, 0, 0), *dout = rnd(n, -1, 1),
              *dgu = rnd(2 * n, -1, 1);
        void *g_gu = up(gu, 2 * n * 4), *g_out = up(NULL, n * 4), *g_dout = up(dout, n * 4),
             *g_dgu = up(dgu, 2 * n * 4);
        print_message("swiglu N=%d F=%d\n", N, F);
        rf_op_swiglu_fwd(out, gu, N, F);
        assert_int_equal(gpu->swiglu_fwd(gpu, g_out, g_gu, N, F), 0);
        check("swiglu_fwd", g_out, out, n, TOL);
        rf_op_swiglu_bwd(dgu, dout, gu, N, F);
        assert_int_equal(gpu->swiglu_bwd(gpu, g_dgu, g_dout, g_gu, N, F), 0);
        check("swiglu_bwd", g_dgu, dgu, 2 * n, TOL);
        /* gelu_tanh on the same n elements */
        float *dx = rnd(n, -1, 1);
        void *g_dx = up(dx, n * 4);
        print_message("gelu_tanh n=%zu\n", n);
        rf_op_gelu_tanh_fwd(out, gu, n);
        assert_int_equal(gpu->gelu_tanh_fwd(gpu, g_out, g_gu, n), 0);
        check("gelu_tanh_fwd", g_out, out, n, TOL);
        rf_op_gelu_tanh_bwd(dx, gu, dout, n);
        assert_int_equal(gpu->gelu_tanh_bwd(gpu, g_dx, g_gu, g_dout, n), 0);
        check("gelu_tanh_bwd", g_dx, dx, n, TOL);
        void *gs[] = {g_gu, g_out, g_dout, g_dgu, g_dx};
        gfree_all(gs, sizeof gs / sizeof gs[0]);
        free(gu), free(out), free(dout), free(dgu), free(dx);
    }
}

/* Causal attention on gpu (the fp32 backend, or cuda-bf16) within tol. With
 * `fused` (cuda-bf16), the forward with out runs the fused kernel
 * (flash_attention.cu: one launch, att untouched) for head sizes up to 64:
 * here 20 (padded to 32), 32 and 64, grouped heads, both masks, a query that
 * sees no key, and T up to 2100; so do the backward's recompute (one
 * launch) and the backward (two). */
static void causal_attention_cases(double tol, bool fused) {
    /* B, T, NH, NKV, hs, padded valid, packed seg */
    static const int shapes[][7] = {
        {1, 1, 1, 1, 32, 0, 0},    {2, 13, 6, 2, 20, 1, 0},    {3, 37, 6, 2, 64, 1, 1},
        {2, 64, 4, 4, 96, 0, 1},   {2, 128, 12, 12, 64, 1, 1}, {1, 16, 2, 1, 256, 1, 0},
        {1, 1024, 2, 1, 64, 0, 0}, {1, 9, 4, 2, 320, 1, 1},    {1, 2100, 1, 1, 32, 1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], NH = shapes[s][2], NKV = shapes[s][3],
            hs = shapes[s][4], hv = shapes[s][5], hg = shapes[s][6], W = (NH + 2 * NKV) * hs;
        size_t N = (size_t)B * T, nqkv = N * W, nout = N * NH * hs, natt = (size_t)B * NH * T * T;
        uint8_t *valid = malloc(N);
        int32_t *seg = malloc(N * 4);
        for (int b = 0; b < B; b++)
            for (int t = 0, d = 0; t < T; t++) {
                /* sequence b keeps T - 3b keys (at least 1); the last one
                 * also loses its first key, so its query 0 sees no key */
                valid[b * T + t] = t < (T - 3 * b > 1 ? T - 3 * b : 1) && !(b && b == B - 1 && !t);
                if (t && rf_rng_below(&rng, 7) == 0) d++; /* a document starts */
                seg[b * T + t] = d;
            }
        float *qkv = rnd(nqkv, -1, 1), *out = rnd(nout, 0, 0), *att = rnd(natt, 0, 0),
              *scr = rnd((size_t)B * NH * T, 0, 0), *dout = rnd(nout, -1, 1),
              *dqkv = rnd(nqkv, -1e-2f, 1e-2f);
        void *g_valid = up(valid, N), *g_seg = up(seg, N * 4), *g_qkv = up(qkv, nqkv * 4),
             *g_out = up(NULL, nout * 4), *g_att = up(NULL, natt * 4),
             *g_scr = up(NULL, (size_t)B * NH * T * 4), *g_dout = up(dout, nout * 4),
             *g_dqkv = up(dqkv, nqkv * 4);
        print_message("causal_attention B=%d T=%d NH=%d NKV=%d hs=%d valid=%d seg=%d\n", B, T, NH,
                      NKV, hs, hv, hg);
        rf_op_causal_attention_fwd(out, att, qkv, hv ? valid : NULL, hg ? seg : NULL, B, T, NH, NKV,
                                   hs);
        bool one = fused && hs <= 64;
        uint64_t o0 = ops_now();
        assert_int_equal(gpu->causal_attention_fwd(gpu, g_out, g_att, g_qkv, hv ? g_valid : NULL,
                                                   hg ? g_seg : NULL, B, T, NH, NKV, hs),
                         0);
        /* lists, scores, softmax, values; or the fused kernel */
        ops_expect(one ? "causal_attention_fwd (fused)" : "causal_attention_fwd", o0, one ? 1 : 4);
        check("causal_attention_fwd out", g_out, out, nout, tol);
        if (!one) check("causal_attention_fwd att", g_att, att, natt, tol); /* else only room */
        scribble(g_att, natt); /* the backward's recompute: the probabilities only */
        o0 = ops_now();
        assert_int_equal(gpu->causal_attention_fwd(gpu, NULL, g_att, g_qkv, hv ? g_valid : NULL,
                                                   hg ? g_seg : NULL, B, T, NH, NKV, hs),
                         0);
        /* lists, scores, softmax; or the fused statistics (each row's
         * log-sum-exp in att: room, not compared; the backward reads it) */
        ops_expect(one ? "causal_attention_fwd, no out (fused)" : "causal_attention_fwd, no out",
                   o0, one ? 1 : 3);
        if (!one) check("causal_attention_fwd att (no out)", g_att, att, natt, tol);
        rf_op_causal_attention_bwd(dqkv, scr, dout, qkv, att, B, T, NH, NKV, hs);
        o0 = ops_now();
        assert_int_equal(gpu->causal_attention_bwd(gpu, g_dqkv, g_scr, g_dout, g_qkv, g_att, g_out,
                                                   hv ? g_valid : NULL, hg ? g_seg : NULL, B, T, NH,
                                                   NKV, hs),
                         0);
        /* the fused queries' and keys' kernels; unfused, the lists, 2 products,
         * the softmax and NH / NKV products for each of dv and dk */
        ops_expect(one ? "causal_attention_bwd (fused)" : "causal_attention_bwd", o0,
                   one ? 2 : 4 + 2 * (uint64_t)(NH / NKV));
        check("causal_attention_bwd dqkv", g_dqkv, dqkv, nqkv, tol);
        void *gs[] = {g_valid, g_seg, g_qkv, g_out, g_att, g_scr, g_dout, g_dqkv};
        gfree_all(gs, sizeof gs / sizeof gs[0]);
        free(valid), free(seg), free(qkv), free(out), free(att), free(scr), free(dout), free(dqkv);
    }
}

static void test_causal_attention(void **state) {
    (void)state;
    need_gpu();
    causal_attention_cases(TOL, false);
}

/* cuda-bf16: as test_attention_bf16. */
static void test_causal_attention_bf16(void **state) {
    (void)state;
    need_gpu();
    if (rf_backend_for("cuda-bf16", &gpu)) RF_SKIP("%s", rf_errmsg());
    causal_attention_cases(1e-2, true);
}

static void test_causal_xent(void **state) {
    (void)state;
    need_gpu();
    /* B, T, V */
    static const int shapes[][3] = {{1, 1, 2}, {2, 7, 11}, {3, 17, 50257}, {2, 33, 49152}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], V = shapes[s][2], N = B * T;
        size_t n = (size_t)N * V;
        int32_t *labels = malloc((size_t)N * 4);
        for (int i = 0; i < N; i++) /* every fifth label ignored (-100), as padding or packing */
            labels[i] = i % 5 == 2 ? -100 : (int32_t)rf_rng_below(&rng, (uint64_t)V);
        float *z = rnd(n, -6, 6), *lse = rnd(N, 0, 0), *losses = rnd(N, 0, 0), *dz = rnd(n, 0, 0),
              gloss = -1;
        void *g_labels = up(labels, (size_t)N * 4), *g_z = up(z, n * 4),
             *g_lse = up(NULL, (size_t)N * 4), *g_losses = up(NULL, (size_t)N * 4),
             *g_dz = up(dz, n * 4);
        int counted = -1, gcounted = -2;
        print_message("causal_xent B=%d T=%d V=%d\n", B, T, V);
        float loss = rf_op_causal_xent_fwd(lse, losses, &counted, z, labels, B, T, V);
        assert_int_equal(
            gpu->causal_xent_fwd(gpu, &gloss, &gcounted, g_lse, g_losses, g_z, g_labels, B, T, V),
            0);
        check("causal_xent_fwd lse", g_lse, lse, N, TOL);
        check("causal_xent_fwd losses", g_losses, losses, N, TOL);
        print_message("  causal_xent_fwd loss cpu %.9g gpu %.9g, counted cpu %d gpu %d\n", loss,
                      gloss, counted, gcounted);
        assert_int_equal(gcounted, counted);
        assert_true(fabs((double)gloss - loss) <= TOL * fabs((double)loss) + 1e-12);
        /* counted may be NULL */
        assert_int_equal(
            gpu->causal_xent_fwd(gpu, &gloss, NULL, g_lse, g_losses, g_z, g_labels, B, T, V), 0);
        /* from zero gradients (a non-zero start of [-1, 1] would dwarf the
         * scale / counted terms), then once more onto that non-zero result */
        for (int pass = 0; pass < 2; pass++) {
            rf_op_causal_xent_bwd(dz, z, lse, labels, B, T, V, 0.5f);
            assert_int_equal(gpu->causal_xent_bwd(gpu, g_dz, g_z, g_lse, g_labels, B, T, V, 0.5f),
                             0);
            check(pass ? "causal_xent_bwd (accumulated)" : "causal_xent_bwd", g_dz, dz, n, TOL);
        }
        void *gs[] = {g_labels, g_z, g_lse, g_losses, g_dz};
        gfree_all(gs, sizeof gs / sizeof gs[0]);
        free(labels), free(z), free(lse), free(losses), free(dz);
    }
}

/* One LoRA adapter (lora.h: u = drop(x) A^T, out += s u B^T, and its
 * backward) against the CPU twin: outputs and gradients accumulate into
 * random values, rows of out / dout are ldo apart (a part of a fused
 * projection), with and without dropout (the same masks on both devices). */
static void test_lora(void **state) {
    (void)state;
    need_gpu();
    /* N, IC, OC, r, ldo - OC, dropout in percent, with dx */
    static const int shapes[][7] = {{1, 3, 5, 1, 0, 0, 1},
                                    {13, 37, 29, 4, 7, 10, 1},
                                    {64, 96, 80, 8, 0, 0, 0},
                                    {33, 64, 48, 2, 3, 20, 1}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        int N = shapes[sh][0], IC = shapes[sh][1], OC = shapes[sh][2], r = shapes[sh][3],
            ldo = OC + shapes[sh][4], hx = shapes[sh][6];
        float p = (float)shapes[sh][5] / 100.0f, sc = 2.0f;
        uint64_t seed = 1234 + sh;
        size_t ni = (size_t)N * IC, no = (size_t)N * ldo, nu = (size_t)N * r;
        float *x = rnd(ni, -1, 1), *A = rnd((size_t)r * IC, -0.3f, 0.3f),
              *B = rnd((size_t)OC * r, -0.3f, 0.3f), *out = rnd(no, -1, 1), *u = rnd(nu, 0, 0),
              *xd = rnd(ni, 0, 0), *du = rnd(nu, 0, 0), *dout = rnd(no, -1, 1),
              *dx = rnd(ni, -1, 1), *dA = rnd((size_t)r * IC, -1, 1),
              *dB = rnd((size_t)OC * r, -1, 1);
        void *g_x = up(x, ni * 4), *g_A = up(A, (size_t)r * IC * 4),
             *g_B = up(B, (size_t)OC * r * 4), *g_out = up(out, no * 4), *g_u = up(NULL, nu * 4),
             *g_xd = up(NULL, ni * 4), *g_du = up(NULL, nu * 4), *g_dout = up(dout, no * 4),
             *g_dx = up(dx, ni * 4), *g_dA = up(dA, (size_t)r * IC * 4),
             *g_dB = up(dB, (size_t)OC * r * 4);
        print_message("lora N=%d IC=%d OC=%d r=%d ldo=%d p=%.2f dx=%d\n", N, IC, OC, r, ldo,
                      (double)p, hx);
        assert_int_equal(cpu->lora_fwd(cpu, out, ldo, u, xd, x, A, B, N, IC, OC, r, sc, p, seed),
                         0);
        assert_int_equal(
            gpu->lora_fwd(gpu, g_out, ldo, g_u, g_xd, g_x, g_A, g_B, N, IC, OC, r, sc, p, seed), 0);
        check("lora_fwd out", g_out, out, no, TOL);
        check("lora_fwd u", g_u, u, nu, TOL);
        assert_int_equal(cpu->lora_bwd(cpu, hx ? dx : NULL, dA, dB, du, xd, dout, ldo, x, u, A, B,
                                       N, IC, OC, r, sc, p, seed),
                         0);
        assert_int_equal(gpu->lora_bwd(gpu, hx ? g_dx : NULL, g_dA, g_dB, g_du, g_xd, g_dout, ldo,
                                       g_x, g_u, g_A, g_B, N, IC, OC, r, sc, p, seed),
                         0);
        check("lora_bwd dx", g_dx, dx, ni, TOL);
        check("lora_bwd dA", g_dA, dA, (size_t)r * IC, TOL);
        check("lora_bwd dB", g_dB, dB, (size_t)OC * r, TOL);
        void *gs[] = {g_x, g_A, g_B, g_out, g_u, g_xd, g_du, g_dout, g_dx, g_dA, g_dB};
        gfree_all(gs, sizeof gs / sizeof gs[0]);
        free(x), free(A), free(B), free(out), free(u), free(xd), free(du), free(dout), free(dx);
        free(dA), free(dB);
    }
}

/* q's arrays copied to the device, in a descriptor of their own. */
static rf_qweight q_up(const rf_qweight *q) {
    size_t n = (size_t)q->rows * q->cols, nq = 0, ns = 0, na = 0;
    if (q->type == RF_QT_INT8) nq = n, ns = (size_t)q->rows * 4;
    if (q->type == RF_QT_NF4) nq = (n + 1) / 2, ns = q->ngroups * 4, na = q->nblocks;
    if (q->type == RF_QT_Q4_1) nq = n / RF_Q4_1_BLOCK * RF_Q4_1_BYTES;
    rf_qweight d = *q;
    d.q = up(q->q, nq);
    d.scale = ns ? up(q->scale, ns) : NULL;
    d.qabsmax = na ? up(q->qabsmax, na) : NULL;
    return d;
}

/* The quantized base's matmuls (quant.h) for int8, nf4 and q4_1 against the
 * CPU twin. The dequantization itself bit for bit: with an identity input
 * the product is the dequantized weight (transposed) exactly. */
static void test_qlinear(void **state) {
    (void)state;
    need_gpu();
    static const rf_qtype types[] = {RF_QT_INT8, RF_QT_NF4, RF_QT_Q4_1};
    static const char *names[] = {"int8", "nf4", "q4_1"};
    /* rows, cols, N */
    static const int shapes[][3] = {{5, 32, 1}, {29, 64, 13}, {130, 96, 33}, {3, 37, 4}};
    for (size_t t = 0; t < 3; t++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
            int R = shapes[sh][0], K = shapes[sh][1], N = shapes[sh][2], ldo = R + 3;
            if (types[t] == RF_QT_Q4_1 && K % RF_Q4_1_BLOCK) continue; /* Q4_1 rows: 32s */
            print_message("qlinear %s rows=%d cols=%d N=%d\n", names[t], R, K, N);
            float *w = rnd((size_t)R * K, -0.5f, 0.5f);
            rf_qweight q;
            assert_int_equal(rf_qweight_quantize(&q, types[t], w, R, K), 0);
            rf_qweight dq = q_up(&q);
            /* identity input: out[n, j] = W'[j, n] */
            float *eye = rnd((size_t)K * K, 0, 0), *deq = malloc((size_t)R * K * 4),
                  *wt = malloc((size_t)K * R * 4);
            for (int k = 0; k < K; k++)
                eye[(size_t)k * K + k] = 1.0f;
            rf_qweight_dequant(&q, deq);
            for (int j = 0; j < R; j++)
                for (int k = 0; k < K; k++)
                    wt[(size_t)k * R + j] = deq[(size_t)j * K + k];
            void *g_eye = up(eye, (size_t)K * K * 4), *g_wt = up(NULL, (size_t)K * R * 4);
            assert_int_equal(gpu->qlinear_fwd(gpu, g_wt, R, g_eye, &dq, NULL, K), 0);
            check_exact("qlinear dequantized", g_wt, wt, (size_t)K * R);
            /* the products, with a bias and rows ldo apart; backward accumulates */
            size_t ni = (size_t)N * K, no = (size_t)N * ldo;
            float *x = rnd(ni, -1, 1), *b = rnd(R, -1, 1), *out = rnd(no, -1, 1),
                  *dout = rnd(no, -1, 1), *dx = rnd(ni, -1, 1);
            void *g_x = up(x, ni * 4), *g_b = up(b, R * 4), *g_out = up(out, no * 4),
                 *g_dout = up(dout, no * 4), *g_dx = up(dx, ni * 4);
            assert_int_equal(cpu->qlinear_fwd(cpu, out, ldo, x, &q, b, N), 0);
            assert_int_equal(gpu->qlinear_fwd(gpu, g_out, ldo, g_x, &dq, g_b, N), 0);
            check("qlinear_fwd", g_out, out, no, TOL);
            assert_int_equal(cpu->qlinear_bwd(cpu, dx, dout, ldo, &q, N), 0);
            assert_int_equal(gpu->qlinear_bwd(gpu, g_dx, g_dout, ldo, &dq, N), 0);
            check("qlinear_bwd", g_dx, dx, ni, TOL);
            void *gs[] = {g_eye, g_wt, g_x, g_b, g_out, g_dout, g_dx, dq.q, dq.scale, dq.qabsmax};
            for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
                gfree(gs[i]);
            rf_qweight_free(&q);
            free(w), free(eye), free(deq), free(wt), free(x), free(b), free(out), free(dout);
            free(dx);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_linear),
#ifdef REFINERY_CUDA_EMU
        cmocka_unit_test(test_linear_lt_fallbacks),
#endif
        cmocka_unit_test(test_linear_bf16),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_bf16),
        cmocka_unit_test(test_tp_slots),
        cmocka_unit_test(test_vxent),
        cmocka_unit_test(test_kv_attention),
        cmocka_unit_test(test_pointwise),
        cmocka_unit_test(test_xent_argmax),
        cmocka_unit_test(test_optimizer),
        cmocka_unit_test(test_tokpos),
        cmocka_unit_test(test_conv1d_lm_head),
        cmocka_unit_test(test_conv1d_lm_head_bf16),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_copy2d),
        cmocka_unit_test(test_swiglu_gelu_tanh),
        cmocka_unit_test(test_causal_attention),
        cmocka_unit_test(test_causal_attention_bf16),
        cmocka_unit_test(test_causal_xent),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_qlinear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
