/* Frozen base weights kept quantized in memory, for LoRA on a quantized base
 * (QLoRA and the 8-bit base): the formats, their quantizers, and a matmul
 * that dequantizes one tile of the weight at a time (never the whole weight)
 * together with its input-gradient backward (the base is frozen: no weight
 * gradient).
 *
 * A weight W is [rows, cols] in nn.Linear's layout: rows are outputs, cols
 * are inputs, row-major (GPT-2's Conv1D [in, out] weights are transposed once
 * when they are quantized, as transformers does for bitsandbytes). Formats:
 *
 *   RF_QT_INT8  bitsandbytes' LLM.int8 weight format without outliers
 *               (Int8Params, threshold 0): per-row absmax s_r = max_k |W[r,k]|,
 *               q = round_half_even(W * (127 / s_r)) as int8;
 *               W' = (q * s_r) * (float)(1/127) (int8_vectorwise_dequant).
 *   RF_QT_NF4   QLoRA's NormalFloat4 with double quantization, bitsandbytes'
 *               layout (quantize_4bit, blocksize 64, compress_statistics):
 *               over the flattened weight, blocks of 64 with absmax a_b;
 *               element i gets the 4-bit NF4 code nearest x * (1 / a_b)
 *               (midpoints between the codebook's values; a tie goes to the
 *               lower code), packed two per byte, element 2j in the HIGH
 *               nibble of byte j. The absmaxes are themselves quantized
 *               ("double quantization"): offset o = mean(a_b); a_b - o in
 *               groups of 256 blocks with absmax g, 8-bit code nearest
 *               (a_b - o) * (1 / g) in bitsandbytes' signed dynamic map.
 *               Dequantization, in float as bitsandbytes does it:
 *               W' = nf4[q] * (dyn[qa_b] * g + o).
 *   RF_QT_Q4_1  ggml's Q4_1 blocks exactly as a GGUF file holds them (32
 *               weights along a row: fp16 d, fp16 m, 16 bytes of nibbles;
 *               W' = q * d + m, rf_gguf_dequant_row), never requantized.
 *
 * The quantizers follow bitsandbytes' reference kernels (its "default" torch
 * backend, the same rule as its CUDA kernels); see services/trainer/README.md
 * for how they were checked against bitsandbytes itself. The offset is the
 * mean computed in double and rounded once (torch's float32 mean can differ
 * in the last bit).
 *
 * Determinism: the matmuls cut their work into tiles of RF_QTILE weight rows
 * (forward) or columns (backward) and fixed pieces of the batch rows, each a
 * single-threaded sgemm on a dequantized tile: results do not depend on the
 * thread count (as ops.c). */
#ifndef RF_TR_QUANT_H
#define RF_TR_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef enum rf_qtype {
    RF_QT_F32 = 0, /* not quantized (the plain fp32 base) */
    RF_QT_INT8,
    RF_QT_NF4,
    RF_QT_Q4_1,
} rf_qtype;

#define RF_NF4_BLOCK  64  /* weights per NF4 block */
#define RF_NF4_GROUP  256 /* NF4 blocks per group of the double quantization */
#define RF_Q4_1_BLOCK 32
#define RF_Q4_1_BYTES 20
#define RF_QTILE      128 /* weight rows (forward) or columns (backward) per tile */

/* NF4's 16 values and bitsandbytes' signed 8-bit dynamic map (create_dynamic_map()). */
extern const float rf_nf4_code[16];
extern const float rf_dynamic_code[256];

typedef struct rf_qweight {
    rf_qtype type;
    int rows, cols;
    uint8_t *q;              /* INT8: rows*cols int8; NF4: ceil(rows*cols / 2) packed bytes;
                                Q4_1: rows * cols/32 blocks of 20 bytes */
    float *scale;            /* INT8: [rows] row absmax; NF4: [ngroups] group absmax */
    uint8_t *qabsmax;        /* NF4: [nblocks] 8-bit codes of the block absmaxes */
    float offset;            /* NF4 */
    size_t nblocks, ngroups; /* NF4 */
} rf_qweight;

/* Quantizes w[rows, cols] (nn.Linear layout; rows >= 1, cols >= 1) into q
 * (zeroed first; rf_qweight_free releases it). Q4_1 needs cols % 32 == 0 and
 * uses ggml's reference quantizer (quantize_row_q4_1_ref); meant for tests,
 * as a Q4_1 base comes from a GGUF file (rf_qweight_from_q4_1). */
int rf_qweight_quantize(rf_qweight *q, rf_qtype type, const float *w, int rows, int cols);
/* The same for a weight stored transposed, wt[cols, rows] (GPT-2's Conv1D
 * [in, out]): quantizes W = wt^T (through a temporary transposed copy). */
int rf_qweight_quantize_t(rf_qweight *q, rf_qtype type, const float *wt, int rows, int cols);

/* Adopts Q4_1 blocks as a GGUF file holds them: blocks holds rows * cols/32
 * blocks (nbytes must be exactly that many bytes; cols % 32 == 0). Row r of
 * the result is source row row_map[r] (row_map NULL: identity; each entry
 * must be in [0, rows)), so llama.cpp's permuted q/k rows can be put back in
 * Hugging Face's order without requantizing. The bytes are copied. */
int rf_qweight_from_q4_1(rf_qweight *q, const uint8_t *blocks, size_t nbytes, int rows, int cols,
                         const int32_t *row_map);
/* Adopts an NF4 state as bitsandbytes keeps it (QuantState with nested
 * state2): packed[ceil(rows*cols/2)], qabsmax[nblocks], absmax2[ngroups],
 * offset; every count is checked against rows * cols (RF_ERR_INVALID). */
int rf_qweight_from_nf4(rf_qweight *q, int rows, int cols, const uint8_t *packed, size_t npacked,
                        const uint8_t *qabsmax, size_t nblocks, const float *absmax2,
                        size_t ngroups, float offset);
void rf_qweight_free(rf_qweight *q);
/* Bytes held by q (its quantized data and scales). */
size_t rf_qweight_bytes(const rf_qweight *q);

/* Dequantizes rows [r0, r1) into dst[(r1 - r0) * cols]; rf_qweight_dequant
 * the whole weight (for tests and references: the matmuls never do). */
void rf_qweight_dequant_rows(const rf_qweight *q, int r0, int r1, float *dst);
void rf_qweight_dequant(const rf_qweight *q, float *dst);

/* out[n * ldo + j] = sum_k inp[n * cols + k] W'[j, k] (+ b[j]) for j < rows,
 * n < N (overwrites; b may be NULL). Returns RF_ERR_NOMEM if a tile buffer
 * cannot be allocated (out is then unspecified). */
int rf_op_qlinear_fwd(float *out, int ldo, const float *inp, const rf_qweight *w, const float *b,
                      int N);
/* dinp[n * cols + k] += sum_j dout[n * ldo + j] W'[j, k]. */
int rf_op_qlinear_bwd(float *dinp, const float *dout, int ldo, const rf_qweight *w, int N);

#endif
