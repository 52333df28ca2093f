// The frozen quantized base of LoRA (quant.h) on the device; twin of
// rf_op_qlinear_fwd/bwd. The weight is dequantized whole into the context's
// scratch (ctx->deq: one fp32 copy of the largest projection, grown on
// demand) by one kernel per format, with the CPU's float operations in its
// order (__fmul_rn / __fadd_rn: no contraction into FMAs, so the values are
// the CPU's bit for bit), then one cuBLAS product. No atomics: every output
// element is one thread's or one cuBLAS sum.
#include <string.h>

#include "trainer/cuda/ops_cuda.cuh"

extern "C" {
#include "trainer/quant.h"
}

int rf_cuda_deq(rf_cuda_ctx *c, size_t n) {
    int rc;
    if (!c->codes) {
        float h[16 + 256];
        memcpy(h, rf_nf4_code, sizeof(float) * 16);
        memcpy(h + 16, rf_dynamic_code, sizeof(float) * 256);
        if ((rc = rf_cuda_check(cudaMalloc((void **)&c->codes, sizeof h), "quantization codes")))
            return rc;
        if ((rc = rf_cuda_check(cudaMemcpy(c->codes, h, sizeof h, cudaMemcpyHostToDevice),
                                "quantization codes"))) {
            cudaFree(c->codes);
            c->codes = NULL;
            return rc;
        }
    }
    return rf_cuda_grow(&c->deq, &c->deq_n, n, "dequantized weight");
}

// INT8: (q * s_row) * (1/127), as bitsandbytes' int8_vectorwise_dequant
__global__ static void deq_int8_kernel(float *w, const uint8_t *q, const float *scale, int K,
                                       size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float c = 7.874015718698502e-3f;
    w[i] = __fmul_rn(__fmul_rn((float)(int8_t)q[i], scale[i / K]), c);
}

// NF4 with double quantization: nf4[code] * (dyn[qa_b] * g + offset)
__global__ static void deq_nf4_kernel(float *w, const uint8_t *q, const uint8_t *qabsmax,
                                      const float *absmax2, const float *codes, float offset,
                                      size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    size_t b = i / RF_NF4_BLOCK;
    float s = __fadd_rn(__fmul_rn(codes[16 + qabsmax[b]], absmax2[b / RF_NF4_GROUP]), offset);
    uint8_t byte = q[i / 2];
    w[i] = __fmul_rn(codes[i % 2 ? byte & 15 : byte >> 4], s);
}

// rf_gguf_f16_to_f32, exact
__device__ __forceinline__ float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | man << 13);
    if (exp) return __uint_as_float(sign | (exp + 112) << 23 | man << 13);
    if (!man) return __uint_as_float(sign);
    return __uint_as_float(__float_as_uint((float)man * 5.9604644775390625e-8f) | sign);
}

// Q4_1 blocks of 32 (fp16 d, fp16 m, 16 bytes: low nibbles weights 0..15,
// high 16..31): q * d + m, as ggml's dequantize_row_q4_1
__global__ static void deq_q4_1_kernel(float *w, const uint8_t *q, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint8_t *p = q + i / RF_Q4_1_BLOCK * RF_Q4_1_BYTES;
    int j = (int)(i % RF_Q4_1_BLOCK);
    float d = f16_to_f32((uint16_t)(p[0] | p[1] << 8)),
          m = f16_to_f32((uint16_t)(p[2] | p[3] << 8));
    uint8_t byte = p[4 + (j & 15)];
    w[i] = __fadd_rn(__fmul_rn((float)(j < 16 ? byte & 15 : byte >> 4), d), m);
}

// w dequantized into ctx->deq ([rows, cols], nn.Linear layout).
static int dequant(rf_cuda_ctx *c, const rf_qweight *w) {
    size_t n = (size_t)w->rows * w->cols;
    int rc = rf_cuda_deq(c, n);
    if (rc) return rc;
    unsigned nb = cu_blocks(n, 256);
    switch (w->type) {
    case RF_QT_INT8:
        deq_int8_kernel<<<nb, 256, 0, c->stream>>>(c->deq, w->q, w->scale, w->cols, n);
        break;
    case RF_QT_NF4:
        deq_nf4_kernel<<<nb, 256, 0, c->stream>>>(c->deq, w->q, w->qabsmax, w->scale, c->codes,
                                                  w->offset, n);
        break;
    case RF_QT_Q4_1:
        if (w->cols % RF_Q4_1_BLOCK)
            return rf_fail(RF_ERR_INVALID, "cuda: qlinear: Q4_1 rows of %d weights", w->cols);
        deq_q4_1_kernel<<<nb, 256, 0, c->stream>>>(c->deq, w->q, n);
        break;
    default:
        return rf_fail(RF_ERR_INVALID, "cuda: qlinear: not a quantized weight (type %d)",
                       (int)w->type);
    }
    return cu_launched("qlinear (dequantize)");
}

__global__ static void bias_ld_kernel(float *out, int ldo, const float *b, int R, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i / R * ldo + i % R] = b[i % R];
}

int rf_cu_qlinear_fwd(const rf_backend *be, float *out, int ldo, const float *inp,
                      const rf_qweight *w, const float *b, int N) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0) return RF_OK;
    int R = w->rows, K = w->cols, rc = dequant(c, w);
    if (rc) return rc;
    if (b) { // out = b, then out += inp W'^T, as the CPU twin
        size_t total = (size_t)N * R;
        bias_ld_kernel<<<cu_blocks(total, 256), 256, 0, c->stream>>>(out, ldo, b, R, total);
        if ((rc = cu_launched("qlinear_fwd (bias)"))) return rc;
    }
    // out^T (R x N, ld ldo) = W' (col-major K x R)^T * inp^T (K x N)
    return rf_cu_gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, R, N, K, 1.0f, c->deq, K, inp, K,
                      b ? 1.0f : 0.0f, out, ldo, "qlinear_fwd");
}

int rf_cu_qlinear_bwd(const rf_backend *be, float *dinp, const float *dout, int ldo,
                      const rf_qweight *w, int N) {
    rf_cuda_ctx *c = cu_ctx(be);
    if (N <= 0) return RF_OK;
    int R = w->rows, K = w->cols, rc = dequant(c, w);
    if (rc) return rc;
    // dinp^T (K x N) += W' (col-major K x R) * dout^T (R x N, ld ldo)
    return rf_cu_gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, K, N, R, 1.0f, c->deq, K, dout, ldo, 1.0f, dinp,
                      K, "qlinear_bwd");
}
