/* CPU kernels of the BERT encoder: one forward and one backward per op.
 *
 * Conventions (as in llm.c): tensors are row-major float arrays; N = rows
 * (batch x sequence), C = channels. Backward functions ACCUMULATE into every
 * gradient they produce (+=), so residual branches and gradient accumulation
 * need no extra copies; callers zero the buffers when a new step starts.
 * Every reduction runs in a fixed order whatever the thread count (rows are
 * split across threads, column sums are split by column), so results are
 * bitwise reproducible. Dropout masks are a pure function of (seed, index),
 * so backward regenerates them instead of storing them. */
#ifndef RF_TR_OPS_H
#define RF_TR_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* out[b,t] = wte[ids[b,t]] + wpe[t] + wtt[types[b,t]]; ids must be in range. */
void rf_op_embed_fwd(float *out, const int32_t *ids, const int32_t *types, const float *wte,
                     const float *wpe, const float *wtt, int B, int T, int C);
void rf_op_embed_bwd(float *dwte, float *dwpe, float *dwtt, const float *dout, const int32_t *ids,
                     const int32_t *types, int B, int T, int C, int V, int TV);

/* Stores per-row mean and 1/std for the backward pass. Backward: dw and db
 * may both be NULL (a frozen LayerNorm: only dinp). */
void rf_op_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int N, int C, float eps);
void rf_op_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                         const float *w, const float *mean, const float *rstd, int N, int C);

/* out[N,OC] = inp[N,IC] w[OC,IC]^T + b (PyTorch nn.Linear layout); b may be NULL. */
void rf_op_linear_fwd(float *out, const float *inp, const float *w, const float *b, int N, int IC,
                      int OC);
/* dinp may be NULL (input needs no gradient), dw NULL (a frozen weight), db
 * NULL (no bias or a frozen one). */
void rf_op_linear_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                      const float *w, int N, int IC, int OC);

/* Tensor parallelism's kernels (the strided linear in ops.c, the rest in
 * ops_tp.c; tp.h composes them with the tp group's all-reduces). The linear
 * layer with row strides (leading
 * dimensions, in floats, >= the row lengths), so that a rank's slice of a
 * weight or an activation is a view: out[n, o] = sum_i inp[n, i] w[o, i] +
 * b[o] for n < N, o < OC, i < IC (b NULL: none); with every ld equal to its
 * row length it is rf_op_linear_fwd/bwd element for element. Backward:
 * dinp (NULL: not wanted) += dout w; dw += dout^T inp; db (NULL: none) +=
 * the column sums of dout. */
void rf_op_linear_ld_fwd(float *out, int ldo, const float *inp, int ldi, const float *w, int ldw,
                         const float *b, int N, int IC, int OC);
void rf_op_linear_ld_bwd(float *dinp, int lddi, float *dw, int lddw, float *db, const float *dout,
                         int ldd, const float *inp, int ldi, const float *w, int ldw, int N, int IC,
                         int OC);
/* The vocabulary-parallel embedding's rows: out[n] = w[ids[n] - lo] for ids
 * in [lo, hi), zeros for the others (w holds the rows of ids [lo, hi)).
 * embed_add: out[n] = (out[n] + wpe[pos[n]]) + wtt[types[n]] in place,
 * rf_op_embed_fwd's order (pos NULL: position n % T; wtt NULL: no type,
 * types unread). embed_rows_bwd: dw[ids[n] - lo] += dout[n] for the ids in
 * range, dwpe and dwtt (each NULL: none) as rf_op_embed_bwd, in its order. */
void rf_op_embed_rows_fwd(float *out, const int32_t *ids, const float *w, int lo, int hi, int N,
                          int C);
void rf_op_embed_add_fwd(float *out, const int32_t *pos, const int32_t *types, const float *wpe,
                         const float *wtt, int B, int T, int C);
void rf_op_embed_rows_bwd(float *dw, float *dwpe, float *dwtt, const float *dout,
                          const int32_t *ids, const int32_t *types, int lo, int hi, int B, int T,
                          int C);
