/* GPT2LMHeadModel (Hugging Face) on contiguous buffers of a backend.
 *
 * Learned positions, pre-LayerNorm blocks, tanh GELU ("gelu_new"), Conv1D
 * weights kept in their [in, out] layout (rf_op_conv1d_*), and the LM head
 * tied to the token embedding: its gradient and the embedding's add into the
 * one wte gradient. All parameters live in one float block in the order of
 * the tensor table (HF names <-> offsets, as model.h's rf_tensor_info), the
 * gradients in a second block of the same layout, so the optimizer and ZeRO
 * code that works on flat blocks applies unchanged. Activations for a batch
 * capacity B x T are one arena, their gradients a second of the same layout.
 *
 * Trained through the model interface (model_iface.h: model_causal.c).
 * Parameters, gradients, moments, activations and the batch's device copies
 * live in the memory of m->be (backend.h; the CPU when none is given) and
 * forward and backward call its slots, so the CPU backend runs ops.h /
 * ops_causal.h as before, bit for bit, and trainer.device: cuda runs the
 * same graph on the GPU, LoRA adapters (lora.h) and the unit hook (ZeRO-2/3's
 * rebinding) included. Tensor parallelism works on host memory and runs on
 * the CPU backend only: refused (RF_ERR_UNSUPPORTED) on any other. No dropout
 * (fine-tuning runs and the parity fixtures use none). */
#ifndef RF_TR_GPT2_H
#define RF_TR_GPT2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/backend.h"     /* rf_backend */
#include "trainer/causal_io.h"   /* rf_causal_io */
#include "trainer/model.h"       /* rf_tensor_info */
#include "trainer/model_iface.h" /* rf_model_hook */
#include "trainer/ops_causal.h"  /* rf_causal_batch */

struct rf_lora; /* lora.h */

typedef struct rf_gpt2_config {
    int vocab_size, n_positions, n_embd, n_layer, n_head, n_inner;
    float layer_norm_epsilon;
} rf_gpt2_config;

/* config.json text -> config. Refuses activations other than the tanh GELU,
 * untied embeddings and n_embd not divisible by n_head. */
int rf_gpt2_config_parse(const char *text, size_t len, rf_gpt2_config *c);

typedef struct rf_gpt2_layer {
    float *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcp_w, *fcp_b;
} rf_gpt2_layer;

typedef struct rf_gpt2_params {
    float *wte, *wpe;
    rf_gpt2_layer *layers;
    float *lnf_w, *lnf_b;
} rf_gpt2_params;

/* Views of one layer's activations (or their gradients: same layout). */
typedef struct rf_gpt2_acts_layer {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fcg;
} rf_gpt2_acts_layer;

typedef struct rf_gpt2_acts {
    float **res; /* [n_layer + 1] residual stream: res[0] embeddings, res[l+1] after layer l */
    rf_gpt2_acts_layer *layers;
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *lse, *losses;
} rf_gpt2_acts;

typedef struct rf_gpt2 {
    rf_gpt2_config cfg;
    const rf_backend *be; /* owns params, grads, moments, acts, dacts, *_dev */
    rf_tensor_info *tensors;
    size_t ntensors, nparams;
    float *params, *grads; /* grads: NULL until rf_gpt2_enable_training */
    rf_gpt2_params p, g;

    int capB, capT;
    bool att_stats;      /* the backend keeps attention statistics, not probabilities */
    float *acts, *dacts; /* arenas of nacts and ngrads floats (dacts: one layer region,
                          * gpt2.c's layout); dacts allocated by enable_training */
    size_t nacts, ngrads;
    rf_gpt2_acts a, da;

    int B, T;        /* the last forward's batch, kept for backward */
    rf_causal_io io; /* the batch's inputs (one upload a forward), targets, sums */
    bool packed;     /* the last batch had seg */
    bool has_labels;
    float *logits; /* view into acts (backend memory): [B*T, vocab_size] of the last forward */
    float loss;    /* mean causal-LM loss of the last forward (0 without labels) */
    int counted;   /* tokens the loss counted */

    /* Training through the model interface (model_iface.h, model_causal.c). */
    float *mom1, *mom2; /* AdamW moments, nmoments floats each */
    size_t npadded;     /* floats in params and grads (>= nparams, zero tail) */
    size_t nmoments;
    bool training;           /* backward allowed (grads may be zero3.c's buffers) */
    rf_model_hook unit_hook; /* unit events (causal_units.h); NULL: none */
    void *unit_user;
    /* LoRA (lora.h; not owned, set by rf_lora_attach_gpt2): the projections go
     * through its adapters and the model's own parameters are frozen
     * (enable_training allocates no gradient block or moments: backward
     * computes input gradients only). */
    struct rf_lora *lora;
    /* Tensor parallelism (rf_gpt2_tp_split; model_tp.h): NULL for the whole
     * model. The vocabulary-parallel loss uses io.tgt and io.se. */
    struct rf_bert_tp *tp;
} rf_gpt2;

