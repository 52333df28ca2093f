/* LlamaForCausalLM (Hugging Face) on contiguous buffers of a backend.
 *
 * RMSNorm, rotary positions (rotate_half convention, theta from the config),
 * SwiGLU MLP, grouped-query attention (num_key_value_heads dividing
 * num_attention_heads) and a tied or untied LM head. As in gpt2.h: one
 * parameter block in tensor-table order (HF names <-> offsets), a gradient
 * block of the same layout, one activation arena and its gradient twin. Within
 * a layer q_proj, k_proj and v_proj are adjacent and used as one fused
 * [(NH + 2 NKV) hd, C] nn.Linear projection, gate_proj and up_proj as one
 * [2F, C] projection (their HF names still map to the sub-ranges).
 *
 * Trained through the model interface (model_iface.h: model_causal.c), on
 * the memory and slots of m->be as gpt2.h describes; no dropout;
 * rope scaling variants (rope_type other than "default") and attention/MLP
 * biases are refused. */
#ifndef RF_TR_LLAMA_H
#define RF_TR_LLAMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/backend.h"     /* rf_backend */
#include "trainer/causal_io.h"   /* rf_causal_io */
#include "trainer/model.h"       /* rf_tensor_info */
#include "trainer/model_iface.h" /* rf_model_hook */
#include "trainer/ops_causal.h"  /* rf_causal_batch */

struct rf_lora; /* lora.h */

typedef struct rf_llama_config {
    int vocab_size, hidden_size, intermediate_size, num_hidden_layers;
    int num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings;
    float rms_norm_eps, rope_theta;
    bool tie_word_embeddings;
} rf_llama_config;

int rf_llama_config_parse(const char *text, size_t len, rf_llama_config *c);

typedef struct rf_llama_layer {
    float *ln1_w, *qkv_w, *o_w, *ln2_w, *gu_w, *down_w;
} rf_llama_layer;

typedef struct rf_llama_params {
    float *wte;
    rf_llama_layer *layers;
    float *norm_w, *head_w; /* head_w == wte when tied */
} rf_llama_params;

typedef struct rf_llama_acts_layer {
    float *ln1, *ln1_rstd, *qkv, *qkvr, *att, *atty, *res2, *ln2, *ln2_rstd, *gu, *act;
} rf_llama_acts_layer;

typedef struct rf_llama_acts {
    float **res; /* [layers + 1] residual stream */
    rf_llama_acts_layer *layers;
    float *lnf, *lnf_rstd, *logits, *lse, *losses;
} rf_llama_acts;

typedef struct rf_llama {
    rf_llama_config cfg;
    const rf_backend *be; /* owns params, grads, moments, acts, dacts, *_dev (as in gpt2.h) */
    rf_tensor_info *tensors;
    size_t ntensors, nparams;
    float *params, *grads;
    rf_llama_params p, g;
    int capB, capT;
    bool att_stats;      /* the backend keeps attention statistics, not probabilities */
    float *acts, *dacts; /* nacts and ngrads floats (dacts: one layer region, as gpt2.h) */
    size_t nacts, ngrads;
    rf_llama_acts a, da;
    int B, T;
    rf_causal_io io; /* the batch's inputs (one upload a forward), targets, sums */
    bool packed;     /* the last batch had seg */
    bool has_labels;
    float *logits, loss;
    int counted;

    /* Training through the model interface (as in gpt2.h). */
    float *mom1, *mom2;
    size_t npadded, nmoments;
    bool training;
    rf_model_hook unit_hook;
    void *unit_user;
    /* LoRA (lora.h; not owned, set by rf_lora_attach_llama): the projections go
     * through its adapters and the model's own parameters are frozen
     * (enable_training allocates no gradient block or moments: backward
     * computes input gradients only). */
    struct rf_lora *lora;
    /* Tensor parallelism (rf_llama_tp_split; model_tp.h): NULL for the whole
     * model. The vocabulary-parallel loss uses io.tgt and io.se. */
    struct rf_bert_tp *tp;
} rf_llama;

/* As rf_gpt2_new / rf_gpt2_new_on, rf_gpt2_load / rf_gpt2_load_on: the
 * model on the CPU, or on backend be (NULL: the CPU). Tensor parallelism
 * runs on the CPU backend only. */
int rf_llama_new(const rf_llama_config *cfg, rf_llama **out);
int rf_llama_new_on(const rf_llama_config *cfg, const rf_backend *be, rf_llama **out);
void rf_llama_free(rf_llama *m);
const rf_tensor_info *rf_llama_find(const rf_llama *m, const char *name);
/* config.json + model.safetensors; lm_head.weight is read unless tied. */
int rf_llama_load(const char *dir, rf_llama **out);
int rf_llama_load_on(const char *dir, const rf_backend *be, rf_llama **out);
int rf_llama_enable_training(rf_llama *m);
int rf_llama_zero_grad(rf_llama *m);
int rf_llama_reserve(rf_llama *m, int B, int T);
/* As rf_gpt2_forward / rf_gpt2_backward (positions bound RoPE only: any
 * value below max_position_embeddings). */
int rf_llama_forward(rf_llama *m, const rf_causal_batch *b);
int rf_llama_backward(rf_llama *m, float loss_scale);

/* The model interface's pieces, as rf_gpt2_* in gpt2.h (units:
 * causal_units.h; unit L+1 holds model.norm and an untied lm_head). */
int rf_llama_units(const rf_llama *m);
void rf_llama_unit_range(const rf_llama *m, int u, size_t *lo, size_t *hi);
void rf_llama_bind_unit(rf_llama *m, int u, float *p, float *g);
void rf_llama_bind_all(rf_llama *m);
int rf_llama_enable_training_sharded(rf_llama *m, size_t padded, size_t moments);
void rf_llama_release_blocks(rf_llama *m, bool params);
int rf_llama_adopt_params(rf_llama *m, const float *host);
int rf_llama_forward_range(rf_llama *m, const rf_causal_batch *b, int u0, int u1, const float *in,
                           float *out);
int rf_llama_backward_range(rf_llama *m, float loss_scale, int u0, int u1, const float *dout,
                            float *din);
int rf_llama_replay(rf_llama *m, int u0, int u1, bool backward);

/* Tensor parallelism (issue 17, Megatron style; tp.h, model_tp.c): turns a
 * loaded whole model into this rank's shard for the tp group `tp`, as
 * rf_bert_tp_split (model.h) does for BERT: attention heads split (q, k, v
 * column-parallel by heads, the output projection row-parallel), the MLP's
 * up and gate projection column-parallel and its down projection row-parallel, the
 * word embedding and an untied lm_head (both by vocabulary rows; a tied head reads the split
 * embedding) vocabulary-parallel (padding rows zero) with a vocabulary-parallel cross-entropy, so
 * no rank holds whole-vocabulary logits; norms replicated. m->tensors then holds the local shapes
 * and m->logits the rank's vocabulary columns [N, block] (rf_tp_vocab_split). Forward and backward
 * cost one all-reduce per attention block and per MLP block each way, one for the embedding and
 * three for the loss in forward. Call before enabling training; the undo (the whole model back) is
 * rf_model_tp_merge. RF_ERR_INVALID when tp does not divide num_key_value_heads,
 * num_attention_heads or intermediate_size; RF_ERR_UNSUPPORTED with LoRA attached or a backend
 * without tp.h's slots. dev as rf_bert_tp_split's (the tp group's NCCL twin on a GPU's memory,
 * borrowed; else NULL). */
struct rf_comm;
int rf_llama_tp_split(rf_llama *m, struct rf_comm *tp, struct rf_comm *dev);

#endif
