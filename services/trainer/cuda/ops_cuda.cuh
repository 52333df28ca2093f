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
// matmul.cu: C = alpha op(A) op(B) + beta C, column-major, fp32 storage, the
// context's compute type (pedantic fp32, or bf16 tensor cores for cuda-bf16)
int rf_cu_gemm(rf_cuda_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
               float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C,
               int ldc, const char *what);
int rf_cu_linear_fwd(const rf_backend *be, float *out, const float *inp, const float *w,
                     const float *b, int N, int IC, int OC);
int rf_cu_linear_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                     const float *inp, const float *w, int N, int IC, int OC);
// tensor parallelism: the linear layer with leading dimensions (matmul.cu),
// the vocabulary-parallel embedding's rows (embed.cu)
int rf_cu_linear_ld_fwd(const rf_backend *be, float *out, int ldo, const float *inp, int ldi,
                        const float *w, int ldw, const float *b, int N, int IC, int OC);
int rf_cu_linear_ld_bwd(const rf_backend *be, float *dinp, int lddi, float *dw, int lddw, float *db,
                        const float *dout, int ldd, const float *inp, int ldi, const float *w,
                        int ldw, int N, int IC, int OC);
int rf_cu_embed_rows_fwd(const rf_backend *be, float *out, const int32_t *ids, const float *w,
                         int lo, int hi, int N, int C);
int rf_cu_embed_add_fwd(const rf_backend *be, float *out, const int32_t *pos, const int32_t *types,
                        const float *wpe, const float *wtt, int B, int T, int C);
// the vocabulary-parallel cross-entropy's local steps (causal_xent.cu)
int rf_cu_vxent_stats(const rf_backend *be, float *mx, float *tl, const float *logits, int ldz,
                      const int32_t *tgt, int lo, int hi, int N);
int rf_cu_vxent_sumexp(const rf_backend *be, double *se, const float *logits, int ldz,
                       const float *mx, int lo, int hi, int N);
int rf_cu_vxent_loss(const rf_backend *be, float *loss, float *losses, const float *mx,
                     const double *se, const int32_t *tgt, int N);
int rf_cu_vxent_bwd(const rf_backend *be, float *dlogits, int ldd, const float *logits, int ldz,
                    const float *mx, const double *se, const int32_t *tgt, int lo, int hi, int N,
                    float scale);
int rf_cu_embed_rows_bwd(const rf_backend *be, float *dw, float *dwpe, float *dwtt,
                         const float *dout, const int32_t *ids, const int32_t *types, int lo,
                         int hi, int B, int T, int C);
// attention.cu, shared with causal_attention.cu: products over a pointer per
// (batch, query head) and operand (cublasGemmBatchedEx), reading and writing
// heads in place in row-major [rows, heads x hs] matrices. Entry z of every
// list is one (r, b, g): r = z / (B NKV), b = z / NKV % B, g = z % NKV, the
// query head h = g grp + r of kv head g (grp = NH / NKV; without grouped
// heads NKV = NH and z = b NH + h); list i's entry is base[i] + b sb[i] + h
// sq[i] + g skv[i] floats. The B NKV entries of one r (from r B NKV on) hold
// one query head of each kv head: a product over them alone may add into
// the kv heads' gradients. rf_cu_att_fill writes n lists of B NH pointers
// into the context's ptrs in one launch (list i at *lists + i B NH; the
// products queued after it on the stream read them before the next fill);
// rf_cu_gemm_lists is C_z = alpha op(A_z) op(B_z) + beta C_z over Z of them,
// column-major, the context's compute type (as rf_cu_gemm).
#define RF_CU_ATT_LISTS_MAX 9
typedef struct rf_cu_att_lists {
    const float *base[RF_CU_ATT_LISTS_MAX];
    long long sb[RF_CU_ATT_LISTS_MAX], sq[RF_CU_ATT_LISTS_MAX], skv[RF_CU_ATT_LISTS_MAX];
} rf_cu_att_lists;
int rf_cu_att_fill(rf_cuda_ctx *c, const rf_cu_att_lists *L, int n, int B, int NH, int NKV,
                   const float ***lists);
int rf_cu_gemm_lists(rf_cuda_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                     int k, float alpha, const float *const *A, int lda, const float *const *B,
                     int ldb, float beta, const float *const *Cm, int ldc, int Z, const char *what);
