/* The CPU backend: host memory (64-byte aligned) and the kernels of ops.c.
 * Each slot wraps its ops.c / ops_causal.c twin (LoRA's: lora.c, quant.c); none can fail once
 * memory is allocated, but for qlinear's tile buffers. */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "trainer/backend.h"
#include "trainer/lora.h"
#include "trainer/quant.h"
#include "trainer/ops.h"
#include "trainer/ops_causal.h"

void rf_backend_cpu_set_threads(int n) {
    if (n < 1) n = 1;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

static int cpu_alloc(const rf_backend *be, void **out, size_t bytes) {
    (void)be;
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    *out = p;
    if (!p) return rf_fail(RF_ERR_NOMEM, "cpu: no memory for %zu bytes", bytes);
    memset(p, 0, n ? n : 64);
    return RF_OK;
}

static int cpu_free(const rf_backend *be, void *p) {
    (void)be;
    free(p);
    return RF_OK;
}

static int cpu_copy(const rf_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
    return RF_OK;
}

static int cpu_copy2d(const rf_backend *be, void *dst, size_t dpitch, const void *src,
                      size_t spitch, size_t width, size_t rows) {
    (void)be;
    for (size_t r = 0; width && r < rows; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return RF_OK;
}

static int cpu_zero(const rf_backend *be, void *p, size_t bytes) {
    (void)be;
    if (bytes) memset(p, 0, bytes);
    return RF_OK;
}

static int embed_fwd(const rf_backend *be, float *out, const int32_t *ids, const int32_t *types,
                     const float *wte, const float *wpe, const float *wtt, int B, int T, int C) {
    (void)be;
    rf_op_embed_fwd(out, ids, types, wte, wpe, wtt, B, T, C);
    return RF_OK;
}

static int embed_bwd(const rf_backend *be, float *dwte, float *dwpe, float *dwtt, const float *dout,
                     const int32_t *ids, const int32_t *types, int B, int T, int C, int V, int TV) {
    (void)be;
    rf_op_embed_bwd(dwte, dwpe, dwtt, dout, ids, types, B, T, C, V, TV);
    return RF_OK;
}

static int layernorm_fwd(const rf_backend *be, float *out, float *mean, float *rstd,
                         const float *inp, const float *w, const float *b, int N, int C,
                         float eps) {
    (void)be;
    rf_op_layernorm_fwd(out, mean, rstd, inp, w, b, N, C, eps);
    return RF_OK;
}

static int layernorm_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, const float *mean, const float *rstd,
                         int N, int C) {
    (void)be;
    rf_op_layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    return RF_OK;
}

static int linear_fwd(const rf_backend *be, float *out, const float *inp, const float *w,
                      const float *b, int N, int IC, int OC) {
    (void)be;
    rf_op_linear_fwd(out, inp, w, b, N, IC, OC);
    return RF_OK;
}

static int linear_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                      const float *inp, const float *w, int N, int IC, int OC) {
    (void)be;
    rf_op_linear_bwd(dinp, dw, db, dout, inp, w, N, IC, OC);
    return RF_OK;
}

static int attention_fwd(const rf_backend *be, float *out, float *att, float *scratch,
                         const float *qkv, const uint8_t *valid, int B, int T, int Tq, int C,
                         int NH, int h0, int NHall, float pdrop, uint64_t seed) {
    (void)be;
    if (!out && !att) return rf_fail(RF_ERR_INVALID, "attention: neither out nor att");
    rf_op_attention_heads_fwd(out, att, scratch, qkv, valid, B, T, Tq, C, NH, h0, NHall, pdrop,
                              seed);
    return RF_OK;
}

static int attention_bwd(const rf_backend *be, float *dqkv, float *scratch, const float *dout,
                         const float *qkv, const float *att, const float *out, const uint8_t *valid,
                         int B, int T, int Tq, int C, int NH, int h0, int NHall, float pdrop,
                         uint64_t seed) {
    (void)be, (void)out, (void)valid; /* the probabilities in att have them */
    rf_op_attention_heads_bwd(dqkv, scratch, dout, qkv, att, B, T, Tq, C, NH, h0, NHall, pdrop,
                              seed);
    return RF_OK;
}

