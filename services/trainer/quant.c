/* Quantized frozen weights: quantizers (bitsandbytes' reference rules, ggml's
 * Q4_1), dequantization of any element range, and the tiled matmuls. See
 * quant.h for the formats. Products stay as written (no fused multiply-add:
 * module.mk compiles this file with -ffp-contract=off) so that dequantized
 * values equal bitsandbytes' float arithmetic bit for bit. */
#include "trainer/quant.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/gguf.h"

#define ROW_PIECES 8 /* pieces of the N batch rows, as ops.c */
#define PIECE_MIN  128

static int pieces(int n, int want) {
    int p = n / PIECE_MIN;
    return p < 1 ? 1 : p < want ? p : want;
}

/* bitsandbytes' NF4 values (functional.py / CUDA dDequantizeNF4). */
const float rf_nf4_code[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

/* bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7,
 * total_bits=8) as float32, sorted (test_quant compares it with the table
 * scripts/parity/lora_fixtures.py took from bitsandbytes). */
const float rf_dynamic_code[256] = {
    -0x1.fc6666p-1f,  -0x1.f53334p-1f,  -0x1.eep-1f,      -0x1.e6ccccp-1f,
    -0x1.df999ap-1f,  -0x1.d86666p-1f,  -0x1.d13334p-1f,  -0x1.cap-1f,
    -0x1.c2ccccp-1f,  -0x1.bb999ap-1f,  -0x1.b46666p-1f,  -0x1.ad3334p-1f,
    -0x1.a6p-1f,      -0x1.9eccccp-1f,  -0x1.97999ap-1f,  -0x1.906666p-1f,
    -0x1.893334p-1f,  -0x1.82p-1f,      -0x1.7accccp-1f,  -0x1.73999ap-1f,
    -0x1.6c6668p-1f,  -0x1.653334p-1f,  -0x1.5ep-1f,      -0x1.56ccccp-1f,
    -0x1.4f999ap-1f,  -0x1.486668p-1f,  -0x1.413334p-1f,  -0x1.3ap-1f,
    -0x1.32ccccp-1f,  -0x1.2b999ap-1f,  -0x1.246668p-1f,  -0x1.1d3334p-1f,
    -0x1.16p-1f,      -0x1.0eccccp-1f,  -0x1.079998p-1f,  -0x1.006666p-1f,
    -0x1.f26664p-2f,  -0x1.e4p-2f,      -0x1.d59998p-2f,  -0x1.c73334p-2f,
    -0x1.b8ccccp-2f,  -0x1.aa6666p-2f,  -0x1.9cp-2f,      -0x1.8d9998p-2f,
    -0x1.7f3334p-2f,  -0x1.70ccccp-2f,  -0x1.626666p-2f,  -0x1.54p-2f,
    -0x1.459998p-2f,  -0x1.373334p-2f,  -0x1.28ccccp-2f,  -0x1.1a6668p-2f,
    -0x1.0cp-2f,      -0x1.fb3332p-3f,  -0x1.de6666p-3f,  -0x1.c1999ap-3f,
    -0x1.a4ccccp-3f,  -0x1.88p-3f,      -0x1.6b3334p-3f,  -0x1.4e6666p-3f,
    -0x1.31999ap-3f,  -0x1.14ccccp-3f,  -0x1.fp-4f,       -0x1.b66668p-4f,
    -0x1.93d70ap-4f,  -0x1.8851eep-4f,  -0x1.7ccccep-4f,  -0x1.7147aep-4f,
    -0x1.65c29p-4f,   -0x1.5a3d7p-4f,   -0x1.4eb854p-4f,  -0x1.433334p-4f,
    -0x1.37ae14p-4f,  -0x1.2c28f6p-4f,  -0x1.20a3d6p-4f,  -0x1.151ebap-4f,
    -0x1.09999ap-4f,  -0x1.fc28f6p-5f,  -0x1.e51ebap-5f,  -0x1.ce147ap-5f,
    -0x1.b70a3ep-5f,  -0x1.ap-5f,       -0x1.88f5c2p-5f,  -0x1.71eb86p-5f,
    -0x1.5ae146p-5f,  -0x1.43d70ap-5f,  -0x1.2ccccep-5f,  -0x1.15c29p-5f,
    -0x1.fd70a4p-6f,  -0x1.cf5c2ap-6f,  -0x1.a147aep-6f,  -0x1.733334p-6f,
    -0x1.451ebap-6f,  -0x1.170a3ep-6f,  -0x1.d1eb86p-7f,  -0x1.75c29p-7f,
    -0x1.3e76c8p-7f,  -0x1.2c083p-7f,   -0x1.19999ap-7f,  -0x1.072b02p-7f,
    -0x1.e978d4p-8f,  -0x1.c49ba6p-8f,  -0x1.9fbe76p-8f,  -0x1.7ae148p-8f,
    -0x1.56041ap-8f,  -0x1.3126e8p-8f,  -0x1.0c49bap-8f,  -0x1.ced914p-9f,
    -0x1.851eb8p-9f,  -0x1.3b645ap-9f,  -0x1.e353f8p-10f, -0x1.4fdf3ap-10f,
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f,   -0x1.3dd982p-11f,
    -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f,
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0.0f,
    0x1.27476ep-21f,  0x1.b43528p-19f,  0x1.040bfep-17f,  0x1.64840cp-16f,
    0x1.6f0068p-15f,  0x1.15df66p-14f,  0x1.743e96p-14f,  0x1.47ae16p-13f,
    0x1.19ce0ap-12f,  0x1.8fc506p-12f,  0x1.02de02p-11f,  0x1.3dd982p-11f,
    0x1.78d5p-11f,    0x1.b3d07cp-11f,  0x1.eecbfep-11f,  0x1.4fdf3ap-10f,
    0x1.e353f8p-10f,  0x1.3b645ap-9f,   0x1.851eb8p-9f,   0x1.ced914p-9f,
    0x1.0c49bap-8f,   0x1.3126e8p-8f,   0x1.56041ap-8f,   0x1.7ae148p-8f,
    0x1.9fbe76p-8f,   0x1.c49ba6p-8f,   0x1.e978d4p-8f,   0x1.072b02p-7f,
    0x1.19999ap-7f,   0x1.2c083p-7f,    0x1.3e76c8p-7f,   0x1.75c29p-7f,
    0x1.d1eb86p-7f,   0x1.170a3ep-6f,   0x1.451ebap-6f,   0x1.733334p-6f,
    0x1.a147aep-6f,   0x1.cf5c2ap-6f,   0x1.fd70a4p-6f,   0x1.15c29p-5f,
    0x1.2ccccep-5f,   0x1.43d70ap-5f,   0x1.5ae146p-5f,   0x1.71eb86p-5f,
    0x1.88f5c2p-5f,   0x1.ap-5f,        0x1.b70a3ep-5f,   0x1.ce147ap-5f,
    0x1.e51ebap-5f,   0x1.fc28f6p-5f,   0x1.09999ap-4f,   0x1.151ebap-4f,
    0x1.20a3d6p-4f,   0x1.2c28f6p-4f,   0x1.37ae14p-4f,   0x1.433334p-4f,
    0x1.4eb854p-4f,   0x1.5a3d7p-4f,    0x1.65c29p-4f,    0x1.7147aep-4f,
    0x1.7ccccep-4f,   0x1.8851eep-4f,   0x1.93d70ap-4f,   0x1.b66668p-4f,
    0x1.fp-4f,        0x1.14ccccp-3f,   0x1.31999ap-3f,   0x1.4e6666p-3f,
    0x1.6b3334p-3f,   0x1.88p-3f,       0x1.a4ccccp-3f,   0x1.c1999ap-3f,
    0x1.de6666p-3f,   0x1.fb3332p-3f,   0x1.0cp-2f,       0x1.1a6668p-2f,
    0x1.28ccccp-2f,   0x1.373334p-2f,   0x1.459998p-2f,   0x1.54p-2f,
    0x1.626666p-2f,   0x1.70ccccp-2f,   0x1.7f3334p-2f,   0x1.8d9998p-2f,
    0x1.9cp-2f,       0x1.aa6666p-2f,   0x1.b8ccccp-2f,   0x1.c73334p-2f,
    0x1.d59998p-2f,   0x1.e4p-2f,       0x1.f26664p-2f,   0x1.006666p-1f,
    0x1.079998p-1f,   0x1.0eccccp-1f,   0x1.16p-1f,       0x1.1d3334p-1f,
    0x1.246668p-1f,   0x1.2b999ap-1f,   0x1.32ccccp-1f,   0x1.3ap-1f,
    0x1.413334p-1f,   0x1.486668p-1f,   0x1.4f999ap-1f,   0x1.56ccccp-1f,
    0x1.5ep-1f,       0x1.653334p-1f,   0x1.6c6668p-1f,   0x1.73999ap-1f,
    0x1.7accccp-1f,   0x1.82p-1f,       0x1.893334p-1f,   0x1.906666p-1f,
    0x1.97999ap-1f,   0x1.9eccccp-1f,   0x1.a6p-1f,       0x1.ad3334p-1f,
    0x1.b46666p-1f,   0x1.bb999ap-1f,   0x1.c2ccccp-1f,   0x1.cap-1f,
    0x1.d13334p-1f,   0x1.d86666p-1f,   0x1.df999ap-1f,   0x1.e6ccccp-1f,
    0x1.eep-1f,       0x1.f53334p-1f,   0x1.fc6666p-1f,   0x1p+0f,
};

/* ---- helpers ---- */

static int check_shape(int rows, int cols) {
    if (rows < 1 || cols < 1 || (size_t)rows * (size_t)cols > ((size_t)1 << 40))
        return rf_fail(RF_ERR_INVALID, "quant: bad weight shape [%d, %d]", rows, cols);
    return RF_OK;
}

/* IEEE float -> half, round to nearest even (as F16C's _cvtss_sh, ggml's
 * GGML_FP32_TO_FP16 on x86). */
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00 | (m ? 0x200 : 0));
    int ex = (int)e - 127 + 15;
    if (ex >= 31) return (uint16_t)(sign | 0x7c00);
    if (ex <= 0) { /* subnormal half (or zero) */
        if (ex < -10) return (uint16_t)sign;
        m |= 0x800000;
        int shift = 14 - ex;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (uint32_t)ex << 10 | m >> 13, rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into the exponent: right */
    return (uint16_t)(sign | h);
}

