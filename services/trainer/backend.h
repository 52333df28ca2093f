/* The kernel table the model runs on: the only way to touch model memory.
 *
 * The CPU backend (backend_cpu.c) points at ops.h; the CUDA backend
 * (services/trainer/cuda/, built with make CUDA=1) supplies device twins with
 * the same semantics and its own allocation, so model.c, optim.c and the
 * evaluator never name a device. Buffers are plain pointers into the backend's
 * memory: parameters, gradients and moments are each one contiguous block,
 * which is what ZeRO-style sharding slices later. Host code reads or writes
 * them only through to_host/to_device (checkpoints, export, logging).
 *
 * Every slot takes the backend itself first (its ctx holds the device state:
 * for CUDA the stream and the cuBLAS handle, nothing static) and returns RF_OK
 * or a negative rf_err with rf_fail detail. Slots may run asynchronously on
 * the device; to_host and any slot that writes a host pointer (xent_fwd's
 * loss, sumsq) wait for the work queued before them. Backward slots ACCUMULATE
 * into the gradients they produce, as ops.h describes. */
#ifndef RF_TR_BACKEND_H
#define RF_TR_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rf_backend rf_backend;
struct rf_qweight; /* quant.h */

/* One tensor's part of the parameter block, for AdamW's weight-decay flag. */
typedef struct rf_param_span {
    size_t offset, numel; /* in floats */
    bool decay;
} rf_param_span;

/* One AdamW update (torch.optim.AdamW, decoupled weight decay). */
typedef struct rf_adamw_hp {
    float lr, beta1, beta2, eps, weight_decay;
    long step; /* 0-based; bias correction uses step + 1 */
    /* Clipping inside the update: with sumsq set, every gradient is used
     * times rf_clip_coef(*sumsq, clip_norm) (ops.h; 1 when clip_norm <= 0 or
     * the norm is within it), *sumsq read in backend memory where the work
     * queued before (sumsq_into) left it, so the coefficient never goes
     * through the host. NULL: the gradients as they are. */
    const double *sumsq;
    float clip_norm;
} rf_adamw_hp;

struct rf_backend {
    const char *name; /* "cpu", "cpu-staged", "cpu-guarded", "cuda", "cuda-bf16" */
    void *ctx;        /* backend state; NULL for the CPU */
    /* Where alloc's buffers live: true for GPU memory, which the collectives
     * of data parallelism (comm.h) then take as RF_COMM_DEVICE (NCCL); false
     * for host memory (RF_COMM_HOST: MPI). */
    bool device_memory;
    /* The queue the slots run on, in order (CUDA: the cudaStream_t); NULL
     * for the CPU and its test devices. A device group ordered after it
     * (comm.h's rf_comm_order_after) reads what the slots queued before a
     * collective without a host wait for them. */
    void *queue;

    /* memory */
    int (*alloc)(const rf_backend *be, void **out, size_t bytes); /* zeroed */
    int (*free)(const rf_backend *be, void *p);                   /* NULL is a no-op */
    int (*zero)(const rf_backend *be, void *p, size_t bytes);
    int (*to_host)(const rf_backend *be, void *dst, const void *src, size_t bytes);
    int (*to_device)(const rf_backend *be, void *dst, const void *src, size_t bytes);
    int (*copy)(const rf_backend *be, void *dst, const void *src, size_t bytes); /* on device */
    /* rows of width bytes, row r from src + r * spitch to dst + r * dpitch, on
     * the device (a column block of a row-major matrix in one call) */
    int (*copy2d)(const rf_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch,
                  size_t width, size_t rows);