static int linear_ld_fwd(const rf_backend *be, float *out, int ldo, const float *inp, int ldi,
                         const float *w, int ldw, const float *b, int N, int IC, int OC) {
    (void)be;
    rf_op_linear_ld_fwd(out, ldo, inp, ldi, w, ldw, b, N, IC, OC);
    return RF_OK;
}

static int linear_ld_bwd(const rf_backend *be, float *dinp, int lddi, float *dw, int lddw,
                         float *db, const float *dout, int ldd, const float *inp, int ldi,
                         const float *w, int ldw, int N, int IC, int OC) {
    (void)be;
    rf_op_linear_ld_bwd(dinp, lddi, dw, lddw, db, dout, ldd, inp, ldi, w, ldw, N, IC, OC);
    return RF_OK;
}

static int embed_rows_fwd(const rf_backend *be, float *out, const int32_t *ids, const float *w,
                          int lo, int hi, int N, int C) {
    (void)be;
    rf_op_embed_rows_fwd(out, ids, w, lo, hi, N, C);
    return RF_OK;
}

static int embed_add_fwd(const rf_backend *be, float *out, const int32_t *pos, const int32_t *types,
                         const float *wpe, const float *wtt, int B, int T, int C) {
    (void)be;
    rf_op_embed_add_fwd(out, pos, types, wpe, wtt, B, T, C);
    return RF_OK;
}

static int kv_attention_fwd(const rf_backend *be, float *out, float *scores, const float *qkv,
                            const float *kc, const float *vc, int n, int len, int NH, int NKV,
                            int hd) {
    (void)be;
    rf_op_kv_attention_fwd(out, scores, qkv, kc, vc, n, len, NH, NKV, hd);
    return RF_OK;
}

static int vxent_stats(const rf_backend *be, float *mx, float *tl, const float *logits, int ldz,
                       const int32_t *tgt, int lo, int hi, int N) {
    (void)be;
    rf_op_vxent_stats(mx, tl, logits, ldz, tgt, lo, hi, N);
    return RF_OK;
}

static int vxent_sumexp(const rf_backend *be, double *se, const float *logits, int ldz,
                        const float *mx, int lo, int hi, int N) {
    (void)be;
    rf_op_vxent_sumexp(se, logits, ldz, mx, lo, hi, N);
    return RF_OK;
}

static int vxent_loss(const rf_backend *be, float *loss, float *losses, const float *mx,
                      const double *se, const int32_t *tgt, int N) {
    (void)be;
    rf_op_vxent_loss(loss, losses, mx, se, tgt, N);
    return RF_OK;
}

static int vxent_bwd(const rf_backend *be, float *dlogits, int ldd, const float *logits, int ldz,
                     const float *mx, const double *se, const int32_t *tgt, int lo, int hi, int N,
                     float scale) {
    (void)be;
    rf_op_vxent_bwd(dlogits, ldd, logits, ldz, mx, se, tgt, lo, hi, N, scale);
    return RF_OK;
}

static int embed_rows_bwd(const rf_backend *be, float *dw, float *dwpe, float *dwtt,
                          const float *dout, const int32_t *ids, const int32_t *types, int lo,
                          int hi, int B, int T, int C) {
    (void)be;
    rf_op_embed_rows_bwd(dw, dwpe, dwtt, dout, ids, types, lo, hi, B, T, C);
    return RF_OK;
}

static int gelu_fwd(const rf_backend *be, float *out, const float *inp, size_t n) {
    (void)be;
    rf_op_gelu_fwd(out, inp, n);
    return RF_OK;
}

static int gelu_bwd(const rf_backend *be, float *dinp, const float *inp, const float *dout,
                    size_t n) {
    (void)be;
    rf_op_gelu_bwd(dinp, inp, dout, n);
    return RF_OK;
}

static int tanh_fwd(const rf_backend *be, float *out, const float *inp, size_t n) {
    (void)be;
    rf_op_tanh_fwd(out, inp, n);
    return RF_OK;
}

static int tanh_bwd(const rf_backend *be, float *dinp, const float *out, const float *dout,
                    size_t n) {
    (void)be;
    rf_op_tanh_bwd(dinp, out, dout, n);
    return RF_OK;
}

static int dropout_fwd(const rf_backend *be, float *out, const float *inp, size_t n, float p,
                       uint64_t seed) {
    (void)be;
    rf_op_dropout_fwd(out, inp, n, p, seed);
    return RF_OK;
}

