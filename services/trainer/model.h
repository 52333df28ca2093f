/* BertForSequenceClassification on contiguous buffers.
 *
 * All parameters live in one float block (params), in the order of the tensor
 * table; gradients and the two AdamW moments are blocks of the same size and
 * layout. The table maps each Hugging Face name to its offset. Within a layer,
 * query/key/value weights (and biases) are adjacent so they form one fused
 * [3C, C] projection. Activations for a batch capacity of B x T live in one
 * arena, their gradients in a second one. */
#ifndef RF_TR_MODEL_H
#define RF_TR_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/backend.h"
#include "trainer/bert_config.h"

typedef struct rf_tensor_info {
    char name[96]; /* Hugging Face name, e.g. "bert.encoder.layer.0.attention.self.query.weight" */
    size_t offset; /* in floats, into params/grads/m/v */
    size_t numel;
    int ndim;
    int shape[2];
    bool decay; /* AdamW weight decay applies (not biases, not LayerNorm) */
} rf_tensor_info;

/* Views of one layer's parameters (or gradients: same offsets). */
typedef struct rf_bert_layer {
    float *qkv_w, *qkv_b, *ao_w, *ao_b, *ln1_w, *ln1_b;
    float *fc_w, *fc_b, *fo_w, *fo_b, *ln2_w, *ln2_b;
} rf_bert_layer;

typedef struct rf_bert_params {
    float *wte, *wpe, *wtt, *eln_w, *eln_b;
    rf_bert_layer *layers;
    float *pool_w, *pool_b, *cls_w, *cls_b;
} rf_bert_params;

/* One batch: ids/types/valid are [B*T] (valid = attention mask), labels [B]
 * (-1 = no label). Positions are 0..T-1 as in Hugging Face. */
typedef struct rf_batch {
    int B, T;
    const int32_t *ids, *types, *labels;
    const uint8_t *valid;
} rf_batch;

/* Parameter units (ZeRO-3, like FSDP's flat-parameter units): unit 0 is the
 * embeddings (word, position, token type, LayerNorm), unit 1 + l is encoder
 * layer l, and unit num_layers + 1 the pooler and classifier. Each is a
 * contiguous range of the flat block (rf_bert_unit_range). */
typedef enum rf_unit_event {
    RF_UNIT_FWD,      /* forward is about to read the unit's parameters */
    RF_UNIT_BWD,      /* backward is about to read them and add into its gradients */
    RF_UNIT_BWD_DONE, /* the unit's gradients of this backward are complete */
    RF_UNIT_BWD_PART, /* a part of the unit's gradients is done, more comes later in this
                         backward (a tied head adding into unit 0's embedding; model_iface.h) */
} rf_unit_event;
struct rf_bert;
/* Called at each unit event when set (rf_bert.unit_hook). It may rebind the
 * unit's parameter/gradient views (rf_bert_bind_unit) to buffers of its own;
 * the arithmetic of forward/backward does not change. A non-zero return stops
 * rf_bert_forward with that error; in rf_bert_backward (void) the hook must
 * keep its error itself and later events should do nothing. */
typedef int (*rf_unit_hook)(void *user, struct rf_bert *m, int unit, rf_unit_event ev);

typedef struct rf_bert {
    rf_bert_config cfg;
    const rf_backend *be;
    rf_tensor_info *tensors;
    size_t ntensors;
    size_t nparams;
    float *params, *grads, *m, *v; /* grads/m/v allocated by rf_bert_enable_training */
    size_t npadded;      /* floats allocated for params and grads (>= nparams, tail zero) */
    size_t nmoments;     /* floats in m and v: nparams, or a ZeRO shard's */
    rf_bert_params p, g; /* views into params and grads */

    int capB, capT;      /* activation arena capacity */
    bool att_stats;      /* the backend keeps attention statistics, not probabilities */
    float *acts, *dacts; /* dacts: the gradients, two layer regions (model.c's layout) */
    size_t nacts;        /* floats in acts */
    /* the last batch on the backend, kept for backward: the pieces of in
     * (ids, types, valid, the [CLS] rows' indices b T, labels), sent with
     * one upload a forward */
    rf_inputs in;
    int32_t *labels_dev;
    int32_t *ids_dev, *types_dev, *cls_rows_dev;
    uint8_t *valid_dev;
    rf_batch last;
    float *class_weights_dev; /* [num_labels] loss weights, NULL = unweighted */

    float *logits, *probs; /* views into acts, [capB, num_labels] (backend memory) */
    float *losses;         /* view into acts, [capB]: each row's loss of the last forward */
    float loss;            /* mean (class-weighted, if set) loss of the last forward */
    bool last_train;       /* dropout state of the last forward, for backward */
    uint64_t last_seed;

    rf_unit_hook unit_hook; /* NULL: none (the views point into params/grads) */
    void *unit_user;

    struct rf_bert_tp *tp; /* tensor parallelism (rf_bert_tp_split); NULL: the whole model */
} rf_bert;

