/* Tensor-parallel building blocks (Megatron style, issue 17): the linear
 * layers split over the ranks of a tp group, the fused QKV split by heads, the
 * vocabulary-parallel embedding and cross-entropy. Each has a forward and a
 * backward; the communication is inside them (the group's communicator), so a
 * block costs one all-reduce in forward (row-parallel output) and one in
 * backward (column-parallel input gradient), as in Megatron's f/g operators.
 *
 * Conventions are ops.h's: row-major floats, nn.Linear weights [out, in],
 * backward ACCUMULATES (+=) into every gradient, and every rank of the tp
 * group calls the same op in the same order with the same replicated
 * arguments (inputs of a column-parallel op, output gradients of a
 * row-parallel op, ids and labels). Where a split is not contiguous the ops
 * take leading dimensions (row strides, in floats) instead of copying: a
 * rank may hold its own packed shard, or point into the full tensor.
 *
 * Memory: the group's backend's. Everything runs through its slots
 * (linear_ld_*, embed_rows_*, embed_add_fwd, vxent_*: backend.h; on the CPU
 * ops.c's and ops_tp.c's kernels, OpenBLAS cut into fixed pieces so that no
 * element depends on the thread count), so a shard may live on a device; the
 * all-reduces run on the group's communicator, which for device memory is an
 * NCCL group (rf_comm_dup_mem), after a wait for the backend's queue.
 *
 * Errors: RF_OK, the backend's error, or the comm layer's (a broken group:
 * log rf_errmsg() and exit, see comm.h), or RF_ERR_RANGE for an id outside
 * the vocabulary. */
#ifndef RF_TR_TP_H
#define RF_TR_TP_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "trainer/backend.h"
#include "trainer/mesh.h"

/* Where the ops of one tp group run. */
typedef struct rf_tp_group {
    rf_comm *c;           /* the tp group, for buffers of be's memory */
    const rf_backend *be; /* whose memory the tensors are */
    void *sync;           /* a few bytes of be's memory that to_host reads to wait for
                           * be's queue before an all-reduce (NULL on the CPU; not
                           * read when c is ordered after be->queue: comm.h) */
} rf_tp_group;

/* Column-parallel linear: the rank holds OCl = OC/tp output rows of the
 * weight (w: [OCl, IC], row stride ldw: IC both for a packed shard and for a
 * view W + tp_i*OCl*IC of the full weight) and of the bias. Forward: out
 * [N, OCl] (row stride ldo) = the rank's output columns; no communication.
 * Backward: dw, db the rank's rows (row stride ldw); the input gradient is
 * summed over the group with one all-reduce. dinp (NULL: not wanted) must
 * hold the same values on every tp rank on entry (a replicated tensor's
 * gradient so far); ranks other than tp rank 0 zero it before adding their
 * part, so after the all-reduce it is that value plus the full gradient. */
int rf_tp_colpar_fwd(const rf_tp_group *g, float *out, int ldo, const float *inp, const float *w,
                     int ldw, const float *b, int N, int IC, int OCl);
int rf_tp_colpar_bwd(const rf_tp_group *g, float *dinp, float *dw, float *db, int ldw,
                     const float *dout, int ldd, const float *inp, const float *w, int N, int IC,
                     int OCl);

/* Row-parallel linear: the rank holds ICl = IC/tp input columns of the weight
 * (w: [OC, ICl] with row stride ldw: ICl for a packed shard, IC for a view
 * W + tp_i*ICl of the full weight) and reads its slice of the input (inp
 * [N, ICl], row stride ldi: the output of a column-parallel op). The bias is
 * replicated. Forward: out [N, OC] (contiguous) = the all-reduced sum of the
 * ranks' partial products, the bias added once (by tp rank 0, before the
 * sum); one all-reduce. Backward: no communication; dinp [N, ICl] (row
 * stride ldi) and dw (row stride ldw) are the rank's slices, db (NULL: none)
 * the full bias gradient, the same on every rank. */
int rf_tp_rowpar_fwd(const rf_tp_group *g, float *out, const float *inp, int ldi, const float *w,
                     int ldw, const float *b, int N, int ICl, int OC);
int rf_tp_rowpar_bwd(const rf_tp_group *g, float *dinp, int ldi, float *dw, int ldw, float *db,
                     const float *dout, const float *inp, const float *w, int N, int ICl, int OC);