static int dropout_bwd(const rf_backend *be, float *dinp, const float *dout, size_t n, float p,
                       uint64_t seed) {
    (void)be;
    rf_op_dropout_bwd(dinp, dout, n, p, seed);
    return RF_OK;
}

static int residual_fwd(const rf_backend *be, float *out, const float *a, const float *b, size_t n,
                        float p, uint64_t seed) {
    (void)be;
    rf_op_residual_fwd(out, a, b, n, p, seed);
    return RF_OK;
}

static int residual_bwd(const rf_backend *be, float *da, float *db, const float *dout, size_t n,
                        float p, uint64_t seed) {
    (void)be;
    rf_op_residual_bwd(da, db, dout, n, p, seed);
    return RF_OK;
}

static int xent_fwd(const rf_backend *be, float *loss, float *probs, float *losses,
                    const float *logits, const int32_t *labels, const float *weights, int B,
                    int K) {
    (void)be;
    *loss = rf_op_xent_fwd(probs, losses, logits, labels, weights, B, K);
    return RF_OK;
}

static int xent_bwd(const rf_backend *be, float *dlogits, const float *probs, const int32_t *labels,
                    const float *weights, int B, int K, float scale) {
    (void)be;
    rf_op_xent_bwd(dlogits, probs, labels, weights, B, K, scale);
    return RF_OK;
}

static int softmax_argmax(const rf_backend *be, int32_t *pred, float *probs, const float *logits,
                          int B, int K) {
    (void)be;
    rf_op_softmax_argmax(pred, probs, logits, B, K);
    return RF_OK;
}

/* ---- the causal language models (ops_causal.h) ---- */

static int tokpos_fwd(const rf_backend *be, float *out, const int32_t *ids, const int32_t *pos,
                      const float *wte, const float *wpe, int B, int T, int C) {
    (void)be;
    rf_op_tokpos_fwd(out, ids, pos, wte, wpe, B, T, C);
    return RF_OK;
}

static int tokpos_bwd(const rf_backend *be, float *dwte, float *dwpe, const float *dout,
                      const int32_t *ids, const int32_t *pos, int B, int T, int C, int V, int P) {
    (void)be, (void)V, (void)P;
    rf_op_tokpos_bwd(dwte, dwpe, dout, ids, pos, B, T, C);
    return RF_OK;
}

static int conv1d_fwd(const rf_backend *be, float *out, const float *inp, const float *w,
                      const float *b, int N, int IC, int OC) {
    (void)be;
    rf_op_conv1d_fwd(out, inp, w, b, N, IC, OC);
    return RF_OK;
}

static int conv1d_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                      const float *inp, const float *w, int N, int IC, int OC) {
    (void)be;
    rf_op_conv1d_bwd(dinp, dw, db, dout, inp, w, N, IC, OC);
    return RF_OK;
}

static int rmsnorm_fwd(const rf_backend *be, float *out, float *rstd, const float *inp,
                       const float *w, int N, int C, float eps) {
    (void)be;
    rf_op_rmsnorm_fwd(out, rstd, inp, w, N, C, eps);
    return RF_OK;
}

static int rmsnorm_bwd(const rf_backend *be, float *dinp, float *dw, const float *dout,
                       const float *inp, const float *w, const float *rstd, int N, int C) {
    (void)be;
    rf_op_rmsnorm_bwd(dinp, dw, dout, inp, w, rstd, N, C);
    return RF_OK;
}

static int rope_fwd(const rf_backend *be, float *out, const float *inp, const int32_t *pos, int N,
                    int T, int nh, int hs, int stride, float theta) {
    (void)be;
    rf_op_rope_fwd(out, inp, pos, N, T, nh, hs, stride, theta);
    return RF_OK;
}

static int rope_bwd(const rf_backend *be, float *dinp, const float *dout, const int32_t *pos, int N,
                    int T, int nh, int hs, int stride, float theta) {
    (void)be;
    rf_op_rope_bwd(dinp, dout, pos, N, T, nh, hs, stride, theta);
    return RF_OK;
}

static int swiglu_fwd(const rf_backend *be, float *out, const float *gu, int N, int F) {
    (void)be;
    rf_op_swiglu_fwd(out, gu, N, F);
    return RF_OK;
}