/* The vocabulary-parallel cross-entropy's local steps on a rank's logit
 * columns [lo, hi) (logits [N, hi - lo], row stride ldz; tgt the global
 * target ids, < 0 ignored), between tp.h's all-reduces. stats: mx[r] = the
 * row's local maximum, tl[r] = its target's logit when the rank holds it,
 * else 0. sumexp: se[r] = sum of exp((double)z - mx[r]) over the local
 * columns (mx the group's maximum by then). loss: losses[r] = log(se[r]) +
 * mx[r] - losses[r] (losses holding the group's target logits on entry; 0
 * for ignored rows) and *loss their mean over the counted rows (a double
 * sum in row order). bwd: dlogits (row stride ldd) += scale * (softmax -
 * onehot) / counted on the local columns. */
void rf_op_vxent_stats(float *mx, float *tl, const float *logits, int ldz, const int32_t *tgt,
                       int lo, int hi, int N);
void rf_op_vxent_sumexp(double *se, const float *logits, int ldz, const float *mx, int lo, int hi,
                        int N);
void rf_op_vxent_loss(float *loss, float *losses, const float *mx, const double *se,
                      const int32_t *tgt, int N);
void rf_op_vxent_bwd(float *dlogits, int ldd, const float *logits, int ldz, const float *mx,
                     const double *se, const int32_t *tgt, int lo, int hi, int N, float scale);

/* Multi-head self-attention over a fused qkv[B*T, 3C] (q | k | v, head h at
 * columns h*hs), for the queries at the first Tq positions of each sequence
 * (Tq = T: all; Tq = 1: [CLS] only) against all T keys. valid[b*T+t] = 0
 * masks key t of sequence b. att[B,NH,Tq,T] keeps the softmax probabilities
 * (before dropout) for backward, or is NULL: not kept (a forward whose
 * backward recomputes them; scratch then holds them until the values are
 * made). out is [B*Tq, C], or NULL: the probabilities only (att and
 * scratch; the backward's recompute, whose output the layer already
 * holds); not both NULL. scratch is [B,NH,Tq,T] floats: with
 * pdrop > 0 the forward leaves the dropped-out probabilities there and the
 * backward reads them (so a backward follows the forward of the same
 * arguments, with scratch untouched between), then overwrites them with
 * their gradient. */
void rf_op_attention_fwd(float *out, float *att, float *scratch, const float *qkv,
                         const uint8_t *valid, int B, int T, int Tq, int C, int NH, float pdrop,
                         uint64_t seed);
void rf_op_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                         const float *att, int B, int T, int Tq, int C, int NH, float pdrop,
                         uint64_t seed);
/* The same on heads [h0, h0 + NH) of a layer of NHall heads (tensor
 * parallelism: qkv holds only those heads, C = NH * head size columns of each
 * of q, k and v): the dropout mask of local head h is the one of global head
 * h0 + h, so masks do not depend on how the heads are split. h0 = 0 and
 * NHall = NH is rf_op_attention_fwd/bwd. */
void rf_op_attention_heads_fwd(float *out, float *att, float *scratch, const float *qkv,
                               const uint8_t *valid, int B, int T, int Tq, int C, int NH, int h0,
                               int NHall, float pdrop, uint64_t seed);
void rf_op_attention_heads_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int Tq, int C, int NH, int h0,
                               int NHall, float pdrop, uint64_t seed);

/* GELU with the exact erf form (BERT's "gelu"), erf to within a few ulp. */
void rf_op_gelu_fwd(float *out, const float *inp, size_t n);
void rf_op_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);

void rf_op_tanh_fwd(float *out, const float *inp, size_t n);
/* Uses the forward output: d tanh = 1 - out^2. */
void rf_op_tanh_bwd(float *dinp, const float *out, const float *dout, size_t n);

