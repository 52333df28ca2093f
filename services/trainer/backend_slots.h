/* Every slot of rf_backend (backend.h) but alloc and free, in the struct's
 * order, as an X-macro: X(slot, (parameters), (arguments)), the parameters as
 * declared (the backend first, named be) and the arguments that pass them on.
 * The decorators that wrap each slot of another backend generate their
 * wrappers from it: the test device cpu-guarded (backend_guarded.c) and the
 * profiler (backend_profile.c). A slot added to rf_backend must be added here
 * too; backend_profile.c's static assertion fails the build otherwise. */
#ifndef RF_TR_BACKEND_SLOTS_H
#define RF_TR_BACKEND_SLOTS_H

#include "trainer/backend.h"

#define RF_BACKEND_SLOTS(X)                                                                        \
    X(zero, (const rf_backend *be, void *p, size_t bytes), (be, p, bytes))                         \
    X(to_host, (const rf_backend *be, void *dst, const void *src, size_t bytes),                   \
      (be, dst, src, bytes))                                                                       \
    X(to_device, (const rf_backend *be, void *dst, const void *src, size_t bytes),                 \
      (be, dst, src, bytes))                                                                       \
    X(copy, (const rf_backend *be, void *dst, const void *src, size_t bytes),                      \
      (be, dst, src, bytes))                                                                       \
    X(copy2d,                                                                                      \
      (const rf_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch,             \
       size_t width, size_t rows),                                                                 \
      (be, dst, dpitch, src, spitch, width, rows))                                                 \
    X(embed_fwd,                                                                                   \
      (const rf_backend *be, float *out, const int32_t *ids, const int32_t *types,                 \
       const float *wte, const float *wpe, const float *wtt, int B, int T, int C),                 \
      (be, out, ids, types, wte, wpe, wtt, B, T, C))                                               \
    X(embed_bwd,                                                                                   \
      (const rf_backend *be, float *dwte, float *dwpe, float *dwtt, const float *dout,             \
       const int32_t *ids, const int32_t *types, int B, int T, int C, int V, int TV),              \
      (be, dwte, dwpe, dwtt, dout, ids, types, B, T, C, V, TV))                                    \
    X(layernorm_fwd,                                                                               \
      (const rf_backend *be, float *out, float *mean, float *rstd, const float *inp,               \
       const float *w, const float *b, int N, int C, float eps),                                   \
      (be, out, mean, rstd, inp, w, b, N, C, eps))                                                 \
    X(layernorm_bwd,                                                                               \
      (const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,                 \
       const float *inp, const float *w, const float *mean, const float *rstd, int N, int C),      \
      (be, dinp, dw, db, dout, inp, w, mean, rstd, N, C))                                          \
    X(linear_fwd,                                                                                  \
      (const rf_backend *be, float *out, const float *inp, const float *w, const float *b, int N,  \
       int IC, int OC),                                                                            \
      (be, out, inp, w, b, N, IC, OC))                                                             \
    X(linear_bwd,                                                                                  \
      (const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,                 \
       const float *inp, const float *w, int N, int IC, int OC),                                   \
      (be, dinp, dw, db, dout, inp, w, N, IC, OC))                                                 \
    X(attention_fwd,                                                                               \
      (const rf_backend *be, float *out, float *att, float *scratch, const float *qkv,             \
       const uint8_t *valid, int B, int T, int Tq, int C, int NH, int h0, int NHall, float pdrop,  \
       uint64_t seed),                                                                             \
      (be, out, att, scratch, qkv, valid, B, T, Tq, C, NH, h0, NHall, pdrop, seed))                \
    X(attention_bwd,                                                                               \
      (const rf_backend *be, float *dqkv, float *scratch, const float *dout, const float *qkv,     \
       const float *att, const float *out, const uint8_t *valid, int B, int T, int Tq, int C,      \
       int NH, int h0, int NHall, float pdrop, uint64_t seed),                                     \
      (be, dqkv, scratch, dout, qkv, att, out, valid, B, T, Tq, C, NH, h0, NHall, pdrop, seed))    \
    X(gelu_fwd, (const rf_backend *be, float *out, const float *inp, size_t n), (be, out, inp, n)) \
    X(gelu_bwd,                                                                                    \
      (const rf_backend *be, float *dinp, const float *inp, const float *dout, size_t n),          \
      (be, dinp, inp, dout, n))                                                                    \
    X(tanh_fwd, (const rf_backend *be, float *out, const float *inp, size_t n), (be, out, inp, n)) \
    X(tanh_bwd,                                                                                    \
      (const rf_backend *be, float *dinp, const float *out, const float *dout, size_t n),          \
      (be, dinp, out, dout, n))                                                                    \
    X(dropout_fwd,                                                                                 \
      (const rf_backend *be, float *out, const float *inp, size_t n, float p, uint64_t seed),      \
      (be, out, inp, n, p, seed))                                                                  \
    X(dropout_bwd,                                                                                 \
      (const rf_backend *be, float *dinp, const float *dout, size_t n, float p, uint64_t seed),    \
      (be, dinp, dout, n, p, seed))                                                                \
    X(residual_fwd,                                                                                \
      (const rf_backend *be, float *out, const float *a, const float *b, size_t n, float p,        \
       uint64_t seed),                                                                             \
      (be, out, a, b, n, p, seed))                                                                 \
    X(residual_bwd,                                                                                \
      (const rf_backend *be, float *da, float *db, const float *dout, size_t n, float p,           \
       uint64_t seed),                                                                             \
      (be, da, db, dout, n, p, seed))                                                              \
    X(xent_fwd,                                                                                    \
      (const rf_backend *be, float *loss, float *probs, float *losses, const float *logits,        \
       const int32_t *labels, const float *weights, int B, int K),                                 \
      (be, loss, probs, losses, logits, labels, weights, B, K))                                    \
    X(xent_bwd,                                                                                    \
      (const rf_backend *be, float *dlogits, const float *probs, const int32_t *labels,            \
       const float *weights, int B, int K, float scale),                                           \
      (be, dlogits, probs, labels, weights, B, K, scale))                                          \
    X(linear_ld_fwd,                                                                               \
      (const rf_backend *be, float *out, int ldo, const float *inp, int ldi, const float *w,       \
       int ldw, const float *b, int N, int IC, int OC),                                            \
      (be, out, ldo, inp, ldi, w, ldw, b, N, IC, OC))                                              \
    X(linear_ld_bwd,                                                                               \
      (const rf_backend *be, float *dinp, int lddi, float *dw, int lddw, float *db,                \
       const float *dout, int ldd, const float *inp, int ldi, const float *w, int ldw, int N,      \
       int IC, int OC),                                                                            \
      (be, dinp, lddi, dw, lddw, db, dout, ldd, inp, ldi, w, ldw, N, IC, OC))                      \
    X(embed_rows_fwd,                                                                              \
      (const rf_backend *be, float *out, const int32_t *ids, const float *w, int lo, int hi,       \
       int N, int C),                                                                              \
      (be, out, ids, w, lo, hi, N, C))                                                             \
    X(embed_add_fwd,                                                                               \
      (const rf_backend *be, float *out, const int32_t *pos, const int32_t *types,                 \
       const float *wpe, const float *wtt, int B, int T, int C),                                   \
      (be, out, pos, types, wpe, wtt, B, T, C))                                                    \
    X(embed_rows_bwd,                                                                              \
      (const rf_backend *be, float *dw, float *dwpe, float *dwtt, const float *dout,               \
       const int32_t *ids, const int32_t *types, int lo, int hi, int B, int T, int C),             \
      (be, dw, dwpe, dwtt, dout, ids, types, lo, hi, B, T, C))                                     \
    X(vxent_stats,                                                                                 \
      (const rf_backend *be, float *mx, float *tl, const float *logits, int ldz,                   \
       const int32_t *tgt, int lo, int hi, int N),                                                 \
      (be, mx, tl, logits, ldz, tgt, lo, hi, N))                                                   \
    X(vxent_sumexp,                                                                                \
      (const rf_backend *be, double *se, const float *logits, int ldz, const float *mx, int lo,    \
       int hi, int N),                                                                             \
      (be, se, logits, ldz, mx, lo, hi, N))                                                        \
    X(vxent_loss,                                                                                  \
      (const rf_backend *be, float *loss, float *losses, const float *mx, const double *se,        \
       const int32_t *tgt, int N),                                                                 \
      (be, loss, losses, mx, se, tgt, N))                                                          \
    X(vxent_bwd,                                                                                   \
      (const rf_backend *be, float *dlogits, int ldd, const float *logits, int ldz,                \
       const float *mx, const double *se, const int32_t *tgt, int lo, int hi, int N, float scale), \
      (be, dlogits, ldd, logits, ldz, mx, se, tgt, lo, hi, N, scale))                              \
    X(softmax_argmax,                                                                              \
      (const rf_backend *be, int32_t *pred, float *probs, const float *logits, int B, int K),      \
      (be, pred, probs, logits, B, K))                                                             \
    X(tokpos_fwd,                                                                                  \
      (const rf_backend *be, float *out, const int32_t *ids, const int32_t *pos, const float *wte, \
       const float *wpe, int B, int T, int C),                                                     \
      (be, out, ids, pos, wte, wpe, B, T, C))                                                      \
    X(tokpos_bwd,                                                                                  \
      (const rf_backend *be, float *dwte, float *dwpe, const float *dout, const int32_t *ids,      \
       const int32_t *pos, int B, int T, int C, int V, int P),                                     \
      (be, dwte, dwpe, dout, ids, pos, B, T, C, V, P))                                             \
    X(conv1d_fwd,                                                                                  \
      (const rf_backend *be, float *out, const float *inp, const float *w, const float *b, int N,  \
       int IC, int OC),                                                                            \
      (be, out, inp, w, b, N, IC, OC))                                                             \
    X(conv1d_bwd,                                                                                  \
      (const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,                 \
       const float *inp, const float *w, int N, int IC, int OC),                                   \
      (be, dinp, dw, db, dout, inp, w, N, IC, OC))                                                 \
    X(rmsnorm_fwd,                                                                                 \
      (const rf_backend *be, float *out, float *rstd, const float *inp, const float *w, int N,     \
       int C, float eps),                                                                          \
      (be, out, rstd, inp, w, N, C, eps))                                                          \
    X(rmsnorm_bwd,                                                                                 \
      (const rf_backend *be, float *dinp, float *dw, const float *dout, const float *inp,          \
       const float *w, const float *rstd, int N, int C),                                           \
      (be, dinp, dw, dout, inp, w, rstd, N, C))                                                    \
    X(rope_fwd,                                                                                    \
      (const rf_backend *be, float *out, const float *inp, const int32_t *pos, int N, int T,       \
       int nh, int hs, int stride, float theta),                                                   \
      (be, out, inp, pos, N, T, nh, hs, stride, theta))                                            \
    X(rope_bwd,                                                                                    \
      (const rf_backend *be, float *dinp, const float *dout, const int32_t *pos, int N, int T,     \
       int nh, int hs, int stride, float theta),                                                   \
      (be, dinp, dout, pos, N, T, nh, hs, stride, theta))                                          \
    X(swiglu_fwd, (const rf_backend *be, float *out, const float *gu, int N, int F),               \
      (be, out, gu, N, F))                                                                         \
    X(swiglu_bwd,                                                                                  \
      (const rf_backend *be, float *dgu, const float *dout, const float *gu, int N, int F),        \
      (be, dgu, dout, gu, N, F))                                                                   \
    X(gelu_tanh_fwd, (const rf_backend *be, float *out, const float *inp, size_t n),               \
      (be, out, inp, n))                                                                           \
    X(gelu_tanh_bwd,                                                                               \
      (const rf_backend *be, float *dinp, const float *inp, const float *dout, size_t n),          \
      (be, dinp, inp, dout, n))                                                                    \
    X(causal_attention_fwd,                                                                        \
      (const rf_backend *be, float *out, float *att, const float *qkv, const uint8_t *valid,       \
       const int32_t *seg, int B, int T, int NH, int NKV, int hs),                                 \
      (be, out, att, qkv, valid, seg, B, T, NH, NKV, hs))                                          \
    X(causal_attention_bwd,                                                                        \
      (const rf_backend *be, float *dqkv, float *scratch, const float *dout, const float *qkv,     \
       const float *att, const float *out, const uint8_t *valid, const int32_t *seg, int B, int T, \
       int NH, int NKV, int hs),                                                                   \
      (be, dqkv, scratch, dout, qkv, att, out, valid, seg, B, T, NH, NKV, hs))                     \
    X(attention_stats, (const rf_backend *be, int hs, bool *stats), (be, hs, stats))               \
    X(lm_head_fwd,                                                                                 \
      (const rf_backend *be, float *logits, const float *h, const float *wte, int N, int C,        \
       int V),                                                                                     \
      (be, logits, h, wte, N, C, V))                                                               \
    X(kv_attention_fwd,                                                                            \
      (const rf_backend *be, float *out, float *scores, const float *qkv, const float *kc,         \
       const float *vc, int n, int len, int NH, int NKV, int hd),                                  \
      (be, out, scores, qkv, kc, vc, n, len, NH, NKV, hd))                                         \
    X(lm_head_bwd,                                                                                 \
      (const rf_backend *be, float *dh, float *dwte, const float *dlogits, const float *h,         \
       const float *wte, int N, int C, int V),                                                     \
      (be, dh, dwte, dlogits, h, wte, N, C, V))                                                    \
    X(causal_xent_fwd,                                                                             \
      (const rf_backend *be, float *loss, int *counted, float *lse, float *losses,                 \
       const float *logits, const int32_t *labels, int B, int T, int V),                           \
      (be, loss, counted, lse, losses, logits, labels, B, T, V))                                   \
    X(causal_xent_bwd,                                                                             \
      (const rf_backend *be, float *dlogits, const float *logits, const float *lse,                \
       const int32_t *labels, int B, int T, int V, float scale),                                   \
      (be, dlogits, logits, lse, labels, B, T, V, scale))                                          \
    X(lora_fwd,                                                                                    \
      (const rf_backend *be, float *out, int ldo, float *u, float *xd, const float *x,             \
       const float *A, const float *B, int N, int IC, int OC, int r, float scale, float p,         \
       uint64_t seed),                                                                             \
      (be, out, ldo, u, xd, x, A, B, N, IC, OC, r, scale, p, seed))                                \
    X(lora_bwd,                                                                                    \
      (const rf_backend *be, float *dx, float *dA, float *dB, float *du, float *xd,                \
       const float *dout, int ldo, const float *x, const float *u, const float *A, const float *B, \
       int N, int IC, int OC, int r, float scale, float p, uint64_t seed),                         \
      (be, dx, dA, dB, du, xd, dout, ldo, x, u, A, B, N, IC, OC, r, scale, p, seed))               \
    X(qlinear_fwd,                                                                                 \
      (const rf_backend *be, float *out, int ldo, const float *inp, const struct rf_qweight *w,    \
       const float *b, int N),                                                                     \
      (be, out, ldo, inp, w, b, N))                                                                \
    X(qlinear_bwd,                                                                                 \
      (const rf_backend *be, float *dinp, const float *dout, int ldo, const struct rf_qweight *w,  \
       int N),                                                                                     \
      (be, dinp, dout, ldo, w, N))                                                                 \
    X(sumsq, (const rf_backend *be, double *out, const float *x, size_t n), (be, out, x, n))       \
    X(sumsq_spans,                                                                                 \
      (const rf_backend *be, double *out, const float *x, const rf_param_span *spans,              \
       size_t nspans),                                                                             \
      (be, out, x, spans, nspans))                                                                 \
    X(sumsq_into,                                                                                  \
      (const rf_backend *be, double *dst, const float *x, const rf_param_span *spans,              \
       size_t nspans),                                                                             \
      (be, dst, x, spans, nspans))                                                                 \
    X(scale, (const rf_backend *be, float *x, size_t n, float s), (be, x, n, s))                   \
    X(adamw,                                                                                       \
      (const rf_backend *be, float *params, const float *grads, float *mom1, float *mom2,          \
       size_t lo, size_t hi, const rf_param_span *spans, size_t nspans, const rf_adamw_hp *hp),    \
      (be, params, grads, mom1, mom2, lo, hi, spans, nspans, hp))

#endif
