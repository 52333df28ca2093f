/* CPU kernels of the causal language models (GPT-2, Llama): one forward and
 * one backward per op, with the conventions of ops.h: row-major float arrays,
 * N = rows (batch x sequence), backward ACCUMULATES (+=) into every gradient
 * it produces, and every reduction runs in a fixed order whatever the thread
 * count (parallel loops split independent outputs only; sums over rows are
 * split by column, each column summed in row order), so results are bitwise
 * reproducible. Plain pointers and sizes only, so a device backend can supply
 * twins with the same signatures.
 *
 * None of these ops uses randomness yet (no dropout: fine-tuning of causal
 * models runs without it in the parity fixtures). */
#ifndef RF_TR_OPS_CAUSAL_H
#define RF_TR_OPS_CAUSAL_H

#include <stddef.h>
#include <stdint.h>

/* The batch the causal models take: B sequences of T tokens, row-major.
 * valid (NULL: all 1) is the attention mask (right padding); labels (NULL: no
 * loss) Hugging Face's unshifted labels, -100 ignored. For packed documents
 * pos (NULL: 0..T-1 in every row) restarts at each document and seg (NULL:
 * one document per row) numbers them, so attention stays inside a document;
 * the caller sets the label of each document's first token to -100 so that
 * the previous document's last token does not predict it. */
typedef struct rf_causal_batch {
    int B, T;
    const int32_t *ids, *labels, *pos, *seg;
    const uint8_t *valid;
} rf_causal_batch;

/* out[n] = wte[ids[n]] + wpe[pos[n]] (wpe NULL: no learned positions, as in
 * Llama; pos NULL: position n % T). ids and pos must be in range. */
void rf_op_tokpos_fwd(float *out, const int32_t *ids, const int32_t *pos, const float *wte,
                      const float *wpe, int B, int T, int C);
/* dwte[ids[n]] += dout[n], dwpe[pos[n]] += dout[n] (either may be NULL). */
void rf_op_tokpos_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *ids,
                      const int32_t *pos, int B, int T, int C);

/* Hugging Face's Conv1D (GPT-2): out[N,OC] = inp[N,IC] w[IC,OC] + b, the
 * weight stored [in, out] (the transpose of nn.Linear); b may be NULL. */
void rf_op_conv1d_fwd(float *out, const float *inp, const float *w, const float *b, int N, int IC,
                      int OC);
/* dinp may be NULL (input needs no gradient), dw (a frozen weight) and db too. */
void rf_op_conv1d_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                      const float *w, int N, int IC, int OC);

/* RMSNorm (Llama): out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); stores
 * rstd[N] for backward. */
void rf_op_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                       float eps);
/* dw may be NULL (a frozen norm: only dinp). */
void rf_op_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                       const float *rstd, int N, int C);

/* Rotary position embedding with Hugging Face Llama's rotate_half convention:
 * within each head of hs (even) channels, channel i < hs/2 pairs with i + hs/2,
 * x' = x cos(p f_i) - y sin(p f_i), y' = y cos(p f_i) + x sin(p f_i), with
 * f_i = theta^(-2i/hs) and p = pos[n] (pos NULL: n % T). Rows are `stride`
 * floats apart and the nh heads start at column 0 of the pointer given, so the
 * q and k parts of a fused qkv buffer are rotated in place with two calls
 * (out may alias inp). Backward applies the inverse rotation:
 * dinp += R^T dout (dinp must not alias dout). */
void rf_op_rope_fwd(float *out, const float *inp, const int32_t *pos, int N, int T, int nh, int hs,
                    int stride, float theta);
void rf_op_rope_bwd(float *dinp, const float *dout, const int32_t *pos, int N, int T, int nh,
                    int hs, int stride, float theta);

/* SwiGLU: out[N,F] = silu(gate) * up over a fused gu[N, 2F] (gate | up). */
void rf_op_swiglu_fwd(float *out, const float *gu, int N, int F);
void rf_op_swiglu_bwd(float *dgu, const float *dout, const float *gu, int N, int F);

