/* rf_model: the one interface through which the training loop (train.c),
 * ZeRO (zero3.c), checkpoints, the driver and the export use a model. Three
 * models implement it: the BERT classifier (model.h, model_bert.c), GPT-2
 * (gpt2.h) and Llama (llama.h), the last two in model_causal.c.
 *
 * Style of SQLite's VFS: an rf_model is a small public struct whose first
 * member points at a table of methods (rf_model_ops); every slot returns an
 * rf_err (RF_OK or negative, with rf_fail detail), RF_ERR_UNSUPPORTED where a
 * model has no such thing (class weights on a causal LM). Callers use the
 * rf_model_* functions below, which check and dispatch.
 *
 * What every model shares (the llm.c layout, see model.h):
 *   - one tensor table (Hugging Face names <-> offsets into the flat blocks);
 *   - four flat float blocks of the same layout: params, grads and the two
 *     AdamW moments (rf_model_blocks), so the optimizer, the checkpoints and
 *     ZeRO work on ranges of floats and never on a model's own structs;
 *   - parameter UNITS: contiguous ranges of the flat block, in forward order
 *     (unit 0 the embeddings, 1..L the transformer layers, L+1 the head).
 *     ZeRO-3 shards and gathers per unit; pipeline parallelism (issue 17) cuts
 *     the model between units.
 *
 * Pipeline split points. forward and backward run over a RANGE of units
 * [u0, u1). Between units the activations are one tensor, the residual
 * stream entering unit u ("boundary u", 1 <= u < units): [B, T, C] floats
 * (rf_model_boundary gives its size; BERT's boundary before the head is
 * [B, 1, C], the [CLS] rows). A range with u0 > 0 reads its input boundary
 * from `in`, one with u1 < units writes its output boundary to `out` and
 * computes no logits or loss; backward takes the gradient of the output
 * boundary in `dout` and writes that of the input boundary to `din`. Running
 * [0, b) then [b, units) forward, and [b, units) then [0, b) backward, with
 * the boundary copied between them (also between two model instances that
 * share one gradient block) is bitwise the whole model
 * (tests/trainer/test_model_iface.c). A stage keeps the activations of its
 * last forward in its own arena (one micro-batch in flight per instance).
 *
 * Tied heads. GPT-2 and tied Llama models compute the LM head with unit 0's
 * word embedding. Their head therefore raises events for unit 0 as well (see
 * the hook below): forward reads unit 0 again after unit units-1, backward
 * adds the head's part of the embedding gradient first (RF_UNIT_BWD_PART) and
 * the embedding's own part at the end (RF_UNIT_BWD_DONE). rf_model_info.tied
 * says so. A pipeline stage that holds the head but not unit 0 needs its own
 * copy of that tensor and the sum of the two gradients (Megatron's embedding
 * group); nothing else in the causal models crosses a boundary.
 *
 * The batch (rf_model_batch) carries both kinds of labels: a classifier takes
 * one label per sequence, a causal LM Hugging Face's unshifted per-token
 * labels (-100 ignored), optional per-row positions and per-document segment
 * ids for packed sequences (ops_causal.h).
 *
 * Ownership: rf_model_load and rf_model_sibling return a heap rf_model that
 * owns its implementation (rf_model_free frees both); rf_model_init_* fill a
 * caller's rf_model around an implementation the caller keeps owning (the
 * compatibility entry points rf_train(rf_bert *) etc. use it). */
#ifndef RF_TR_MODEL_IFACE_H
#define RF_TR_MODEL_IFACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "trainer/backend.h"
#include "trainer/model.h" /* rf_tensor_info, rf_unit_event, rf_bert */

struct rf_gpt2;
struct rf_llama;

typedef enum rf_model_task {
    RF_TASK_CLASSIFY,  /* sequence classification: one label per sequence */
    RF_TASK_CAUSAL_LM, /* next-token prediction: per-token labels */
} rf_model_task;

typedef struct rf_model_info {
    const char *arch; /* "bert", "gpt2", "llama" (config.json's model_type) */
    rf_model_task task;
    int units; /* parameter units (see above) */
    int layers, hidden, vocab, max_positions;
    int num_labels;   /* classify: classes; causal LM: 0 */
    int eos_token_id; /* config.json's eos_token_id, -1 when absent (causal LM) */
    bool tied;        /* the head reads unit 0's word embedding */
} rf_model_info;

/* The flat blocks (see model.h's "Memory layout"), in backend memory. They
 * move: read them again after enable_training, release_blocks, adopt_params
 * or bind calls. grads/m/v are NULL until training is enabled (and at ZeRO 2/3,
 * where zero3.c holds shards instead). */
