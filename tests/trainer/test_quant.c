/* The quantized frozen weights of quant.h: each quantizer against a
 * brute-force reimplementation of its rule written here (nearest codebook
 * value by exhaustive search, ggml's Q4_1 bounds), the layouts (NF4 nibble
 * order, Q4_1 row maps), the tiled matmuls against products with the fully
 * dequantized weight (in double), bitwise equality of 1 and 2 threads, and
 * refused inputs. The comparison with bitsandbytes itself is in
 * test_parity_lora (fixtures from scripts/parity/lora_fixtures.py). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <omp.h>

#include "common/error.h"
#include "common/rng.h"
#include "common/gguf.h"
#include "trainer/quant.h"

static rf_rng rng;

static float *randn(size_t n, float scale) {
    float *x = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) { /* sum of uniforms: roughly normal, heavier centre */
        double s = 0;
        for (int k = 0; k < 4; k++)
            s += rf_rng_double(&rng) - 0.5;
        x[i] = (float)(s * scale);
    }
    return x;
}

static void test_codes(void **state) {
    (void)state;
    for (int i = 0; i + 1 < 16; i++)
        assert_true(rf_nf4_code[i] < rf_nf4_code[i + 1]);
    for (int i = 0; i + 1 < 256; i++)
        assert_true(rf_dynamic_code[i] < rf_dynamic_code[i + 1]);
    assert_true(rf_nf4_code[7] == 0.0f && rf_nf4_code[15] == 1.0f && rf_nf4_code[0] == -1.0f);
    assert_true(rf_dynamic_code[255] == 1.0f);
}

/* Nearest code by exhaustive search (the first on a tie); the quantizer's
 * bucket rule must give the same index except exactly on a midpoint. */
static int nearest(const float *code, int n, float s) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (fabsf(s - code[i]) < fabsf(s - code[best])) best = i;
    return best;
}

static void test_int8(void **state) {
    (void)state;
    int R = 37, K = 45;
    float *w = randn((size_t)R * K, 2), *d = malloc(sizeof(float) * R * K);
    w[5 * K + 3] = 0; /* a zero in a row */
    for (int k = 0; k < K; k++)
        w[7 * K + k] = 0; /* an all-zero row */
    rf_qweight q;
    assert_int_equal(rf_qweight_quantize(&q, RF_QT_INT8, w, R, K), RF_OK);
    rf_qweight_dequant(&q, d);
    double worst = 0;
    for (int r = 0; r < R; r++) {
        float s = 0;
        for (int k = 0; k < K; k++)
            s = fmaxf(s, fabsf(w[r * K + k]));
        assert_true(q.scale[r] == s);
        for (int k = 0; k < K; k++) {
            int8_t c = (int8_t)q.q[r * K + k];
            float want = s > 0 ? nearbyintf(w[r * K + k] * (127.0f / s)) : 0;
            assert_int_equal(c, (int)want);
            assert_true(d[r * K + k] == (float)c * s * 7.874015718698502e-3f);
            if (s > 0) worst = fmax(worst, fabs(d[r * K + k] - w[r * K + k]) / s);
        }
    }
    printf("  int8: worst |W' - W| / row absmax %.3g (bound 1/254 = %.3g)\n", worst, 1.0 / 254);
    assert_true(worst <= 0.5 / 127 * 1.001);
    assert_int_equal(rf_qweight_bytes(&q), (size_t)R * K + (size_t)R * 4);
    rf_qweight_free(&q);
    free(w), free(d);
}

/* NF4 with double quantization on shapes with a partial 64-block, an odd
 * element count and more than one 256-group of blocks. */