/* Number of midpoints (code[i] + code[i+1]) / 2 strictly below s: torch.bucketize
 * (right=False) as bitsandbytes' reference kernels use it. */
static int bucket(const float *mid, int nmid, float s) {
    int lo = 0, hi = nmid; /* first index with mid >= s */
    while (lo < hi) {
        int m = (lo + hi) / 2;
        if (mid[m] < s)
            lo = m + 1;
        else
            hi = m;
    }
    return lo;
}

/* Blockwise absmax quantization onto a sorted code (bitsandbytes'
 * quantize_blockwise / quantize_4bit reference kernels): absmax per block of
 * `bs` (stored unclamped), scaled = clamp(x * (1 / max(absmax, 1e-38)), -1, 1)
 * for full blocks and x / max(absmax, 1e-38) for the last partial one, code
 * index = bucket of the midpoints. */
static void blockwise(const float *x, size_t n, size_t bs, const float *code, int ncode,
                      float *absmax, uint8_t *idx) {
    float mid[255];
    for (int i = 0; i + 1 < ncode; i++)
        mid[i] = (code[i] + code[i + 1]) / 2.0f;
    for (size_t b0 = 0; b0 < n; b0 += bs) {
        size_t b1 = b0 + bs < n ? b0 + bs : n;
        float a = 0;
        for (size_t i = b0; i < b1; i++)
            a = fmaxf(a, fabsf(x[i]));
        float am = a > 1e-38f ? a : 1e-38f, inv = 1.0f / am;
        bool full = b1 - b0 == bs;
        absmax[b0 / bs] = full ? a : am; /* bitsandbytes keeps a partial block's clamped */
        for (size_t i = b0; i < b1; i++) {
            float s = full ? x[i] * inv : x[i] / am;
            s = s < -1.0f ? -1.0f : s > 1.0f ? 1.0f : s;
            idx[i] = (uint8_t)bucket(mid, ncode - 1, s);
        }
    }
}

