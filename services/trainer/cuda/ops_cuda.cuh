// The CUDA twins of the backend's slots (backend.h), one file per op in this
// folder; backend_cuda.cu puts them in the table. Pointers are device memory.
#ifndef RF_TR_CUDA_OPS_CUDA_CUH
#define RF_TR_CUDA_OPS_CUDA_CUH

#include "trainer/cuda/common.cuh"

// embed.cu
int rf_cu_embed_fwd(const rf_backend *be, float *out, const int32_t *ids, const int32_t *types,
                    const float *wte, const float *wpe, const float *wtt, int B, int T, int C);
int rf_cu_embed_bwd(const rf_backend *be, float *dwte, float *dwpe, float *dwtt, const float *dout,
                    const int32_t *ids, const int32_t *types, int B, int T, int C, int V, int TV);
// layernorm.cu
int rf_cu_layernorm_fwd(const rf_backend *be, float *out, float *mean, float *rstd,
                        const float *inp, const float *w, const float *b, int N, int C, float eps);
int rf_cu_layernorm_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean, const float *rstd,
                        int N, int C);
// matmul.cu
int rf_cu_linear_fwd(const rf_backend *be, float *out, const float *inp, const float *w,
                     const float *b, int N, int IC, int OC);
int rf_cu_linear_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                     const float *inp, const float *w, int N, int IC, int OC);
// attention.cu
int rf_cu_attention_fwd(const rf_backend *be, float *out, float *att, float *scratch,
                        const float *qkv, const uint8_t *valid, int B, int T, int Tq, int C, int NH,
                        float pdrop, uint64_t seed);
int rf_cu_attention_bwd(const rf_backend *be, float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *att, int B, int T, int Tq, int C, int NH,
                        float pdrop, uint64_t seed);
// gelu.cu
int rf_cu_gelu_fwd(const rf_backend *be, float *out, const float *inp, size_t n);
int rf_cu_gelu_bwd(const rf_backend *be, float *dinp, const float *inp, const float *dout, size_t n);
// pooler.cu (tanh)
int rf_cu_tanh_fwd(const rf_backend *be, float *out, const float *inp, size_t n);
int rf_cu_tanh_bwd(const rf_backend *be, float *dinp, const float *out, const float *dout, size_t n);
// dropout.cu (dropout and the residual adds: the same masks)
int rf_cu_dropout_fwd(const rf_backend *be, float *out, const float *inp, size_t n, float p,
                      uint64_t seed);
int rf_cu_dropout_bwd(const rf_backend *be, float *dinp, const float *dout, size_t n, float p,
                      uint64_t seed);
int rf_cu_residual_fwd(const rf_backend *be, float *out, const float *a, const float *b, size_t n,
                       float p, uint64_t seed);
int rf_cu_residual_bwd(const rf_backend *be, float *da, float *db, const float *dout, size_t n,
                       float p, uint64_t seed);
// xent.cu (softmax + cross-entropy, and the evaluation arg-max)
int rf_cu_xent_fwd(const rf_backend *be, float *loss, float *probs, float *losses,
                   const float *logits, const int32_t *labels, const float *weights, int B, int K);
int rf_cu_xent_bwd(const rf_backend *be, float *dlogits, const float *probs, const int32_t *labels,
                   const float *weights, int B, int K, float scale);
int rf_cu_softmax_argmax(const rf_backend *be, int32_t *pred, float *probs, const float *logits,
                         int B, int K);
// norm.cu
int rf_cu_sumsq(const rf_backend *be, double *out, const float *x, size_t n);
int rf_cu_scale(const rf_backend *be, float *x, size_t n, float s);
// adamw.cu
int rf_cu_adamw(const rf_backend *be, float *params, const float *grads, float *mom1, float *mom2,
                size_t lo, size_t hi, const rf_param_span *spans, size_t nspans,
                const rf_adamw_hp *hp);

#endif