int rf_cu_attention_fwd(const rf_backend *be, float *out, float *att, float *scratch,
                        const float *qkv, const uint8_t *valid, int B, int T, int Tq, int C, int NH,
                        int h0, int NHall, float pdrop, uint64_t seed);
int rf_cu_attention_bwd(const rf_backend *be, float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *att, const float *out, const uint8_t *valid,
                        int B, int T, int Tq, int C, int NH, int h0, int NHall, float pdrop,
                        uint64_t seed);
// attention_stats: whether the fused kernels take head size hs (backend.h)
int rf_cu_attention_stats(const rf_backend *be, int hs, bool *stats);
// flash_attention.cu: the encoder attention's forward fused on bf16 tensor
// cores (out only: the semantics of rf_op_attention_fwd's out, dropout
// included; or, out NULL, each query row's log-sum-exp into lse, B NH Tq
// floats, for the fused backward), for the head sizes rf_cu_flash_fits
// takes; attention.cu and causal_attention.cu pick it.
bool rf_cu_flash_fits(int hs);
// Whether the attentions take the fused kernels for head size hs (cuda-bf16,
// REFINERY_FUSED_ATTENTION not 0, the head fits): the one test the slots'
// dispatch and attention_stats (the models' buffer sizes) share.
static inline bool rf_cu_flash_on(const rf_cuda_ctx *c, int hs) {
    return c->fused_att && rf_cu_flash_fits(hs);
}
int rf_cu_flash_fwd(rf_cuda_ctx *c, float *out, float *lse, const float *qkv, const uint8_t *valid,
                    int B, int T, int Tq, int C, int NH, int h0, int NHall, float pdrop,
                    uint64_t seed);
// ... the encoder's backward, from the rows' log-sum-exp lse that
// rf_cu_flash_fwd left (with out NULL), the forward's output out, and D:
// B NH Tq floats of device room
int rf_cu_flash_bwd(rf_cuda_ctx *c, float *dqkv, float *D, const float *lse, const float *qkv,
                    const float *out, const float *dout, const uint8_t *valid, int B, int T, int Tq,
                    int C, int NH, int h0, int NHall, float pdrop, uint64_t seed);
// ... and the causal attention's (rf_op_causal_attention_fwd's out, or lse),
// and its backward, the same way (D: B NH T floats)
int rf_cu_flash_causal_fwd(rf_cuda_ctx *c, float *out, float *lse, const float *qkv,
                           const uint8_t *valid, const int32_t *seg, int B, int T, int NH, int NKV,
                           int hs);
int rf_cu_flash_causal_bwd(rf_cuda_ctx *c, float *dqkv, float *D, const float *lse,
                           const float *qkv, const float *out, const float *dout,
                           const uint8_t *valid, const int32_t *seg, int B, int T, int NH, int NKV,
                           int hs);
// gelu.cu
int rf_cu_gelu_fwd(const rf_backend *be, float *out, const float *inp, size_t n);
int rf_cu_gelu_bwd(const rf_backend *be, float *dinp, const float *inp, const float *dout,
                   size_t n);
// pooler.cu (tanh)
int rf_cu_tanh_fwd(const rf_backend *be, float *out, const float *inp, size_t n);
int rf_cu_tanh_bwd(const rf_backend *be, float *dinp, const float *out, const float *dout,
                   size_t n);
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
// The causal language models (GPT-2, Llama; semantics: ops_causal.h).
// tokpos.cu
int rf_cu_tokpos_fwd(const rf_backend *be, float *out, const int32_t *ids, const int32_t *pos,
                     const float *wte, const float *wpe, int B, int T, int C);
int rf_cu_tokpos_bwd(const rf_backend *be, float *dwte, float *dwpe, const float *dout,
                     const int32_t *ids, const int32_t *pos, int B, int T, int C, int V, int P);
// matmul.cu (Conv1D and the LM head through cuBLAS)
int rf_cu_conv1d_fwd(const rf_backend *be, float *out, const float *inp, const float *w,
                     const float *b, int N, int IC, int OC);
int rf_cu_conv1d_bwd(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                     const float *inp, const float *w, int N, int IC, int OC);
int rf_cu_lm_head_fwd(const rf_backend *be, float *logits, const float *h, const float *wte, int N,
                      int C, int V);