/* The fused QKV projection (weight [3C, C]: q rows, then k, then v; bias
 * [3C]), column-parallel by heads: a rank with heads [h0, h0 + NH/tp) takes
 * Cl = C/tp rows of each of q, k and v: three blocks of Cl rows, `wstride`
 * rows apart, not one contiguous slice. Two layouts, the same call:
 *   - a view of the full weight: w = W + tp_i*Cl*C, b = B + tp_i*Cl,
 *     wstride = C (and the gradients dw, db likewise in the full dW, dB);
 *   - a packed shard [3Cl, C] (q_l; k_l; v_l), bias [3Cl]: wstride = Cl.
 * out is [N, 3Cl] = q_l | k_l | v_l, which is the fused layout that
 * rf_op_attention_fwd takes with C = Cl and NH = NH/tp: attention on the
 * local heads needs no copy either. Backward: one all-reduce of dinp over the
 * group (the rule of rf_tp_colpar_bwd). */
int rf_tp_qkv_fwd(const rf_tp_group *g, float *out, const float *inp, const float *w,
                  const float *b, int wstride, int N, int C, int Cl);
int rf_tp_qkv_bwd(const rf_tp_group *g, float *dinp, float *dw, float *db, int wstride,
                  const float *dout, const float *inp, const float *w, int N, int C, int Cl);

/* The all-reduce (sum) of x[n] over the tp group: Megatron's g in forward
 * (after a row-parallel product) and f in backward (after a column-parallel
 * input gradient). The ops above call it themselves; a layer whose weights
 * have another layout (GPT-2's Conv1D [in, out], Llama's fused projections)
 * runs the product on its shard with ops.h / ops_causal.h and calls this at
 * the same points. */
int rf_tp_sum(const rf_tp_group *g, float *x, size_t n);

/* Vocabulary-parallel embedding: wte_local [v->block, C] holds ids
 * [v->lo, v->hi) (rf_tp_vocab_split); wpe [P, C] and wtt [TV, C] are
 * replicated; wpe NULL: the word embedding alone (Llama), wtt NULL: no token
 * types (GPT-2). out[n] = wte[ids[n]] + wpe[pos[n]] + wtt[types[n]] (pos
 * NULL: position n % T): each rank writes
 * its rows (zeros for ids it does not own), one all-reduce makes the word
 * embedding whole, then every rank adds position and type (in ops.c's order,
 * so the result equals rf_op_embed_fwd bitwise). On the CPU backend,
 * RF_ERR_RANGE before any communication for an id outside [0, V) (ids are
 * replicated, so every rank fails alike); on a device ids are device memory,
 * which the caller checked on the host before copying them there. Backward: no communication;
 * dwte_local gets the rows of the rank's ids; dwpe, dwtt (NULL: none) the same on every rank. The
 * causal-LM head reuses wte_local as a column-parallel weight (rf_tp_colpar_fwd with OCl =
 * v->block): its padding rows must then be zero (as allocated), so that their logits are 0, ignored
 * by rf_tp_xent_*, and their gradients stay 0. */
int rf_tp_embed_fwd(const rf_tp_group *g, float *out, const int32_t *ids, const int32_t *pos,
                    const int32_t *types, const float *wte_local, const rf_tp_vocab *v,
                    const float *wpe, const float *wtt, int B, int T, int C);
int rf_tp_embed_bwd(const rf_tp_group *g, float *dwte_local, float *dwpe, float *dwtt,
                    const float *dout, const int32_t *ids, const int32_t *types,
                    const rf_tp_vocab *v, int B, int T, int C);

/* Vocabulary-parallel softmax cross-entropy (Megatron's): logits [N, block]
 * (row stride ldz) are the rank's columns, ids [v->lo, v->hi) (padding columns
 * are ignored); labels are global ids, < 0 ignored. Three all-reduces of N
 * values: the row maximum (f32 max), the target logit (f32 sum; exactly one
 * rank contributes it), the sum of exp(z - max) (f64 sum). Writes each row's
 * max (mx) and sum of exps (se), kept for backward, and its loss (losses, 0
 * when ignored); *loss (host) is the mean over the counted rows, as
 * rf_op_xent_fwd without class weights. labels, mx, se, losses and the
 * logits are the backend's memory. Backward: dlogits (row stride ldd) += scale *
 * (softmax - onehot) / counted on the rank's columns; no communication. */
int rf_tp_xent_fwd(const rf_tp_group *g, float *loss, float *losses, float *mx, double *se,
                   const float *logits, int ldz, const int32_t *labels, const rf_tp_vocab *v,
                   int N);
int rf_tp_xent_bwd(const rf_tp_group *g, float *dlogits, int ldd, const float *logits, int ldz,
                   const float *mx, const double *se, const int32_t *labels, const rf_tp_vocab *v,
                   int N, float scale);

/* What the all-reduces of these ops cost so far in this process: wall
 * seconds inside them, bytes sent per rank by the ring model (2 (n-1)/n x the
 * buffer, as train.c counts), and calls. Not thread-safe (one trainer thread
 * calls the ops). */
void rf_tp_comm_stats(double *seconds, uint64_t *bytes, uint64_t *calls);

#endif