/* Inverted dropout; in place allowed (out == inp). p == 0 copies. */
void rf_op_dropout_fwd(float *out, const float *inp, size_t n, float p, uint64_t seed);
void rf_op_dropout_bwd(float *dinp, const float *dout, size_t n, float p, uint64_t seed);
/* 1 when element i survives dropout with probability 1-p under seed. */
int rf_op_dropout_keep(uint64_t seed, uint64_t i, float p);

/* BERT's residual: out = dropout(a) + b, the branch a dropped out with
 * probability p (0: none) under the same masks as rf_op_dropout_fwd; out may
 * alias a. Backward: da += dout * mask / (1-p), db += dout (db may be NULL). */
void rf_op_residual_fwd(float *out, const float *a, const float *b, size_t n, float p,
                        uint64_t seed);
void rf_op_residual_bwd(float *da, float *db, const float *dout, size_t n, float p, uint64_t seed);

/* Softmax cross-entropy over rows with label >= 0 (label < 0 is ignored).
 * probs[B,K] keeps the softmax; losses[b] is row b's unweighted loss (0 when
 * ignored). weights: NULL for the plain mean over counted rows, else K class
 * weights and the weighted mean of PyTorch's CrossEntropyLoss(weight=w):
 * sum_b w[y_b] * loss_b / sum_b w[y_b] (0 when that denominator is 0). */
float rf_op_xent_fwd(float *probs, float *losses, const float *logits, const int32_t *labels,
                     const float *weights, int B, int K);
/* dlogits += scale * w[y_b] / sum_b w[y_b] * (probs - onehot); with weights
 * NULL every w is 1, i.e. scale * (probs - onehot) / (rows counted). */
void rf_op_xent_bwd(float *dlogits, const float *probs, const int32_t *labels, const float *weights,
                    int B, int K, float scale);

/* Evaluation: pred[b] = the first maximum of logits row b; probs (NULL: not
 * wanted) its softmax, exp(z - max) summed in double in column order. */
void rf_op_softmax_argmax(int32_t *pred, float *probs, const float *logits, int B, int K);

/* The optimizer's kernels (ops_optim.c). Sum of squares of x[0..n) in double,
 * in RF_OP_SUMSQ_CHUNKS fixed chunks (each summed in order, then the chunks in
 * order): the same value whatever the thread count. */
#define RF_OP_SUMSQ_CHUNKS 64
double rf_op_sumsq(const float *x, size_t n);
void rf_op_scale(float *x, size_t n, float s);
/* The gradient clipping coefficient for a gradient whose sum of squares is
 * ss: clip_norm / (norm + 1e-6) (torch's clip_grad_norm_ formula, norm the
 * float square root) where that is below 1, else 1 (also for clip_norm <= 0
 * and a NaN norm). Host and device code (cuda/adamw.cu) share it. */
#ifdef __CUDACC__
#define RF_OPS_HOST_DEVICE __host__ __device__
#else
#define RF_OPS_HOST_DEVICE
#endif
static inline RF_OPS_HOST_DEVICE float rf_clip_coef(double ss, float clip_norm) {
    float norm = (float)sqrt(ss), c = clip_norm / (norm + 1e-6f);
    return clip_norm > 0 && c < 1.0f ? c : 1.0f;
}
/* AdamW on parameters [lo, hi) of params/grads (element i at index i); mom1
 * and mom2 hold that range only (mom1[0] is element lo). spans[] lists the
 * tensors in order with their decay flag; a range may cut a tensor anywhere.
 * Same operation order as torch's single-tensor AdamW (bias corrections in
 * double, m by lerp, v by mul + addcmul, then addcdiv); every element is
 * updated on its own, so a range gives exactly the full update's values.
 * hp->sumsq set: each gradient times rf_clip_coef(*hp->sumsq,
 * hp->clip_norm) first (rounded as rf_op_scale would round it; times 1 is
 * exact, so no clipping is the plain update bit for bit). */
struct rf_param_span;
struct rf_adamw_hp;
void rf_op_adamw(float *params, const float *grads, float *mom1, float *mom2, size_t lo, size_t hi,
                 const struct rf_param_span *spans, size_t nspans, const struct rf_adamw_hp *hp);

#endif