static void check_nf4(int R, int K) {
    size_t n = (size_t)R * K, nb = (n + 63) / 64;
    float *w = randn(n, 0.1f), *d = malloc(sizeof(float) * n);
    for (int i = 0; i < 64 && (size_t)i < n; i++)
        w[i] = 0; /* an all-zero block: codes 7 (0.0), as bitsandbytes */
    rf_qweight q;
    assert_int_equal(rf_qweight_quantize(&q, RF_QT_NF4, w, R, K), RF_OK);
    assert_int_equal(q.nblocks, nb);
    assert_int_equal(q.ngroups, (nb + 255) / 256);
    /* block absmaxes, their mean, and the 8-bit codes of absmax - mean */
    float *absmax = malloc(sizeof(float) * nb);
    double mean = 0;
    for (size_t b = 0; b < nb; b++) {
        float a = 0;
        for (size_t i = b * 64; i < n && i < b * 64 + 64; i++)
            a = fmaxf(a, fabsf(w[i]));
        absmax[b] = a;
        mean += a;
    }
    float off = (float)(mean / nb);
    assert_true(q.offset == off);
    size_t ties = 0, mism = 0;
    for (size_t g = 0; g < q.ngroups; g++) {
        float a2 = 0;
        for (size_t b = g * 256; b < nb && b < g * 256 + 256; b++)
            a2 = fmaxf(a2, fabsf(absmax[b] - off));
        assert_true(q.scale[g] == a2);
        for (size_t b = g * 256; b < nb && b < g * 256 + 256; b++) {
            bool full = nb - g * 256 >= 256;
            float s = full ? (absmax[b] - off) * (1.0f / a2) : (absmax[b] - off) / a2;
            int want = nearest(rf_dynamic_code, 256, s);
            mism += q.qabsmax[b] != want;
        }
    }
    for (size_t i = 0; i < n; i++) {
        size_t b = i / 64;
        bool full = n - b * 64 >= 64;
        float a = absmax[b] > 1e-38f ? absmax[b] : 1e-38f;
        float s = full ? w[i] * (1.0f / a) : w[i] / a;
        int want = nearest(rf_nf4_code, 16, s), got = i % 2 ? q.q[i / 2] & 15 : q.q[i / 2] >> 4;
        if (got != want) {
            /* only a value exactly on a midpoint may differ (it goes down) */
            float mid = (rf_nf4_code[got] + rf_nf4_code[want]) / 2;
            assert_true(abs(got - want) == 1 && s == mid);
            ties++;
        }
    }
    if (n % 2) assert_int_equal(q.q[n / 2] & 15, 7); /* the pad nibble */
    rf_qweight_dequant(&q, d);
    double e2 = 0, w2 = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = i / 64;
        float sc = rf_dynamic_code[q.qabsmax[b]] * q.scale[b / 256];
        sc = sc + q.offset;
        int c = i % 2 ? q.q[i / 2] & 15 : q.q[i / 2] >> 4;
        assert_true(d[i] == rf_nf4_code[c] * sc);
        e2 += ((double)d[i] - w[i]) * ((double)d[i] - w[i]);
        w2 += (double)w[i] * w[i];
    }
    printf("  nf4 [%d, %d]: %zu blocks, %zu groups, 8-bit codes off the nearest %zu, 4-bit ties "
           "%zu; relative error of W' %.3g\n",
           R, K, nb, q.ngroups, mism, ties, sqrt(e2 / w2));
    assert_int_equal(mism, 0);
    assert_true(sqrt(e2 / w2) < 0.15); /* 4-bit: ~0.1 for bell-shaped weights */
    assert_int_equal(rf_qweight_bytes(&q), (n + 1) / 2 + nb + q.ngroups * 4 + 4);
    rf_qweight_free(&q);
    free(w), free(d), free(absmax);
}

static void test_nf4(void **state) {
    (void)state;
    check_nf4(32, 64);   /* whole blocks, one group */
    check_nf4(37, 29);   /* odd count: partial block, pad nibble */
    check_nf4(300, 130); /* 610 blocks: three groups, the last partial */
}

/* Q4_1 by ggml's rule: per 32-block d = (max - min) / 15 and m = min as
 * halves, codes round((x - min) / d) clamped to 15. */