static int quant_int8(rf_qweight *q, const float *w) {
    size_t R = (size_t)q->rows, K = (size_t)q->cols;
    if (!(q->q = malloc(R * K)) || !(q->scale = malloc(R * sizeof(float)))) return RF_ERR_NOMEM;
    for (size_t r = 0; r < R; r++) {
        const float *x = w + r * K;
        float a = 0;
        for (size_t k = 0; k < K; k++)
            a = fmaxf(a, fabsf(x[k]));
        q->scale[r] = a;
        float f = 127.0f / a; /* torch: A * (127.0 / row_stats) */
        for (size_t k = 0; k < K; k++) {
            float v = a > 0 ? nearbyintf(x[k] * f) : 0.0f;
            q->q[r * K + k] = (uint8_t)(int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
    return RF_OK;
}

static int quant_nf4(rf_qweight *q, const float *w) {
    size_t n = (size_t)q->rows * q->cols;
    size_t nb = (n + RF_NF4_BLOCK - 1) / RF_NF4_BLOCK, ng = (nb + RF_NF4_GROUP - 1) / RF_NF4_GROUP;
    uint8_t *codes = malloc(n + 1);
    float *absmax = malloc(nb * sizeof(float));
    q->q = calloc((n + 1) / 2, 1);
    q->qabsmax = malloc(nb);
    q->scale = malloc(ng * sizeof(float));
    if (!codes || !absmax || !q->q || !q->qabsmax || !q->scale) {
        free(codes), free(absmax);
        return RF_ERR_NOMEM;
    }
    blockwise(w, n, RF_NF4_BLOCK, rf_nf4_code, 16, absmax, codes);
    if (n % 2) codes[n] = 7; /* bitsandbytes pads with a 0.0, code 7 */
    for (size_t j = 0; j < (n + 1) / 2; j++)
        q->q[j] = (uint8_t)(codes[2 * j] << 4 | codes[2 * j + 1]);
    double sum = 0;
    for (size_t b = 0; b < nb; b++)
        sum += absmax[b];
    q->offset = (float)(sum / (double)nb);
    for (size_t b = 0; b < nb; b++)
        absmax[b] -= q->offset;
    blockwise(absmax, nb, RF_NF4_GROUP, rf_dynamic_code, 256, q->scale, q->qabsmax);
    q->nblocks = nb, q->ngroups = ng;
    free(codes), free(absmax);
    return RF_OK;
}

/* ggml's quantize_row_q4_1_ref. */
static int quant_q4_1(rf_qweight *q, const float *w) {
    size_t n = (size_t)q->rows * q->cols, nb = n / RF_Q4_1_BLOCK;
    if (q->cols % RF_Q4_1_BLOCK)
        return rf_fail(RF_ERR_INVALID, "quant: Q4_1 needs rows of a multiple of 32 weights, not %d",
                       q->cols);
    if (!(q->q = malloc(nb * RF_Q4_1_BYTES))) return RF_ERR_NOMEM;
    for (size_t b = 0; b < nb; b++) {
        const float *x = w + b * RF_Q4_1_BLOCK;
        uint8_t *y = q->q + b * RF_Q4_1_BYTES;
        float mn = FLT_MAX, mx = -FLT_MAX;
        for (int j = 0; j < RF_Q4_1_BLOCK; j++) {
            if (x[j] < mn) mn = x[j];
            if (x[j] > mx) mx = x[j];
        }
        float d = (mx - mn) / 15, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t hd = f32_to_f16(d), hm = f32_to_f16(mn);
        y[0] = (uint8_t)hd, y[1] = (uint8_t)(hd >> 8), y[2] = (uint8_t)hm,
        y[3] = (uint8_t)(hm >> 8);
        for (int j = 0; j < 16; j++) {
            float x0 = (x[j] - mn) * id, x1 = (x[16 + j] - mn) * id;
            int q0 = (int8_t)(x0 + 0.5f), q1 = (int8_t)(x1 + 0.5f);
            q0 = q0 < 15 ? q0 : 15, q1 = q1 < 15 ? q1 : 15;
            y[4 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
    return RF_OK;
}

int rf_qweight_quantize(rf_qweight *q, rf_qtype type, const float *w, int rows, int cols) {
    memset(q, 0, sizeof *q);
    int rc = check_shape(rows, cols);
    if (rc) return rc;
    size_t n = (size_t)rows * cols;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(w[i]))
            return rf_fail(RF_ERR_INVALID, "quant: weight %zu is not finite (%g)", i, w[i]);
    q->type = type, q->rows = rows, q->cols = cols;
    switch (type) {
    case RF_QT_INT8:
        rc = quant_int8(q, w);
        break;
    case RF_QT_NF4:
        rc = quant_nf4(q, w);
        break;
    case RF_QT_Q4_1:
        rc = quant_q4_1(q, w);
        break;
    default:
        rc = rf_fail(RF_ERR_INVALID, "quant: cannot quantize to type %d", (int)type);
    }
    if (rc) rf_qweight_free(q);
    return rc;
}

int rf_qweight_quantize_t(rf_qweight *q, rf_qtype type, const float *wt, int rows, int cols) {
    memset(q, 0, sizeof *q);
    int rc = check_shape(rows, cols);
    if (rc) return rc;
    float *w = malloc((size_t)rows * cols * sizeof(float));
    if (!w) return RF_ERR_NOMEM;
    for (size_t r = 0; r < (size_t)rows; r++)
        for (size_t k = 0; k < (size_t)cols; k++)
            w[r * cols + k] = wt[k * rows + r];
    rc = rf_qweight_quantize(q, type, w, rows, cols);
    free(w);
    return rc;
}

int rf_qweight_from_q4_1(rf_qweight *q, const uint8_t *blocks, size_t nbytes, int rows, int cols,
                         const int32_t *row_map) {
    memset(q, 0, sizeof *q);
    int rc = check_shape(rows, cols);
    if (rc) return rc;
    if (cols % RF_Q4_1_BLOCK)
        return rf_fail(RF_ERR_INVALID, "quant: Q4_1 rows of %d weights (not a multiple of 32)",
                       cols);
    size_t rb = (size_t)cols / RF_Q4_1_BLOCK * RF_Q4_1_BYTES; /* bytes per row */
    if (nbytes != rb * rows)
        return rf_fail(RF_ERR_INVALID, "quant: %zu bytes of Q4_1 blocks for [%d, %d] (need %zu)",
                       nbytes, rows, cols, rb * rows);
    for (int r = 0; row_map && r < rows; r++)
        if (row_map[r] < 0 || row_map[r] >= rows)
            return rf_fail(RF_ERR_RANGE, "quant: row map entry %d is %d, outside [0, %d)", r,
                           row_map[r], rows);
    if (!(q->q = malloc(nbytes))) return RF_ERR_NOMEM;
    for (int r = 0; r < rows; r++)
        memcpy(q->q + rb * r, blocks + rb * (row_map ? row_map[r] : r), rb);
    q->type = RF_QT_Q4_1, q->rows = rows, q->cols = cols;
    return RF_OK;
}

int rf_qweight_from_nf4(rf_qweight *q, int rows, int cols, const uint8_t *packed, size_t npacked,
                        const uint8_t *qabsmax, size_t nblocks, const float *absmax2,
                        size_t ngroups, float offset) {
    memset(q, 0, sizeof *q);
    int rc = check_shape(rows, cols);
    if (rc) return rc;
    size_t n = (size_t)rows * cols, nb = (n + RF_NF4_BLOCK - 1) / RF_NF4_BLOCK,
           ng = (nb + RF_NF4_GROUP - 1) / RF_NF4_GROUP;
    if (npacked != (n + 1) / 2 || nblocks != nb || ngroups != ng)
        return rf_fail(RF_ERR_INVALID,
                       "quant: NF4 state of %zu bytes, %zu blocks, %zu groups for [%d, %d] (need "
                       "%zu, %zu, %zu)",
                       npacked, nblocks, ngroups, rows, cols, (n + 1) / 2, nb, ng);
    if (!isfinite(offset)) return rf_fail(RF_ERR_INVALID, "quant: NF4 offset is not finite");
    for (size_t g = 0; g < ng; g++)
        if (!isfinite(absmax2[g]))
            return rf_fail(RF_ERR_INVALID, "quant: NF4 group absmax %zu is not finite", g);
    q->q = malloc(npacked), q->qabsmax = malloc(nb), q->scale = malloc(ng * sizeof(float));
    if (!q->q || !q->qabsmax || !q->scale) {
        rf_qweight_free(q);
        return RF_ERR_NOMEM;
    }
    memcpy(q->q, packed, npacked);
    memcpy(q->qabsmax, qabsmax, nb);
    memcpy(q->scale, absmax2, ng * sizeof(float));
    q->type = RF_QT_NF4, q->rows = rows, q->cols = cols, q->offset = offset;
    q->nblocks = nb, q->ngroups = ng;
    return RF_OK;
}

void rf_qweight_free(rf_qweight *q) {
    if (!q) return;
    free(q->q), free(q->scale), free(q->qabsmax);
    memset(q, 0, sizeof *q);
}

size_t rf_qweight_bytes(const rf_qweight *q) {
    size_t n = (size_t)q->rows * q->cols;
    switch (q->type) {
    case RF_QT_INT8:
        return n + (size_t)q->rows * sizeof(float);
    case RF_QT_NF4:
        return (n + 1) / 2 + q->nblocks + q->ngroups * sizeof(float) + sizeof(float);
    case RF_QT_Q4_1:
        return n / RF_Q4_1_BLOCK * RF_Q4_1_BYTES;
    default:
        return 0;
    }
}

/* ---- dequantization ---- */

/* Elements [i0, i1) of the flattened weight into dst (Q4_1: both multiples of 32). */
static void deq_range(const rf_qweight *q, size_t i0, size_t i1, float *dst) {
    size_t K = (size_t)q->cols;
    switch (q->type) {
    case RF_QT_INT8: {
        const float c = 7.874015718698502e-3f; /* bitsandbytes' 1/127 */
        for (size_t i = i0; i < i1; i++)
            dst[i - i0] = (float)(int8_t)q->q[i] * q->scale[i / K] * c;
        break;
    }
    case RF_QT_NF4: {
        size_t i = i0;
        while (i < i1) {
            size_t b = i / RF_NF4_BLOCK, end = (b + 1) * RF_NF4_BLOCK;
            if (end > i1) end = i1;
            float s = rf_dynamic_code[q->qabsmax[b]] * q->scale[b / RF_NF4_GROUP];
            s = s + q->offset;
            for (; i < end; i++) {
                uint8_t byte = q->q[i / 2];
                dst[i - i0] = rf_nf4_code[i % 2 ? byte & 15 : byte >> 4] * s;
            }
        }
        break;
    }
    case RF_QT_Q4_1:
        rf_gguf_dequant_row(RF_GGML_Q4_1, q->q + i0 / RF_Q4_1_BLOCK * RF_Q4_1_BYTES, dst, i1 - i0);
        break;
    default:
        break;
    }
}

void rf_qweight_dequant_rows(const rf_qweight *q, int r0, int r1, float *dst) {
    deq_range(q, (size_t)r0 * q->cols, (size_t)r1 * q->cols, dst);
}

void rf_qweight_dequant(const rf_qweight *q, float *dst) {
    rf_qweight_dequant_rows(q, 0, q->rows, dst);
}

/* ---- tiled matmuls ---- */

/* Tasks: (weight tile of RF_QTILE rows) x (piece of the N rows), tile-major so
 * a thread taking consecutive tasks reuses its dequantized tile. */
int rf_op_qlinear_fwd(float *out, int ldo, const float *inp, const rf_qweight *w, const float *b,
                      int N) {
    int R = w->rows, K = w->cols, nt = (R + RF_QTILE - 1) / RF_QTILE, np = pieces(N, ROW_PIECES);
    int fail = 0;
#pragma omp parallel
    {
        float *buf = malloc(sizeof(float) * RF_QTILE * (size_t)K);
        int have = -1;
        if (!buf) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < nt * np; t++) {
            if (!buf) continue;
            int ti = t / np, pi = t % np;
            int j0 = ti * RF_QTILE, j1 = j0 + RF_QTILE < R ? j0 + RF_QTILE : R;
            int r0 = (int)((long)N * pi / np), r1 = (int)((long)N * (pi + 1) / np);
            if (have != ti) rf_qweight_dequant_rows(w, j0, j1, buf), have = ti;
            float *o = out + (size_t)r0 * ldo + j0;
            for (int n = 0; b && n < r1 - r0; n++)
                memcpy(o + (size_t)n * ldo, b + j0, sizeof(float) * (j1 - j0));
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, j1 - j0, K, 1.0f,
                        inp + (size_t)r0 * K, K, buf, K, b ? 1.0f : 0.0f, o, ldo);
        }
        free(buf);
    }
    return fail ? rf_fail(RF_ERR_NOMEM, "quant: no memory for a weight tile") : RF_OK;
}

/* Tasks: (column tile of RF_QTILE inputs) x (piece of the N rows); each sums
 * over all R outputs in one sgemm. */
int rf_op_qlinear_bwd(float *dinp, const float *dout, int ldo, const rf_qweight *w, int N) {
    int R = w->rows, K = w->cols, nt = (K + RF_QTILE - 1) / RF_QTILE, np = pieces(N, ROW_PIECES);
    int fail = 0;
#pragma omp parallel
    {
        float *buf = malloc(sizeof(float) * RF_QTILE * (size_t)R);
        int have = -1;
        if (!buf) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < nt * np; t++) {
            if (!buf) continue;
            int ti = t / np, pi = t % np;
            int k0 = ti * RF_QTILE, k1 = k0 + RF_QTILE < K ? k0 + RF_QTILE : K, kw = k1 - k0;
            int r0 = (int)((long)N * pi / np), r1 = (int)((long)N * (pi + 1) / np);
            if (have != ti) {
                for (int j = 0; j < R; j++)
                    deq_range(w, (size_t)j * K + k0, (size_t)j * K + k1, buf + (size_t)j * kw);
                have = ti;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, kw, R, 1.0f,
                        dout + (size_t)r0 * ldo, ldo, buf, kw, 1.0f, dinp + (size_t)r0 * K + k0, K);
        }
        free(buf);
    }
    return fail ? rf_fail(RF_ERR_NOMEM, "quant: no memory for a weight tile") : RF_OK;
}