    /* the encoder (semantics: ops.h) */
    int (*embed_fwd)(const rf_backend *be, float *out, const int32_t *ids, const int32_t *types,
                     const float *wte, const float *wpe, const float *wtt, int B, int T, int C);
    int (*embed_bwd)(const rf_backend *be, float *dwte, float *dwpe, float *dwtt, const float *dout,
                     const int32_t *ids, const int32_t *types, int B, int T, int C, int V, int TV);
    int (*layernorm_fwd)(const rf_backend *be, float *out, float *mean, float *rstd,
                         const float *inp, const float *w, const float *b, int N, int C, float eps);
    int (*layernorm_bwd)(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, const float *mean, const float *rstd,
                         int N, int C);
    int (*linear_fwd)(const rf_backend *be, float *out, const float *inp, const float *w,
                      const float *b, int N, int IC, int OC);
    int (*linear_bwd)(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                      const float *inp, const float *w, int N, int IC, int OC);
    /* rf_op_attention_heads_fwd/bwd: heads [h0, h0 + NH) of NHall (h0 = 0,
     * NHall = NH: the whole layer; a tensor-parallel shard otherwise). att
     * NULL: the probabilities are not kept; out NULL: the probabilities
     * only (not both). With dropout, the backward reads the
     * dropped probabilities the forward of the same arguments left in
     * scratch. A backend may make att, when out is NULL, room for what its
     * backward reads instead (cuda-bf16's fused backward: each row's
     * log-sum-exp), so a backward follows the forward of the same
     * arguments with att and scratch untouched between; the backward also
     * gets that forward's output out ([B*Tq, C]) and the mask, which the
     * CPU's does not read. */
    int (*attention_fwd)(const rf_backend *be, float *out, float *att, float *scratch,
                         const float *qkv, const uint8_t *valid, int B, int T, int Tq, int C,
                         int NH, int h0, int NHall, float pdrop, uint64_t seed);
    int (*attention_bwd)(const rf_backend *be, float *dqkv, float *scratch, const float *dout,
                         const float *qkv, const float *att, const float *out, const uint8_t *valid,
                         int B, int T, int Tq, int C, int NH, int h0, int NHall, float pdrop,
                         uint64_t seed);
    int (*gelu_fwd)(const rf_backend *be, float *out, const float *inp, size_t n);
    int (*gelu_bwd)(const rf_backend *be, float *dinp, const float *inp, const float *dout,
                    size_t n);
    int (*tanh_fwd)(const rf_backend *be, float *out, const float *inp, size_t n);
    int (*tanh_bwd)(const rf_backend *be, float *dinp, const float *out, const float *dout,
                    size_t n);
    int (*dropout_fwd)(const rf_backend *be, float *out, const float *inp, size_t n, float p,
                       uint64_t seed);
    int (*dropout_bwd)(const rf_backend *be, float *dinp, const float *dout, size_t n, float p,
                       uint64_t seed);
    int (*residual_fwd)(const rf_backend *be, float *out, const float *a, const float *b, size_t n,
                        float p, uint64_t seed);
    int (*residual_bwd)(const rf_backend *be, float *da, float *db, const float *dout, size_t n,
                        float p, uint64_t seed);
    /* *loss (host) = the mean loss of rf_op_xent_fwd; weights: NULL or K class
     * weights on the device. labels are device memory. */
    int (*xent_fwd)(const rf_backend *be, float *loss, float *probs, float *losses,
                    const float *logits, const int32_t *labels, const float *weights, int B, int K);
    int (*xent_bwd)(const rf_backend *be, float *dlogits, const float *probs, const int32_t *labels,
                    const float *weights, int B, int K, float scale);

    /* tensor parallelism's kernels (semantics: rf_op_linear_ld_*,
     * rf_op_embed_rows_* / rf_op_embed_add_fwd and rf_op_vxent_* in ops.h;
     * tp.h composes them with the tp group's all-reduces). ids, pos, types
     * and tgt are device memory, se too (doubles); vxent_loss writes the
     * mean loss to the host, like xent_fwd. NULL slots: the backend cannot
     * run a tp shard (refused at the split, naming the slot). */
    int (*linear_ld_fwd)(const rf_backend *be, float *out, int ldo, const float *inp, int ldi,
                         const float *w, int ldw, const float *b, int N, int IC, int OC);
    int (*linear_ld_bwd)(const rf_backend *be, float *dinp, int lddi, float *dw, int lddw,
                         float *db, const float *dout, int ldd, const float *inp, int ldi,
                         const float *w, int ldw, int N, int IC, int OC);
    int (*embed_rows_fwd)(const rf_backend *be, float *out, const int32_t *ids, const float *w,
                          int lo, int hi, int N, int C);
    int (*embed_add_fwd)(const rf_backend *be, float *out, const int32_t *pos, const int32_t *types,
                         const float *wpe, const float *wtt, int B, int T, int C);
    int (*embed_rows_bwd)(const rf_backend *be, float *dw, float *dwpe, float *dwtt,
                          const float *dout, const int32_t *ids, const int32_t *types, int lo,
                          int hi, int B, int T, int C);
    int (*vxent_stats)(const rf_backend *be, float *mx, float *tl, const float *logits, int ldz,
                       const int32_t *tgt, int lo, int hi, int N);
    int (*vxent_sumexp)(const rf_backend *be, double *se, const float *logits, int ldz,
                        const float *mx, int lo, int hi, int N);
    int (*vxent_loss)(const rf_backend *be, float *loss, float *losses, const float *mx,
                      const double *se, const int32_t *tgt, int N);
    int (*vxent_bwd)(const rf_backend *be, float *dlogits, int ldd, const float *logits, int ldz,
                     const float *mx, const double *se, const int32_t *tgt, int lo, int hi, int N,
                     float scale);