/* Allocates an uninitialised model for cfg (parameters zero). */
int rf_bert_new(const rf_bert_config *cfg, const rf_backend *be, rf_bert **out);
void rf_bert_free(rf_bert *m);
const rf_tensor_info *rf_bert_find(const rf_bert *m, const char *name);
/* Copies num_labels class weights for the training loss (forward and backward:
 * the weighted mean of rf_op_xent_fwd); NULL goes back to the plain mean. */
int rf_bert_set_class_weights(rf_bert *m, const float *w);

/* Number of parameter units (num_layers + 2) and unit u's range [lo, hi) of
 * the flat block. */
int rf_bert_units(const rf_bert *m);
void rf_bert_unit_range(const rf_bert *m, int unit, size_t *lo, size_t *hi);
/* Points unit u's parameter views (m->p) at p and its gradient views (m->g) at
 * g, each laid out like [lo, hi) of the flat block (p[0] is element lo); NULL
 * leaves that side as it is. rf_bert_bind_all rebinds every view into
 * m->params / m->grads (either may be NULL: that side is skipped). */
void rf_bert_bind_unit(rf_bert *m, int unit, float *p, float *g);
void rf_bert_bind_all(rf_bert *m);
/* ZeRO plumbing, so that zero3.c and train.c never allocate through the
 * backend themselves: rf_bert_release_blocks frees grads, m and v (and params
 * when `params`), leaving them NULL; rf_bert_adopt_params allocates m->params
 * if it is NULL, copies host[nparams] into it and rebinds the views. */
void rf_bert_release_blocks(rf_bert *m, bool params);
int rf_bert_adopt_params(rf_bert *m, const float *host);

/* Loads an HF folder: config.json + model.safetensors. Names with or without the
 * "bert." prefix are accepted (BertModel checkpoints such as MiniLM have none).
 * Missing pooler/classifier tensors are initialised like Hugging Face does
 * (normal(0, initializer_range), zero bias) from seed; any other missing tensor,
 * shape mismatch or non-float dtype is an error. num_labels > 0 replaces the
 * checkpoint's label count (and re-initialises the classifier). */
int rf_bert_load(const char *dir, int num_labels, uint64_t seed, const rf_backend *be,
                 rf_bert **out);
/* Re-initialises the classifier head (normal(0, initializer_range), bias 0). */
int rf_bert_init_head(rf_bert *m, uint64_t seed);
/* Writes model.safetensors with Hugging Face names (BertForSequenceClassification). */
int rf_bert_save_safetensors(const rf_bert *m, const char *path);

/* Allocates gradients and AdamW moments (zeroed). */
int rf_bert_enable_training(rf_bert *m);
/* The same for a data-parallel rank: params and grads get `padded` floats
 * (>= nparams; the zero tail lets reduce-scatter/all-gather work in place on
 * equal blocks; params move, so views are rebound: host backends only), m and
 * v `moments` floats (the rank's ZeRO shard, or nparams). */
int rf_bert_enable_training_sharded(rf_bert *m, size_t padded, size_t moments);
/* Ensures activation capacity for B x T. */
int rf_bert_reserve(rf_bert *m, int B, int T);

/* Forward pass; fills m->logits (and m->loss when labels are given). With
 * train=true dropout is active, its masks derived from dropout_seed. */
int rf_bert_forward(rf_bert *m, const rf_batch *batch, bool train, uint64_t dropout_seed);
/* Backward of the last forward; ADDS loss_scale * d(loss)/d(param) into grads. */
int rf_bert_backward(rf_bert *m, float loss_scale);
/* The same over the units [u0, u1) only (pipeline stages, model_iface.h): for
 * u0 > 0 forward reads the residual stream entering unit u0 from `in`, for
 * u1 < units it writes the one leaving unit u1 - 1 to `out` (and computes no
 * logits or loss); backward takes that boundary's gradient from `dout` and
 * writes the gradient of its input boundary to `din` (u0 > 0). Boundary u
 * holds rf_bert_boundary_floats(m, B, T, u) floats: [B, T, C], except before
 * the head ([B, 1, C]: the last layer computes the [CLS] rows only). The full
 * range is rf_bert_forward / rf_bert_backward, bit for bit. */