/* A model for cfg with every parameter zero, on the CPU backend; _on: on
 * backend be (NULL: the CPU). */
int rf_gpt2_new(const rf_gpt2_config *cfg, rf_gpt2 **out);
int rf_gpt2_new_on(const rf_gpt2_config *cfg, const rf_backend *be, rf_gpt2 **out);
void rf_gpt2_free(rf_gpt2 *m);
const rf_tensor_info *rf_gpt2_find(const rf_gpt2 *m, const char *name);
/* Loads an HF folder (config.json + model.safetensors). Names with or without
 * the "transformer." prefix are accepted; lm_head.weight, when present, is
 * the tied embedding and is not read. A missing tensor, shape mismatch or
 * non-float dtype is an error. _on: onto backend be (NULL: the CPU), each
 * tensor read into host memory then copied with to_device. */
int rf_gpt2_load(const char *dir, rf_gpt2 **out);
int rf_gpt2_load_on(const char *dir, const rf_backend *be, rf_gpt2 **out);

/* Allocates the gradient block and arena (zeroed). */
int rf_gpt2_enable_training(rf_gpt2 *m);
int rf_gpt2_zero_grad(rf_gpt2 *m);
/* Ensures activation capacity for B x T (T <= n_positions). */
int rf_gpt2_reserve(rf_gpt2 *m, int B, int T);

/* Forward over batch b (see rf_causal_batch; ids and labels must be below
 * vocab_size, positions below n_positions: RF_ERR_RANGE otherwise). Fills
 * m->logits, and m->loss / m->counted when b has labels. */
int rf_gpt2_forward(rf_gpt2 *m, const rf_causal_batch *b);
/* Backward of the last forward (which had labels); ADDS
 * loss_scale * d(loss)/d(param) into m->grads. */
int rf_gpt2_backward(rf_gpt2 *m, float loss_scale);

/* The model interface's pieces (model_iface.h; units: causal_units.h). The
 * range calls are forward/backward over units [u0, u1) with the residual
 * stream entering u0 in `in` / leaving u1-1 in `out` ([B, T, n_embd]) and
 * their gradients in din / dout; the full range is rf_gpt2_forward /
 * rf_gpt2_backward, bit for bit. */
int rf_gpt2_units(const rf_gpt2 *m);
void rf_gpt2_unit_range(const rf_gpt2 *m, int u, size_t *lo, size_t *hi);
void rf_gpt2_bind_unit(rf_gpt2 *m, int u, float *p, float *g);
void rf_gpt2_bind_all(rf_gpt2 *m);
int rf_gpt2_enable_training_sharded(rf_gpt2 *m, size_t padded, size_t moments);
void rf_gpt2_release_blocks(rf_gpt2 *m, bool params);
int rf_gpt2_adopt_params(rf_gpt2 *m, const float *host);
int rf_gpt2_forward_range(rf_gpt2 *m, const rf_causal_batch *b, int u0, int u1, const float *in,
                          float *out);
int rf_gpt2_backward_range(rf_gpt2 *m, float loss_scale, int u0, int u1, const float *dout,
                           float *din);
/* The unit events of a forward (and backward) over [u0, u1), computing nothing. */
int rf_gpt2_replay(rf_gpt2 *m, int u0, int u1, bool backward);

/* Tensor parallelism (issue 17, Megatron style; tp.h, model_tp.c): turns a
 * loaded whole model into this rank's shard for the tp group `tp`, as
 * rf_bert_tp_split (model.h) does for BERT: attention heads split (q, k, v
 * column-parallel by heads, the output projection row-parallel), the MLP's
 * up projection column-parallel and its down projection row-parallel, the
 * word embedding vocabulary-parallel (padding rows zero) with a
 * vocabulary-parallel cross-entropy, so no rank holds whole-vocabulary
 * logits; norms, the position embedding and the row-parallel biases replicated. m->tensors then
 * holds the local shapes and m->logits the rank's vocabulary columns [N, block]
 * (rf_tp_vocab_split). Forward and backward cost one all-reduce per attention block and per MLP
 * block each way, one for the embedding and three for the loss in forward.
 * Call before enabling training; the undo (the whole model back) is
 * rf_model_tp_merge. Any backend with tp.h's slots: dev as rf_bert_tp_split's
 * (the tp group's NCCL twin on a GPU's memory, borrowed; else NULL).
 * RF_ERR_INVALID when tp does not divide the heads or n_inner;
 * RF_ERR_UNSUPPORTED with LoRA attached or a backend without the slots. */
struct rf_comm;
int rf_gpt2_tp_split(rf_gpt2 *m, struct rf_comm *tp, struct rf_comm *dev);

#endif