    /* evaluation: pred[b] = argmax of logits row b (first maximum), probs (may
     * be NULL) its softmax, computed as rf_op_softmax_argmax; device memory */
    int (*softmax_argmax)(const rf_backend *be, int32_t *pred, float *probs, const float *logits,
                          int B, int K);

    /* the causal language models, GPT-2 and Llama (semantics: ops_causal.h).
     * ids, pos, labels, valid and seg are device memory. tokpos_bwd also takes
     * V and P, the rows of wte and wpe (a device sums each row's gradient in
     * a fixed order without atomics, as embed_bwd does; the CPU ignores
     * them). causal_xent_fwd writes the mean loss and the counted rows to the
     * host (*loss, *counted; counted may be NULL), like xent_fwd. */
    int (*tokpos_fwd)(const rf_backend *be, float *out, const int32_t *ids, const int32_t *pos,
                      const float *wte, const float *wpe, int B, int T, int C);
    int (*tokpos_bwd)(const rf_backend *be, float *dwte, float *dwpe, const float *dout,
                      const int32_t *ids, const int32_t *pos, int B, int T, int C, int V, int P);
    int (*conv1d_fwd)(const rf_backend *be, float *out, const float *inp, const float *w,
                      const float *b, int N, int IC, int OC);
    int (*conv1d_bwd)(const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
                      const float *inp, const float *w, int N, int IC, int OC);
    int (*rmsnorm_fwd)(const rf_backend *be, float *out, float *rstd, const float *inp,
                       const float *w, int N, int C, float eps);
    int (*rmsnorm_bwd)(const rf_backend *be, float *dinp, float *dw, const float *dout,
                       const float *inp, const float *w, const float *rstd, int N, int C);
    int (*rope_fwd)(const rf_backend *be, float *out, const float *inp, const int32_t *pos, int N,
                    int T, int nh, int hs, int stride, float theta);
    int (*rope_bwd)(const rf_backend *be, float *dinp, const float *dout, const int32_t *pos, int N,
                    int T, int nh, int hs, int stride, float theta);
    int (*swiglu_fwd)(const rf_backend *be, float *out, const float *gu, int N, int F);
    int (*swiglu_bwd)(const rf_backend *be, float *dgu, const float *dout, const float *gu, int N,
                      int F);
    int (*gelu_tanh_fwd)(const rf_backend *be, float *out, const float *inp, size_t n);
    int (*gelu_tanh_bwd)(const rf_backend *be, float *dinp, const float *inp, const float *dout,
                         size_t n);
    /* rf_op_causal_attention_fwd/bwd. out NULL: the probabilities into att
     * (the backward's recompute, which the backward reads; a backend may
     * leave there what its backward reads instead: cuda-bf16's fused one,
     * each row's log-sum-exp). With out, att is room the slot may use, its
     * contents unspecified afterwards (the CPU writes the probabilities
     * there, cuda-bf16's fused forward leaves it untouched): a backward must
     * follow a recompute. The backward also gets the forward's output out
     * and the masks (valid, seg as the forward's), which the CPU does not
     * read. */
    int (*causal_attention_fwd)(const rf_backend *be, float *out, float *att, const float *qkv,
                                const uint8_t *valid, const int32_t *seg, int B, int T, int NH,
                                int NKV, int hs);
    int (*causal_attention_bwd)(const rf_backend *be, float *dqkv, float *scratch,
                                const float *dout, const float *qkv, const float *att,
                                const float *out, const uint8_t *valid, const int32_t *seg, int B,
                                int T, int NH, int NKV, int hs);
    /* *stats = whether, for head size hs, both attentions' slots keep each
     * query row's statistics in att instead of its probabilities, and the
     * encoder's needs no more scratch, so that att and scratch of B NH Tq
     * floats suffice where the models would take B NH Tq T (cuda-bf16's
     * fused kernels). NULL: the probabilities (the CPU). */
    int (*attention_stats)(const rf_backend *be, int hs, bool *stats);
    int (*lm_head_fwd)(const rf_backend *be, float *logits, const float *h, const float *wte, int N,
                       int C, int V);
    /* inference (causal_infer.c): n new tokens over a key/value cache,
     * semantics rf_op_kv_attention_fwd; NULL: the backend cannot generate */
    int (*kv_attention_fwd)(const rf_backend *be, float *out, float *scores, const float *qkv,
                            const float *kc, const float *vc, int n, int len, int NH, int NKV,
                            int hd);
    int (*lm_head_bwd)(const rf_backend *be, float *dh, float *dwte, const float *dlogits,
                       const float *h, const float *wte, int N, int C, int V);
    int (*causal_xent_fwd)(const rf_backend *be, float *loss, int *counted, float *lse,
                           float *losses, const float *logits, const int32_t *labels, int B, int T,
                           int V);
    int (*causal_xent_bwd)(const rf_backend *be, float *dlogits, const float *logits,
                           const float *lse, const int32_t *labels, int B, int T, int V,
                           float scale);