int rf_bert_forward_range(rf_bert *m, const rf_batch *batch, bool train, uint64_t dropout_seed,
                          int u0, int u1, const float *in, float *out);
int rf_bert_backward_range(rf_bert *m, float loss_scale, int u0, int u1, const float *dout,
                           float *din);
size_t rf_bert_boundary_floats(const rf_bert *m, int B, int T, int u);
int rf_bert_zero_grad(rf_bert *m);

/* ---- Tensor parallelism (issue 17, Megatron style; tp.h has the ops) ----
 *
 * rf_bert_tp_split turns a loaded whole model into this rank's shard for the
 * tp group `tp` (collective only in that every rank of the group must do the
 * same; nothing is sent): the attention heads are split (the fused QKV
 * column-parallel by heads, the output projection row-parallel), the MLP's
 * up projection column-parallel and its down projection row-parallel, the
 * word embeddings vocabulary-parallel (rf_tp_vocab_split, padding rows zero);
 * LayerNorms, position and type embeddings, the row-parallel biases, the
 * pooler and the classifier are replicated. Afterwards m->tensors has the
 * same names in the same order with the LOCAL shapes, and params (and the
 * grads/moments of rf_bert_enable_training*) are this rank's block; forward
 * and backward run the tp ops (one all-reduce per attention block and per
 * MLP block each way, one for the embedding in forward) and give every rank
 * the replicated activations, logits and loss of the whole model. Replicated
 * parameters get the same gradient on every tp rank. Dropout is independent
 * of the split: replicated tensors use the same masks on every rank (callers
 * pass the same seed) and attention masks are per global head.
 * Any backend with tensor parallelism's slots (backend.h: linear_ld_*,
 * embed_rows_*, embed_add_fwd): the shard is the backend's memory, cut on
 * the host through to_host/to_device. `dev` carries the ops' all-reduces
 * when the backend's memory is a GPU's (be->device_memory): the tp group's
 * NCCL twin (rf_comm_dup_mem), borrowed, alive as long as the split; NULL
 * otherwise (tp carries them). Call before rf_bert_enable_training. tp of
 * one rank is allowed (the tp code path on a whole model). RF_ERR_INVALID
 * when the heads or the intermediate size do not divide by the group size
 * or a device-memory backend has no `dev`; RF_ERR_UNSUPPORTED for a backend
 * without the slots or with training buffers. */
struct rf_comm;
int rf_bert_tp_split(rf_bert *m, struct rf_comm *tp, struct rf_comm *dev);

/* Where a tp rank's block sits in the whole model's flat block: each span is
 * n floats at `local` in this rank's block and at `global` in the whole one
 * (offsets of the whole model's tensor table, in table order); a
 * row-parallel weight is one span per row. `replicated` spans are held by
 * every tp rank (the same values), the others by this rank alone. Vocabulary
 * padding rows are in no span. Returns the span count (0, spans NULL,
 * without tp). */
typedef struct rf_tp_span {
    size_t global, local, n;
    bool replicated;
} rf_tp_span;
size_t rf_bert_tp_spans(const rf_bert *m, const rf_tp_span **spans);
/* The whole model's parameter count and tensor table (m->nparams and
 * m->tensors without tp). */
size_t rf_bert_tp_global_nparams(const rf_bert *m);
/* The spans of tp rank r of m's group (what rf_bert_tp_spans gives on that
 * rank; *spans is the caller's to free). */
int rf_bert_tp_spans_of(const rf_bert *m, int r, rf_tp_span **spans, size_t *n);
/* Undoes the split: m becomes the whole model again with the parameters
 * full[rf_bert_tp_global_nparams(m)] (host memory, copied to the model's
 * backend), the whole tensor table and no tp context. The training blocks
 * must be released. */
int rf_bert_tp_merge(rf_bert *m, const float *full);
const rf_tensor_info *rf_bert_tp_global_tensors(const rf_bert *m, size_t *n);

#endif