static void test_q4_1(void **state) {
    (void)state;
    int R = 5, K = 96;
    float *w = randn((size_t)R * K, 1), *d = malloc(sizeof(float) * R * K);
    for (int k = 0; k < 32; k++)
        w[k] = 0.25f; /* a constant block: d = 0 */
    rf_qweight q;
    assert_int_equal(rf_qweight_quantize(&q, RF_QT_Q4_1, w, R, K), RF_OK);
    rf_qweight_dequant(&q, d);
    float *ref = malloc(sizeof(float) * R * K);
    assert_int_equal(rf_gguf_dequant_row(RF_GGML_Q4_1, q.q, ref, (uint64_t)R * K), 0);
    assert_memory_equal(d, ref, sizeof(float) * R * K);
    for (int b = 0; b < R * K / 32; b++) {
        const uint8_t *y = q.q + 20 * b;
        float dd = rf_gguf_f16_to_f32((uint16_t)(y[0] | y[1] << 8)),
              m = rf_gguf_f16_to_f32((uint16_t)(y[2] | y[3] << 8));
        float mn = INFINITY, mx = -INFINITY;
        for (int j = 0; j < 32; j++)
            mn = fminf(mn, w[32 * b + j]), mx = fmaxf(mx, w[32 * b + j]);
        assert_true(fabsf(m - mn) <= fabsf(mn) * 0x1p-11f + 0x1p-25f); /* a half's rounding */
        assert_true(fabsf(dd - (mx - mn) / 15) <= (mx - mn) / 15 * 0x1p-11f + 0x1p-25f);
        for (int j = 0; j < 32; j++)
            assert_true(fabsf(d[32 * b + j] - w[32 * b + j]) <= dd * 0.51f + fabsf(mn) * 0x1p-10f);
    }
    assert_true(d[0] == rf_gguf_f16_to_f32(0x3400)); /* 0.25 exactly, code 0 */
    /* adopting blocks with a row map: row r of the result is source row map[r] */
    int32_t map[5] = {4, 2, 0, 1, 3};
    rf_qweight p;
    assert_int_equal(rf_qweight_from_q4_1(&p, q.q, (size_t)R * K / 32 * 20, R, K, map), RF_OK);
    float *row = malloc(sizeof(float) * K);
    for (int r = 0; r < R; r++) {
        rf_qweight_dequant_rows(&p, r, r + 1, row);
        assert_memory_equal(row, d + (size_t)map[r] * K, sizeof(float) * K);
    }
    rf_qweight_free(&p); /* the refusals below reuse p */
    /* refused */
    assert_int_equal(rf_qweight_from_q4_1(&p, q.q, 10, R, K, NULL), RF_ERR_INVALID);
    map[2] = 5;
    assert_int_equal(rf_qweight_from_q4_1(&p, q.q, (size_t)R * K / 32 * 20, R, K, map),
                     RF_ERR_RANGE);
    assert_int_equal(rf_qweight_from_q4_1(&p, q.q, 100, 5, 40, NULL), RF_ERR_INVALID);
    assert_int_equal(rf_qweight_quantize(&p, RF_QT_Q4_1, w, 3, 40), RF_ERR_INVALID);
    rf_qweight_free(&q);
    free(w), free(d), free(ref), free(row);
}

static void test_refused(void **state) {
    (void)state;
    float w[8] = {1, 2, NAN, 4, 5, 6, 7, 8};
    rf_qweight q;
    assert_int_equal(rf_qweight_quantize(&q, RF_QT_NF4, w, 2, 4), RF_ERR_INVALID);
    w[2] = INFINITY;
    assert_int_equal(rf_qweight_quantize(&q, RF_QT_INT8, w, 2, 4), RF_ERR_INVALID);
    w[2] = 3;
    assert_int_equal(rf_qweight_quantize(&q, RF_QT_NF4, w, 0, 4), RF_ERR_INVALID);
    assert_int_equal(rf_qweight_quantize(&q, RF_QT_F32, w, 2, 4), RF_ERR_INVALID);
    uint8_t packed[4] = {0}, qa[1] = {0};
    float a2 = 1;
    assert_int_equal(rf_qweight_from_nf4(&q, 2, 4, packed, 4, qa, 1, &a2, 1, 0.5f), RF_OK);
    rf_qweight_free(&q);
    assert_int_equal(rf_qweight_from_nf4(&q, 2, 4, packed, 3, qa, 1, &a2, 1, 0.5f), RF_ERR_INVALID);
    assert_int_equal(rf_qweight_from_nf4(&q, 2, 4, packed, 4, qa, 2, &a2, 1, 0.5f), RF_ERR_INVALID);
    assert_int_equal(rf_qweight_from_nf4(&q, 2, 4, packed, 4, qa, 1, &a2, 1, NAN), RF_ERR_INVALID);
    rf_qweight_free(NULL);
}