typedef struct rf_model_blocks {
    const rf_backend *be;
    const rf_tensor_info *tensors;
    size_t ntensors;
    size_t nparams;  /* floats of the model */
    size_t npadded;  /* floats allocated for params and grads (>= nparams, zero tail) */
    size_t nmoments; /* floats in m and v: nparams, or a ZeRO shard's */
    float *params, *grads, *m, *v;
} rf_model_blocks;

/* One batch of B rows of T tokens (host memory, row-major [B*T] unless said). */
typedef struct rf_model_batch {
    int B, T;
    const int32_t *ids;
    const uint8_t *valid;  /* attention mask (right padding); NULL: all valid (causal LM) */
    const int32_t *labels; /* classify: [B], -1 = none; causal LM: [B*T] unshifted,
                              -100 ignored; NULL: no loss */
    const int32_t *types;  /* classify: token types (required); causal LM: unused */
    const int32_t *pos;    /* causal LM: per-row positions (NULL: 0..T-1) */
    const int32_t *seg;    /* causal LM: document of each token in a packed row (NULL: one) */
} rf_model_batch;

/* Unit events (see rf_unit_event): `next` is the unit of the next event of the
 * same pass in this range, -1 when none (a prefetch hint: zero3.c gathers it
 * while the current unit computes). The hook may rebind the unit's views
 * (rf_model_bind_unit). A non-zero return stops forward/backward with that
 * error. */
typedef int (*rf_model_hook)(void *user, int unit, rf_unit_event ev, int next);

typedef struct rf_model rf_model;

typedef struct rf_model_ops {
    const char *name;
    int (*close)(rf_model *m); /* frees the implementation */
    int (*info)(const rf_model *m, rf_model_info *out);
    int (*blocks)(const rf_model *m, rf_model_blocks *out);
    int (*unit_range)(const rf_model *m, int unit, size_t *lo, size_t *hi);
    /* Points unit u's parameter views at p and its gradient views at g (each
     * laid out like [lo, hi) of the flat block; NULL leaves that side); unit
     * -1 rebinds every view into the model's own blocks. */
    int (*bind_unit)(rf_model *m, int unit, float *p, float *g);
    /* Frees grads, m, v (and params when `params`); NULL afterwards. */
    int (*release_blocks)(rf_model *m, bool params);
    /* Allocates params if needed, copies host[nparams] into it, rebinds. */
    int (*adopt_params)(rf_model *m, const float *host);
    /* Allocates grads (padded floats, zero tail; params move to the same
     * size) and the moments (`moments` floats each). Idempotent. */
    int (*enable_training)(rf_model *m, size_t padded, size_t moments);
    int (*zero_grad)(rf_model *m);
    /* num_labels weights for the training loss, NULL: the plain mean. */
    int (*set_class_weights)(rf_model *m, const float *w);
    /* Installs m->hook (or removes it when NULL) in the implementation. */
    int (*set_hook)(rf_model *m);
    /* Raises, without computing, the hook events that forward (and then
     * backward, when `backward`) over [u0, u1) raise, in the same order: a
     * data-parallel rank without rows joins its group's collectives so. */
    int (*replay)(rf_model *m, int u0, int u1, bool backward);
    int (*boundary)(const rf_model *m, int B, int T, int unit, size_t *floats);
    int (*forward)(rf_model *m, const rf_model_batch *b, int u0, int u1, const float *in,
                   float *out, bool train, uint64_t seed);
    /* ADDS loss_scale * d(loss)/d(param) into the gradients of [u0, u1). */
    int (*backward)(rf_model *m, int u0, int u1, const float *dout, float *din, float loss_scale);
    /* The last full forward's mean loss and the labels it counted (labelled
     * rows, or predicted tokens). */
    int (*loss)(const rf_model *m, float *loss, long *counted);
    /* The last full forward's logits (backend memory): [B, num_labels] or
     * [B*T, vocab]; *row = floats per row. */
    int (*logits)(const rf_model *m, const float **logits, size_t *row);
    /* Writes dir/config.json (the architecture's, loadable by transformers)
     * and dir/model.safetensors (HF names, F32). dir exists. */
    int (*save)(const rf_model *m, const char *dir);
    /* A new instance of the same architecture and shape (a tensor-parallel
     * shard is split the same way, over the same group), parameters zero, no
     * training blocks, its own activation arenas: a pipeline stage keeps one
     * per micro-batch in flight, with its views bound to the stage's blocks
     * (bind_unit, and a unit hook for the causal models' backward; see
     * parallel.c). */
    int (*sibling)(const rf_model *m, rf_model **out);
} rf_model_ops;