static int swiglu_bwd(const rf_backend *be, float *dgu, const float *dout, const float *gu, int N,
                      int F) {
    (void)be;
    rf_op_swiglu_bwd(dgu, dout, gu, N, F);
    return RF_OK;
}

static int gelu_tanh_fwd(const rf_backend *be, float *out, const float *inp, size_t n) {
    (void)be;
    rf_op_gelu_tanh_fwd(out, inp, n);
    return RF_OK;
}

static int gelu_tanh_bwd(const rf_backend *be, float *dinp, const float *inp, const float *dout,
                         size_t n) {
    (void)be;
    rf_op_gelu_tanh_bwd(dinp, inp, dout, n);
    return RF_OK;
}

static int causal_attention_fwd(const rf_backend *be, float *out, float *att, const float *qkv,
                                const uint8_t *valid, const int32_t *seg, int B, int T, int NH,
                                int NKV, int hs) {
    (void)be;
    rf_op_causal_attention_fwd(out, att, qkv, valid, seg, B, T, NH, NKV, hs);
    return RF_OK;
}

static int causal_attention_bwd(const rf_backend *be, float *dqkv, float *scratch,
                                const float *dout, const float *qkv, const float *att,
                                const float *out, const uint8_t *valid, const int32_t *seg, int B,
                                int T, int NH, int NKV, int hs) {
    (void)be, (void)out, (void)valid, (void)seg; /* the probabilities in att have them */
    rf_op_causal_attention_bwd(dqkv, scratch, dout, qkv, att, B, T, NH, NKV, hs);
    return RF_OK;
}

static int lm_head_fwd(const rf_backend *be, float *logits, const float *h, const float *wte, int N,
                       int C, int V) {
    (void)be;
    rf_op_lm_head_fwd(logits, h, wte, N, C, V);
    return RF_OK;
}

static int lm_head_bwd(const rf_backend *be, float *dh, float *dwte, const float *dlogits,
                       const float *h, const float *wte, int N, int C, int V) {
    (void)be;
    rf_op_lm_head_bwd(dh, dwte, dlogits, h, wte, N, C, V);
    return RF_OK;
}

static int causal_xent_fwd(const rf_backend *be, float *loss, int *counted, float *lse,
                           float *losses, const float *logits, const int32_t *labels, int B, int T,
                           int V) {
    (void)be;
    *loss = rf_op_causal_xent_fwd(lse, losses, counted, logits, labels, B, T, V);
    return RF_OK;
}

static int causal_xent_bwd(const rf_backend *be, float *dlogits, const float *logits,
                           const float *lse, const int32_t *labels, int B, int T, int V,
                           float scale) {
    (void)be;
    rf_op_causal_xent_bwd(dlogits, logits, lse, labels, B, T, V, scale);
    return RF_OK;
}

static int sumsq(const rf_backend *be, double *out, const float *x, size_t n) {
    (void)be;
    *out = rf_op_sumsq(x, n);
    return RF_OK;
}

static int sumsq_spans(const rf_backend *be, double *out, const float *x,
                       const rf_param_span *spans, size_t nspans) {
    (void)be;
    double s = 0;
    for (size_t k = 0; k < nspans; k++)
        s += rf_op_sumsq(x + spans[k].offset, spans[k].numel);
    *out = s;
    return RF_OK;
}

static int sumsq_into(const rf_backend *be, double *dst, const float *x, const rf_param_span *spans,
                      size_t nspans) {
    return sumsq_spans(be, dst, x, spans, nspans); /* host memory is backend memory */
}

static int scale(const rf_backend *be, float *x, size_t n, float s) {
    (void)be;
    rf_op_scale(x, n, s);
    return RF_OK;
}

static int adamw(const rf_backend *be, float *params, const float *grads, float *mom1, float *mom2,
                 size_t lo, size_t hi, const rf_param_span *spans, size_t nspans,
                 const rf_adamw_hp *hp) {
    (void)be;
    rf_op_adamw(params, grads, mom1, mom2, lo, hi, spans, nspans, hp);
    return RF_OK;
}

static int lora_fwd(const rf_backend *be, float *out, int ldo, float *u, float *xd, const float *x,
                    const float *A, const float *B, int N, int IC, int OC, int r, float scale,
                    float p, uint64_t seed) {
    (void)be;
    rf_op_lora_fwd(out, ldo, u, xd, x, A, B, N, IC, OC, r, scale, p, seed);
    return RF_OK;
}