/* The tiled matmuls against double-precision products with the dequantized
 * weight, for every format, with a bias and a wider output row (ldo > rows:
 * the other columns must stay untouched), N below and above one piece. */
static void check_matmul(rf_qtype t, int R, int K, int N) {
    float *w = randn((size_t)R * K, 0.5f), *x = randn((size_t)N * K, 1), *b = randn(R, 1);
    float *dq = malloc(sizeof(float) * R * K);
    rf_qweight q;
    assert_int_equal(rf_qweight_quantize(&q, t, w, R, K), RF_OK);
    rf_qweight_dequant(&q, dq);
    int ldo = R + 3;
    float *out = randn((size_t)N * ldo, 1), *keep = malloc(sizeof(float) * N * ldo);
    memcpy(keep, out, sizeof(float) * N * ldo);
    assert_int_equal(rf_op_qlinear_fwd(out, ldo, x, &q, b, N), RF_OK);
    double e = 0, s = 0;
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < R; j++) {
            double ref = b[j];
            for (int k = 0; k < K; k++)
                ref += (double)x[n * K + k] * dq[j * K + k];
            e = fmax(e, fabs(out[n * ldo + j] - ref));
            s = fmax(s, fabs(ref));
        }
        for (int j = R; j < ldo; j++)
            assert_true(out[n * ldo + j] == keep[n * ldo + j]);
    }
    double ef = e / s;
    /* backward: dinp += dout W' (dout with row stride ldo) */
    float *dout = randn((size_t)N * ldo, 1), *dx = randn((size_t)N * K, 1),
          *dx0 = malloc(sizeof(float) * N * K);
    memcpy(dx0, dx, sizeof(float) * N * K);
    assert_int_equal(rf_op_qlinear_bwd(dx, dout, ldo, &q, N), RF_OK);
    e = 0, s = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            double ref = dx0[n * K + k];
            for (int j = 0; j < R; j++)
                ref += (double)dout[n * ldo + j] * dq[j * K + k];
            e = fmax(e, fabs(dx[n * K + k] - ref));
            s = fmax(s, fabs(ref));
        }
    printf("  qlinear %-4s [%d, %d] N %d: forward %.2e, backward %.2e (max error / max value)\n",
           t == RF_QT_INT8  ? "int8"
           : t == RF_QT_NF4 ? "nf4"
                            : "q4_1",
           R, K, N, ef, e / s);
    assert_true(ef < 1e-5 && e / s < 1e-5);
    /* 1 and 2 threads: the same bits */
    float *o1 = malloc(sizeof(float) * N * ldo), *o2 = malloc(sizeof(float) * N * ldo);
    float *g1 = calloc((size_t)N * K, sizeof(float)), *g2 = calloc((size_t)N * K, sizeof(float));
    omp_set_num_threads(1);
    rf_op_qlinear_fwd(o1, ldo, x, &q, b, N);
    rf_op_qlinear_bwd(g1, dout, ldo, &q, N);
    omp_set_num_threads(2);
    rf_op_qlinear_fwd(o2, ldo, x, &q, b, N);
    rf_op_qlinear_bwd(g2, dout, ldo, &q, N);
    for (int n = 0; n < N; n++)
        assert_memory_equal(o1 + (size_t)n * ldo, o2 + (size_t)n * ldo, sizeof(float) * R);
    assert_memory_equal(g1, g2, sizeof(float) * N * K);
    rf_qweight_free(&q);
    free(w), free(x), free(b), free(dq), free(out), free(keep), free(dout), free(dx), free(dx0);
    free(o1), free(o2), free(g1), free(g2);
}

static void test_matmul(void **state) {
    (void)state;
    check_matmul(RF_QT_INT8, 300, 70, 5);   /* 3 row tiles, one piece */
    check_matmul(RF_QT_NF4, 131, 261, 300); /* column tiles 128+128+5, two pieces */
    check_matmul(RF_QT_NF4, 37, 29, 7);     /* odd element count */
    check_matmul(RF_QT_Q4_1, 140, 160, 260);
}

int main(void) {
    rf_rng_seed(&rng, 12345);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes), cmocka_unit_test(test_int8),    cmocka_unit_test(test_nf4),
        cmocka_unit_test(test_q4_1),  cmocka_unit_test(test_refused), cmocka_unit_test(test_matmul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