    /* LoRA and its frozen bases (lora.h, quant.h). lora_fwd / lora_bwd: one
     * adapter, semantics rf_op_lora_fwd / rf_op_lora_bwd (dropout masks as
     * dropout_fwd's; u, du, xd are scratch of the backend's memory, xd may be
     * NULL when p == 0). qlinear_fwd / qlinear_bwd: a quantized frozen
     * weight, semantics rf_op_qlinear_fwd / rf_op_qlinear_bwd; w is a host
     * descriptor whose arrays (q, scale, qabsmax) are the backend's memory
     * (to_device'd once at attach: lora.c). NULL slots: the backend cannot
     * train adapters (refused at attach, naming the slot). */
    int (*lora_fwd)(const rf_backend *be, float *out, int ldo, float *u, float *xd, const float *x,
                    const float *A, const float *B, int N, int IC, int OC, int r, float scale,
                    float p, uint64_t seed);
    int (*lora_bwd)(const rf_backend *be, float *dx, float *dA, float *dB, float *du, float *xd,
                    const float *dout, int ldo, const float *x, const float *u, const float *A,
                    const float *B, int N, int IC, int OC, int r, float scale, float p,
                    uint64_t seed);
    int (*qlinear_fwd)(const rf_backend *be, float *out, int ldo, const float *inp,
                       const struct rf_qweight *w, const float *b, int N);
    int (*qlinear_bwd)(const rf_backend *be, float *dinp, const float *dout, int ldo,
                       const struct rf_qweight *w, int N);

    /* the optimizer (semantics: rf_op_sumsq, rf_op_scale, rf_op_adamw in ops.h) */
    int (*sumsq)(const rf_backend *be, double *out, const float *x, size_t n); /* *out on host */
    /* The sum of squares over spans of x (offset and numel; decay unused):
     * the spans' rf_op_sumsq added in order, into *out on the host, with one
     * wait for the device however many spans (the sharded meshes' gradient
     * norm, which counts some pieces of a buffer and not others). */
    int (*sumsq_spans)(const rf_backend *be, double *out, const float *x,
                       const rf_param_span *spans, size_t nspans);
    /* sumsq_spans' sum into *dst, one double of backend memory: queued like
     * any slot, no wait (adamw's hp->sumsq reads it, a device group can
     * all-reduce it; to_host brings it back). On a device, a span table
     * other than the previous call's costs one wait to upload it. */
    int (*sumsq_into)(const rf_backend *be, double *dst, const float *x, const rf_param_span *spans,
                      size_t nspans);
    int (*scale)(const rf_backend *be, float *x, size_t n, float s);
    int (*adamw)(const rf_backend *be, float *params, const float *grads, float *mom1, float *mom2,
                 size_t lo, size_t hi, const rf_param_span *spans, size_t nspans,
                 const rf_adamw_hp *hp);
};

/* The CPU backend (host memory, ops.c); always available. */
const rf_backend *rf_backend_cpu(void);
/* A TEST device, "cpu-staged": the CPU backend's kernels and host memory
 * under an identity of its own, so that every path written for a device
 * backend (be != rf_backend_cpu(): buffers from be->alloc, host reads and
 * writes through to_host/to_device) runs on a machine without a GPU, while
 * device_memory stays false and MPI carries its collectives. Its results are
 * the CPU's bit for bit; it exists to test the device paths, not to train. */