/* GELU with the tanh approximation (GPT-2's "gelu_new"):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void rf_op_gelu_tanh_fwd(float *out, const float *inp, size_t n);
void rf_op_gelu_tanh_bwd(float *dinp, const float *inp, const float *dout, size_t n);

/* Causal self-attention with grouped-query attention over a fused
 * qkv[B*T, (NH + 2 NKV) hs]: queries at column 0 (head h at h*hs), keys at
 * NH*hs, values at (NH + NKV)*hs; query head h reads kv head h / (NH/NKV)
 * (NKV must divide NH; NKV = NH is plain multi-head attention, as in GPT-2).
 * Query t of sequence b attends to keys j <= t with valid[b*T+j] != 0 (valid
 * NULL: every key valid) and, for packed sequences, seg[b*T+j] ==
 * seg[b*T+t] (seg NULL: one document per row of the batch), so attention
 * never crosses documents. Scores are scaled by 1/sqrt(hs); a query with no
 * such key gets a zero output. att[B,NH,T,T] keeps the probabilities (zero
 * above the diagonal and at masked keys) for backward, which therefore needs
 * neither mask. out is [B*T, NH*hs], or NULL: the probabilities only (the
 * backward's recompute, whose output the layer already holds). */
void rf_op_causal_attention_fwd(float *out, float *att, const float *qkv, const uint8_t *valid,
                                const int32_t *seg, int B, int T, int NH, int NKV, int hs);
/* scratch: B*NH*T floats of working space (each probability row's gradient
 * dot product), not kept between calls. */
void rf_op_causal_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                const float *att, int B, int T, int NH, int NKV, int hs);

/* Attention of n new tokens over a key/value cache (inference, causal_infer.c):
 * qkv [n, W] holds the new tokens' q | k | v (W = (NH + 2 NKV) hd; q the
 * first NH hd columns), kc and vc [len + n, NKV hd] the keys and values of
 * positions 0..len+n-1 (the new ones already appended), query t at position
 * len + t seeing keys 0..len+t (grouped-query: query head h reads key/value
 * head h / (NH / NKV)). out [n, NH hd]. scores: NH n (len + n) floats of
 * working space. Per (head, block of 64 queries) one sgemm for the scores
 * and one for the weighted values, the softmax in float with a double sum;
 * tasks run in parallel, so results depend on the thread count only through
 * OpenBLAS's choices (inference needs no bitwise reproducibility). */
void rf_op_kv_attention_fwd(float *out, float *scores, const float *qkv, const float *kc,
                            const float *vc, int n, int len, int NH, int NKV, int hd);

/* The tied LM head: logits[N,V] = h[N,C] wte[V,C]^T (no bias). Backward adds
 * into dh (may be NULL) and into dwte, the embedding's own gradient, so the
 * two uses of the tied matrix sum in one buffer. An untied head is the same
 * op on its own weight. */
void rf_op_lm_head_fwd(float *logits, const float *h, const float *wte, int N, int C, int V);
/* dwte may be NULL (a frozen head). */
void rf_op_lm_head_bwd(float *dh, float *dwte, const float *dlogits, const float *h,
                       const float *wte, int N, int C, int V);

/* Causal-LM cross-entropy, Hugging Face's shift: row (b, t) predicts
 * labels[b, t+1]; the last position of each sequence and labels equal to
 * -100 (any negative label) are not counted. lse[B*T] keeps each row's
 * log-sum-exp for backward, losses[B*T] each counted row's loss (0 otherwise).
 * Returns the mean over counted rows (0 when none); *counted (may be NULL)
 * gets their number. */
float rf_op_causal_xent_fwd(float *lse, float *losses, int *counted, const float *logits,
                            const int32_t *labels, int B, int T, int V);
/* The targets that shift gives, one per row: tgt[b, t] = labels[b, t+1],
 * -1 for the last position of each sequence and for negative labels (the
 * per-row labels of the vocabulary-parallel loss, rf_tp_xent_fwd). Returns
 * how many are counted (>= 0). */
int rf_causal_targets(int32_t *tgt, const int32_t *labels, int B, int T);
/* dlogits += scale / counted * (softmax - onehot) on counted rows. */
void rf_op_causal_xent_bwd(float *dlogits, const float *logits, const float *lse,
                           const int32_t *labels, int B, int T, int V, float scale);

#endif