struct rf_model {
    const rf_model_ops *ops;
    void *impl; /* rf_bert, rf_gpt2 or rf_llama */
    bool owns;  /* rf_model_free frees impl (and the rf_model) */
    bool heap;  /* the rf_model itself was allocated by rf_model_load/_sibling */
    rf_model_hook hook;
    void *hook_user;
    int r0, r1;       /* the unit range of the forward/backward in progress */
    long counted;     /* labels the last forward counted (implementations set it) */
    int units;        /* the model's unit count (fixed; set by rf_model_init_*) */
    int eos;          /* causal LMs: the loaded config's eos_token_id, -1 when none */
    char *src_config; /* causal LMs: the config.json text loaded (kept for the export) */
};

/* ---- construction ---- */

/* Fills *m around an implementation the caller keeps (rf_model_free then frees
 * nothing of it). */
void rf_model_init_bert(rf_model *m, rf_bert *b);
/* An rf_bert's blocks (what its rf_model's blocks slot gives). */
rf_model_blocks rf_bert_blocks(const rf_bert *b);
void rf_model_init_gpt2(rf_model *m, struct rf_gpt2 *g);
void rf_model_init_llama(rf_model *m, struct rf_llama *l);

typedef struct rf_model_load_opts {
    int num_labels; /* classify: > 0 replaces the checkpoint's label count (new head) */
    uint64_t seed;  /* classify: initialisation of a missing head */
} rf_model_load_opts;

/* Loads a Hugging Face folder by config.json's model_type: "bert" (a
 * BertForSequenceClassification, see rf_bert_load), "gpt2" or "llama"
 * (causal LMs; model.safetensors). Anything else is RF_ERR_UNSUPPORTED. */
int rf_model_load(const char *dir, const rf_model_load_opts *o, const rf_backend *be,
                  rf_model **out);
/* What a folder's config.json says, without reading the weights; for a GGUF
 * (rf_llama_gguf_path) its metadata: a "llama" with the eos of
 * tokenizer.ggml.eos_token_id. */
typedef struct rf_model_desc {
    char arch[64]; /* "bert" (also when model_type is absent), "gpt2", "llama" */
    rf_model_task task;
    int vocab, max_positions;
    int eos_token_id; /* -1 when absent (the first of a list) */
} rf_model_desc;
int rf_model_describe(const char *dir, rf_model_desc *out);
void rf_model_free(rf_model *m);

/* ---- the calls (each checks and dispatches to m->ops) ---- */

rf_model_info rf_model_info_of(const rf_model *m); /* zeroed on error (logged) */
int rf_model_blocks_of(const rf_model *m, rf_model_blocks *out);
int rf_model_units(const rf_model *m);
int rf_model_unit_range(const rf_model *m, int unit, size_t *lo, size_t *hi);
int rf_model_bind_unit(rf_model *m, int unit, float *p, float *g);
int rf_model_bind_all(rf_model *m);
int rf_model_release_blocks(rf_model *m, bool params);
int rf_model_adopt_params(rf_model *m, const float *host);
int rf_model_enable_training(rf_model *m, size_t padded, size_t moments);
int rf_model_zero_grad(rf_model *m);
int rf_model_set_class_weights(rf_model *m, const float *w);
/* Installs fn (NULL removes it); one hook at a time. */
int rf_model_set_hook(rf_model *m, rf_model_hook fn, void *user);
int rf_model_replay(rf_model *m, int u0, int u1, bool backward);
size_t rf_model_boundary(const rf_model *m, int B, int T, int unit); /* 0 on error */
/* The whole model: forward over [0, units), backward likewise. */
int rf_model_forward(rf_model *m, const rf_model_batch *b, bool train, uint64_t seed);
int rf_model_backward(rf_model *m, float loss_scale);
int rf_model_forward_range(rf_model *m, const rf_model_batch *b, int u0, int u1, const float *in,
                           float *out, bool train, uint64_t seed);
int rf_model_backward_range(rf_model *m, int u0, int u1, const float *dout, float *din,
                            float loss_scale);
int rf_model_loss(const rf_model *m, float *loss, long *counted);
int rf_model_logits(const rf_model *m, const float **logits, size_t *row);
int rf_model_save(const rf_model *m, const char *dir);
/* The sibling slot: a heap rf_model that owns its implementation
 * (rf_model_free frees both). */
int rf_model_sibling(const rf_model *m, rf_model **out);

#endif