const rf_backend *rf_backend_cpu_staged(void);
/* A second TEST device, "cpu-guarded": cpu-staged whose buffers are mapped
 * PROT_NONE except while one of its own slots or a collective on a host group
 * runs (comm.h's access hooks, which it sets), so that host code reading or
 * writing model memory other than through to_host/to_device dies at the
 * access with a message naming it (backend_guarded.c). Results are the CPU's
 * bit for bit. */
const rf_backend *rf_backend_cpu_guarded(void);
/* Threads of the CPU backend's kernels (OpenMP and OpenBLAS); n < 1 is 1. */
void rf_backend_cpu_set_threads(int n);

/* The backend of a device name: NULL, "" or "cpu" is the CPU, "cpu-staged"
 * and "cpu-guarded" the test devices above; "cuda" is the process's CUDA device (the local
 * rank's: cuda/backend_cuda.h) in fp32, "cuda-bf16" the same with its matrix products on
 * bf16 tensor cores (fp32 accumulation and storage: see
 * cuda/backend_cuda.h), each created on first use and kept for the process.
 * They fail with RF_ERR_UNSUPPORTED and a message saying why when this build
 * has no CUDA (make CUDA=1) or the machine has no usable GPU; any other name
 * is RF_ERR_INVALID. */
int rf_backend_for(const char *device, const rf_backend **out);
/* The same checks without creating anything (spec validation). */
int rf_device_check(const char *device);

/* be->alloc of bytes (zeroed; 1 byte for 0), or NULL with be's error in
 * rf_errmsg. The one helper the models, the adapters and ZeRO-3 allocate
 * backend memory through. */
void *rf_backend_alloc(const rf_backend *be, size_t bytes);
/* be->free of p; NULL is ignored, as free(3). */
void rf_backend_free(const rf_backend *be, void *p);
/* be->attention_stats, false where the slot is NULL: whether the models'
 * attention buffers (att and its scratch) need B NH Tq floats, or B NH Tq T. */
int rf_backend_attention_stats(const rf_backend *be, int hs, bool *stats);
/* A model's per-batch inputs (ids, types, positions, masks, labels) as the
 * pieces of one host buffer and of one backend block laid out alike, each
 * piece 16-byte aligned, so a batch reaches the backend with one to_device:
 * on a GPU one host wait a micro-batch instead of one a piece. */
#define RF_INPUTS_MAX 8
typedef struct rf_inputs {
    unsigned char *host;           /* malloc'd; owned */
    unsigned char *dev;            /* backend memory; owned */
    size_t off[RF_INPUTS_MAX + 1]; /* piece i is [off[i], off[i] + size_i); off[n] the end */
    int n;
} rf_inputs;
/* Replaces *in (freeing its blocks) with n pieces of sizes[i] bytes; on
 * failure (RF_ERR_NOMEM, or RF_ERR_INVALID for n outside [1, RF_INPUTS_MAX])
 * *in is unchanged. */
int rf_inputs_alloc(rf_inputs *in, const rf_backend *be, int n, const size_t *sizes);
/* Piece i in the host buffer and in the backend block. */
void *rf_inputs_host(const rf_inputs *in, int i);
void *rf_inputs_dev(const rf_inputs *in, int i);
/* The host buffer's pieces [0, k) to the backend block, in one to_device. */
int rf_inputs_send(const rf_inputs *in, const rf_backend *be, int k);
/* Frees both blocks; *in is then empty (a second call is a no-op). */
void rf_inputs_free(rf_inputs *in, const rf_backend *be);
/* RF_OK when be is the CPU backend, else RF_ERR_UNSUPPORTED: "<who>: <what>
 * runs on the CPU backend only (trainer.device: cpu)". */
int rf_backend_need_cpu(const rf_backend *be, const char *who, const char *what);
/* One slot a model calls, by name, and whether be leaves it NULL. */
typedef struct rf_backend_slot {
    const char *name;
    bool missing;
} rf_backend_slot;
/* RF_OK when none of the n slots is missing, else RF_ERR_UNSUPPORTED naming
 * the first ("<who>: the <be> backend has no '<slot>' kernel ..."). */
int rf_backend_check_slots(const rf_backend *be, const char *who, const rf_backend_slot *s,
                           size_t n);

#endif