static int lora_bwd(const rf_backend *be, float *dx, float *dA, float *dB, float *du, float *xd,
                    const float *dout, int ldo, const float *x, const float *u, const float *A,
                    const float *B, int N, int IC, int OC, int r, float scale, float p,
                    uint64_t seed) {
    (void)be;
    rf_op_lora_bwd(dx, dA, dB, du, xd, dout, ldo, x, u, A, B, N, IC, OC, r, scale, p, seed);
    return RF_OK;
}

/* (these two can fail: a tile buffer that cannot be allocated) */
static int qlinear_fwd(const rf_backend *be, float *out, int ldo, const float *inp,
                       const rf_qweight *w, const float *b, int N) {
    (void)be;
    return rf_op_qlinear_fwd(out, ldo, inp, w, b, N);
}

static int qlinear_bwd(const rf_backend *be, float *dinp, const float *dout, int ldo,
                       const rf_qweight *w, int N) {
    (void)be;
    return rf_op_qlinear_bwd(dinp, dout, ldo, w, N);
}

static const rf_backend cpu = {
    .name = "cpu",
    .device_memory = false,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_host = cpu_copy,
    .to_device = cpu_copy,
    .copy = cpu_copy,
    .copy2d = cpu_copy2d,
    .embed_fwd = embed_fwd,
    .embed_bwd = embed_bwd,
    .layernorm_fwd = layernorm_fwd,
    .layernorm_bwd = layernorm_bwd,
    .linear_fwd = linear_fwd,
    .linear_bwd = linear_bwd,
    .attention_fwd = attention_fwd,
    .attention_bwd = attention_bwd,
    .gelu_fwd = gelu_fwd,
    .gelu_bwd = gelu_bwd,
    .tanh_fwd = tanh_fwd,
    .tanh_bwd = tanh_bwd,
    .dropout_fwd = dropout_fwd,
    .dropout_bwd = dropout_bwd,
    .residual_fwd = residual_fwd,
    .residual_bwd = residual_bwd,
    .xent_fwd = xent_fwd,
    .xent_bwd = xent_bwd,
    .linear_ld_fwd = linear_ld_fwd,
    .linear_ld_bwd = linear_ld_bwd,
    .embed_rows_fwd = embed_rows_fwd,
    .embed_add_fwd = embed_add_fwd,
    .embed_rows_bwd = embed_rows_bwd,
    .vxent_stats = vxent_stats,
    .vxent_sumexp = vxent_sumexp,
    .vxent_loss = vxent_loss,
    .vxent_bwd = vxent_bwd,
    .softmax_argmax = softmax_argmax,
    .tokpos_fwd = tokpos_fwd,
    .tokpos_bwd = tokpos_bwd,
    .conv1d_fwd = conv1d_fwd,
    .conv1d_bwd = conv1d_bwd,
    .rmsnorm_fwd = rmsnorm_fwd,
    .rmsnorm_bwd = rmsnorm_bwd,
    .rope_fwd = rope_fwd,
    .rope_bwd = rope_bwd,
    .swiglu_fwd = swiglu_fwd,
    .swiglu_bwd = swiglu_bwd,
    .gelu_tanh_fwd = gelu_tanh_fwd,
    .gelu_tanh_bwd = gelu_tanh_bwd,
    .causal_attention_fwd = causal_attention_fwd,
    .causal_attention_bwd = causal_attention_bwd,
    .lm_head_fwd = lm_head_fwd,
    .kv_attention_fwd = kv_attention_fwd,
    .lm_head_bwd = lm_head_bwd,
    .causal_xent_fwd = causal_xent_fwd,
    .causal_xent_bwd = causal_xent_bwd,
    .lora_fwd = lora_fwd,
    .lora_bwd = lora_bwd,
    .qlinear_fwd = qlinear_fwd,
    .qlinear_bwd = qlinear_bwd,
    .sumsq = sumsq,
    .sumsq_spans = sumsq_spans,
    .sumsq_into = sumsq_into,
    .scale = scale,
    .adamw = adamw,
};

const rf_backend *rf_backend_cpu(void) {
    return &cpu;
}