int rf_cu_lm_head_bwd(const rf_backend *be, float *dh, float *dwte, const float *dlogits,
                      const float *h, const float *wte, int N, int C, int V);
// rmsnorm.cu
int rf_cu_rmsnorm_fwd(const rf_backend *be, float *out, float *rstd, const float *inp,
                      const float *w, int N, int C, float eps);
int rf_cu_rmsnorm_bwd(const rf_backend *be, float *dinp, float *dw, const float *dout,
                      const float *inp, const float *w, const float *rstd, int N, int C);
// rope.cu
int rf_cu_rope_fwd(const rf_backend *be, float *out, const float *inp, const int32_t *pos, int N,
                   int T, int nh, int hs, int stride, float theta);
int rf_cu_rope_bwd(const rf_backend *be, float *dinp, const float *dout, const int32_t *pos, int N,
                   int T, int nh, int hs, int stride, float theta);
// swiglu.cu
int rf_cu_swiglu_fwd(const rf_backend *be, float *out, const float *gu, int N, int F);
int rf_cu_swiglu_bwd(const rf_backend *be, float *dgu, const float *dout, const float *gu, int N,
                     int F);
// gelu.cu (the tanh approximation)
int rf_cu_gelu_tanh_fwd(const rf_backend *be, float *out, const float *inp, size_t n);
int rf_cu_gelu_tanh_bwd(const rf_backend *be, float *dinp, const float *inp, const float *dout,
                        size_t n);
// causal_attention.cu (and the inference's attention over a key/value cache)
int rf_cu_kv_attention_fwd(const rf_backend *be, float *out, float *scores, const float *qkv,
                           const float *kc, const float *vc, int n, int len, int NH, int NKV,
                           int hd);
int rf_cu_causal_attention_fwd(const rf_backend *be, float *out, float *att, const float *qkv,
                               const uint8_t *valid, const int32_t *seg, int B, int T, int NH,
                               int NKV, int hs);
int rf_cu_causal_attention_bwd(const rf_backend *be, float *dqkv, float *scratch, const float *dout,
                               const float *qkv, const float *att, const float *out,
                               const uint8_t *valid, const int32_t *seg, int B, int T, int NH,
                               int NKV, int hs);
// causal_xent.cu
int rf_cu_causal_xent_fwd(const rf_backend *be, float *loss, int *counted, float *lse,
                          float *losses, const float *logits, const int32_t *labels, int B, int T,
                          int V);
int rf_cu_causal_xent_bwd(const rf_backend *be, float *dlogits, const float *logits,
                          const float *lse, const int32_t *labels, int B, int T, int V,
                          float scale);
// LoRA (semantics: rf_op_lora_fwd/bwd in lora.h). lora.cu
int rf_cu_lora_fwd(const rf_backend *be, float *out, int ldo, float *u, float *xd, const float *x,
                   const float *A, const float *B, int N, int IC, int OC, int r, float scale,
                   float p, uint64_t seed);
int rf_cu_lora_bwd(const rf_backend *be, float *dx, float *dA, float *dB, float *du, float *xd,
                   const float *dout, int ldo, const float *x, const float *u, const float *A,
                   const float *B, int N, int IC, int OC, int r, float scale, float p,
                   uint64_t seed);
// qlinear.cu (semantics: rf_op_qlinear_fwd/bwd in quant.h; w's arrays on the device)
int rf_cu_qlinear_fwd(const rf_backend *be, float *out, int ldo, const float *inp,
                      const struct rf_qweight *w, const float *b, int N);
int rf_cu_qlinear_bwd(const rf_backend *be, float *dinp, const float *dout, int ldo,
                      const struct rf_qweight *w, int N);
// norm.cu
int rf_cu_sumsq(const rf_backend *be, double *out, const float *x, size_t n);
int rf_cu_sumsq_into(const rf_backend *be, double *dst, const float *x, const rf_param_span *spans,
                     size_t nspans);
int rf_cu_sumsq_spans(const rf_backend *be, double *out, const float *x, const rf_param_span *spans,
                      size_t nspans);
int rf_cu_scale(const rf_backend *be, float *x, size_t n, float s);
// adamw.cu
int rf_cu_adamw(const rf_backend *be, float *params, const float *grads, float *mom1, float *mom2,
                size_t lo, size_t hi, const rf_param_span *spans, size_t nspans,
                const rf_adamw_hp *hp);

#endif
