/* LoRA (Hu et al. 2021) on the linear projections of GPT-2 and Llama, the
 * base frozen and optionally kept quantized (QLoRA, 8-bit base: quant.h).
 *
 * The op. For a linear layer y = x W^T + b (or GPT-2's Conv1D, y = x W + b:
 * the adapter is the same, as in peft where lora_A/lora_B are always
 * nn.Linear and fan_in_fan_out only concerns the base), one adapter adds
 *
 *     y += s * (dropout(x) A^T) B^T,   A [r, in], B [out, r], s = alpha / r,
 *
 * computed as peft does: u = dropout(x) A^T, then s * (u B^T). Backward gives
 * gradients for A and B only and adds the input gradient of the adapter to
 * that of the base. Products run in fixed sgemm pieces as in ops.c, so results
 * do not depend on the thread count; dropout masks are rf_op_dropout_fwd's
 * hash of (seed, element), regenerated in backward.
 *
 * The adapter set (rf_lora). One adapter per targeted projection and layer,
 * named as peft names them (<module>.lora_A.weight / .lora_B.weight, module
 * the Hugging Face path, e.g. model.layers.0.self_attn.q_proj). Its weights
 * are one contiguous block in table order with gradients and the two AdamW
 * moments of the same layout, so the optimizer, clipping and ZeRO see only
 * them; the model's own parameters are frozen (its gradient block is never
 * allocated). A model with an attached adapter set (m->lora) routes its four
 * projections per layer through rf_lora_fwd / rf_lora_bwd:
 *
 *   slot          GPT-2 (Conv1D)             Llama (nn.Linear, fused in the model)
 *   RF_PROJ_QKV   attn.c_attn (q,k,v fused)  self_attn.{q,k,v}_proj: 3 parts
 *   RF_PROJ_O     attn.c_proj                self_attn.o_proj
 *   RF_PROJ_UP    mlp.c_fc                   mlp.{gate,up}_proj: 2 parts
 *   RF_PROJ_DOWN  mlp.c_proj                 mlp.down_proj
 *
 * Targets name the modules: q, k, v, o, up, down, gate. GPT-2's one c_attn
 * takes q, k and v together (all three or none: peft cannot split it either)
 * and it has no gate.
 *
 * Base formats (rf_lora_config.base): RF_QT_F32 reads the model's fp32
 * weights; the others keep every projection of every layer quantized in the
 * adapter set (targeted or not, as bitsandbytes replaces every nn.Linear but
 * the head), and the model's fp32 copies of those weights are released
 * (their pages returned to the system; they read as zero). Embeddings, norms,
 * biases and the LM head stay fp32 and frozen. */
#ifndef RF_TR_LORA_H
#define RF_TR_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/model.h" /* rf_tensor_info */
#include "trainer/optim.h" /* rf_adamw */
#include "trainer/quant.h"

struct rf_gpt2;
struct rf_llama;

/* ---- the op ---- */

/* out[n * ldo + j] += scale * sum_r u[n, r] B[j, r] for j < OC, where
 * u[N, r] = drop(x) A^T is stored for backward; x is [N, IC]. With p > 0,
 * xd is N * IC floats of scratch (the dropped-out input); it may be NULL when
 * p == 0. */
void rf_op_lora_fwd(float *out, int ldo, float *u, float *xd, const float *x, const float *A,
                    const float *B, int N, int IC, int OC, int r, float scale, float p,
                    uint64_t seed);
/* dB += scale * dout^T u; du = scale * dout B (du: N * r floats of scratch,
 * overwritten); dA += du^T drop(x); dx += drop'(du A) (dx may be NULL). With
 * p > 0, xd is N * IC floats of scratch. dout rows are ldo floats apart. */
void rf_op_lora_bwd(float *dx, float *dA, float *dB, float *du, float *xd, const float *dout,
                    int ldo, const float *x, const float *u, const float *A, const float *B, int N,
                    int IC, int OC, int r, float scale, float p, uint64_t seed);

/* ---- the adapter set ---- */

enum {
    RF_LORA_Q = 1 << 0,
    RF_LORA_K = 1 << 1,
    RF_LORA_V = 1 << 2,
    RF_LORA_O = 1 << 3,
    RF_LORA_UP = 1 << 4,
    RF_LORA_DOWN = 1 << 5,
    RF_LORA_GATE = 1 << 6,
};
enum { RF_PROJ_QKV, RF_PROJ_O, RF_PROJ_UP, RF_PROJ_DOWN, RF_NPROJ };

typedef struct rf_lora_config {
    int rank;         /* r >= 1 */
    float alpha;      /* scale = alpha / r (peft's default; no rsLoRA) */
    float dropout;    /* on the adapter's input, in [0, 1) */
    unsigned targets; /* RF_LORA_* bits, at least one */
    rf_qtype base;    /* the frozen base's format */
} rf_lora_config;

/* peft's defaults: r 8, alpha 16, dropout 0, targets q and v, fp32 base. */
rf_lora_config rf_lora_defaults(void);
/* "q", "k", ..., "gate" -> its bit (0 if unknown); its peft module name for an
 * architecture ("q_proj", or "c_attn" for GPT-2's q/k/v). */
unsigned rf_lora_target_bit(const char *name);
/* "fp32", "int8", "nf4", "q4_1" -> format; -1 if unknown. */
int rf_lora_base_parse(const char *name);
const char *rf_lora_base_name(rf_qtype t);

struct rf_cfg;
/* The spec's lora mapping (e.g. trainer.lora) into *out, starting from
 * rf_lora_defaults():
 *     lora: {rank: 8, alpha: 16, dropout: 0.05, targets: [q, k, v, o, up, down, gate],
 *            base: fp32 | int8 | nf4 | q4_1}
 * Unknown keys, out-of-range values and unknown targets are RF_ERR_INVALID
 * with the file, line and key. */
int rf_lora_config_parse(const struct rf_cfg *node, rf_lora_config *out);

typedef enum rf_lora_arch { RF_LORA_GPT2, RF_LORA_LLAMA } rf_lora_arch;

/* One output range of a projection: a separate module in Hugging Face's model
 * (Llama's q_proj within the fused qkv), with its frozen quantized base and
 * its adapter (if targeted). */
typedef struct rf_lora_part {
    char module[80]; /* e.g. "model.layers.0.self_attn.q_proj" */
    unsigned bit;    /* RF_LORA_* of the module */
    int off, len;    /* output columns [off, off + len) of the projection */
    rf_qweight q;    /* base, when cfg.base is not RF_QT_F32 */
    bool qdev;       /* q's arrays are the backend's memory (moved there at attach) */
    long a, b;       /* tensor indices of lora_A / lora_B; -1: not targeted */
    size_t uoff;     /* its u [N, r] in the activation arena (per N) */
} rf_lora_part;

typedef struct rf_lora_proj {
    int in, out, nparts;
    rf_lora_part part[3];
} rf_lora_proj;

typedef struct rf_lora {
    rf_lora_config cfg;
    rf_lora_arch arch;
    /* The model's backend (backend.h): params, grads, m, v, the activations
     * (u, du, xd) and, once attached, the quantized bases' arrays (part.qdev)
     * are its memory; every product runs on its slots (conv1d / linear,
     * qlinear, lora). Host code reads and writes the block through
     * to_host / to_device (init, PEFT files). */
    const struct rf_backend *be;
    int nlayers;
    float scale;             /* alpha / rank */
    rf_lora_proj *proj;      /* [nlayers * RF_NPROJ] */
    rf_tensor_info *tensors; /* lora_A and lora_B of each adapter, peft's names without
                                the "base_model.model." prefix */
    size_t ntensors, nparams;
    size_t npadded;                /* floats in params and grads (>= nparams, zero tail) */
    size_t nmoments;               /* floats in m and v: nparams, or a ZeRO-1 shard's */
    float *params, *grads, *m, *v; /* grads, m, v: NULL until rf_lora_enable_training */
    double *ss;    /* with grads: the gradient norm's sum of squares (backend memory) */
    size_t qbytes; /* bytes of quantized base weights held */

    /* activations: u of every adapter for the last forward, and scratch */
    int capN;
    size_t nu, maxin; /* floats of u per row of N; widest adapter input */
    float *u, *du, *xd;
    bool train;    /* dropout active in the next forward (set by the caller) */
    uint64_t seed; /* dropout seed of the next forward (set by the caller) */
    bool last_train;
    uint64_t last_seed;
} rf_lora;

/* An adapter set for a model's configuration, on the model's backend (m->be):
 * A initialised as peft does (kaiming_uniform(a=sqrt(5)):
 * U(-1/sqrt(in), 1/sqrt(in))) from init_seed, B zero. Errors name the bad option (RF_ERR_INVALID /
 * RF_ERR_UNSUPPORTED). */
int rf_lora_new_gpt2(const struct rf_gpt2 *m, const rf_lora_config *cfg, uint64_t init_seed,
                     rf_lora **out);
int rf_lora_new_llama(const struct rf_llama *m, const rf_lora_config *cfg, uint64_t init_seed,
                      rf_lora **out);
void rf_lora_free(rf_lora *lo);
/* Attaches lo to the model: quantizes the model's projection weights into lo
 * when the base is quantized (the parts not set by rf_lora_set_base), then
 * releases the model's fp32 copies of them, and sets
 * m->lora. On a backend other than the CPU the weights are read with to_host,
 * quantized on the host and the quantized arrays moved into the backend's
 * memory; the fp32 copies are zeroed there (not returned: they are part of
 * the model's one parameter block). A backend without the lora / qlinear
 * slots is refused (RF_ERR_UNSUPPORTED naming the slot). The model must be the one lo was made for;
 * it keeps no gradient block of its own (the base is frozen): call the model's enable_training
 * after attaching. A Q4_1 base cannot be made from fp32 weights here (it
 * comes as loaded from GGUF: rf_lora_load_llama_gguf), except for tests with
 * allow_requant. */
int rf_lora_attach_gpt2(rf_lora *lo, struct rf_gpt2 *m);
int rf_lora_attach_llama(rf_lora *lo, struct rf_llama *m, bool allow_requant);

/* Hands a quantized base weight for one part to lo (before attaching): the
 * part's module weight in nn.Linear layout, e.g. bitsandbytes' own NF4 state
 * (rf_qweight_from_nf4) or a GGUF file's Q4_1 blocks. Its type must be
 * lo->cfg.base and its shape [len, in] of the part (RF_ERR_INVALID). lo takes
 * q's memory (q is zeroed). Attaching quantizes only the parts not set. */
int rf_lora_set_base(rf_lora *lo, int layer, int slot, int part, rf_qweight *q);

const rf_tensor_info *rf_lora_find(const rf_lora *lo, const char *name);
/* Allocates gradients and both AdamW moments (zeroed). */
int rf_lora_enable_training(rf_lora *lo);
/* The same for a data-parallel rank: params and grads get `padded` floats
 * (>= nparams, zero tail; params move), m and v `moments` floats. */
int rf_lora_enable_training_sharded(rf_lora *lo, size_t padded, size_t moments);
int rf_lora_zero_grad(rf_lora *lo);
/* Ensures activation capacity for N = B * T rows (the models call it). */
int rf_lora_reserve(rf_lora *lo, int N);

/* A projection through the adapter set (the models call these in place of
 * their Conv1D / linear op): the frozen base (fp32 from w, or quantized), plus
 * every adapter of the slot. dw/db are passed to the fp32 base's op (NULL:
 * frozen). Returns RF_ERR_NOMEM if a tile buffer cannot be allocated. */
int rf_lora_fwd(rf_lora *lo, int layer, int slot, float *out, const float *inp, const float *w,
                const float *b, int N, int IC, int OC);
int rf_lora_bwd(rf_lora *lo, int layer, int slot, float *dinp, float *dw, float *db,
                const float *dout, const float *inp, const float *w, int N, int IC, int OC);

/* A Llama from a GGUF file (llama.cpp's tensor names; its permuted q/k rows
 * put back in Hugging Face's order). lcfg NULL: every tensor dequantized into
 * the model (*lo stays NULL). Otherwise an adapter set for lcfg is made
 * (init_seed), its base filled and attached: for a quantized base the
 * projection weights never enter the model's fp32 block (Q4_1: the file's
 * blocks as they are, rows reordered; int8 / NF4: one tensor dequantized at a
 * time and quantized); for fp32 they are dequantized into it. The model's
 * other tensors (embedding, norms, an untied head) are dequantized. */
int rf_lora_load_llama_gguf(const char *path, const rf_lora_config *lcfg, uint64_t init_seed,
                            struct rf_llama **m, rf_lora **lo);
/* The same on a backend (NULL: the CPU): the model and the adapter set are
 * be's; the dequantized tensors go through a host copy and to_device, the
 * quantized bases are moved at attach (rf_lora_attach_llama). */
struct rf_backend;
int rf_lora_load_llama_gguf_on(const char *path, const rf_lora_config *lcfg,
                               const struct rf_backend *be, uint64_t init_seed, struct rf_llama **m,
                               rf_lora **lo);

/* Global-norm clipping and one AdamW step on the adapter block (decay on A
 * and B: they are matrices), as rf_adamw_step does for a model, on lo's
 * backend's slots; step is 0-based. Returns the norm before clipping (NaN on
 * error). */
float rf_lora_adamw_step(rf_lora *lo, const rf_adamw *o, long step);

/* PEFT adapter files: DIR/adapter_config.json (LoRA, CAUSAL_LM, r,
 * lora_alpha, lora_dropout, target_modules, fan_in_fan_out for GPT-2) and
 * DIR/adapter_model.safetensors (F32, "base_model.model.<module>.lora_A.weight"
 * ...), which peft.PeftModel.from_pretrained loads over the base. base_name
 * goes into base_model_name_or_path (may be NULL). */
int rf_lora_save_peft(const rf_lora *lo, const char *dir, const char *base_name);
/* Reads such a folder into lo: the config's r, lora_alpha and target modules
 * must be lo's (RF_ERR_INVALID naming the difference), options that change
 * what an adapter computes (DoRA, rsLoRA, rank/alpha patterns, biases, ...)
 * must be off (RF_ERR_UNSUPPORTED), every adapter tensor must be there with
 * its shape and a float dtype, and no other LoRA tensor may be; lo's weights
 * change only when all of them are valid. */
int rf_lora_load_peft(rf_lora *lo, const char *dir);
/* The same from memory: the config's text and the weight file's bytes
 * (copied). Nothing in them is trusted (tests/fuzz/fuzz_lora_peft.c). */
int rf_lora_load_peft_mem(rf_lora *lo, const char *config, size_t config_len,
                          const uint8_t *weights, size_t weights_len);

/* The rank, alpha, dropout and targets of DIR/adapter_config.json for an
 * architecture (base fp32), checked as rf_lora_load_peft checks them:
 * RF_ERR_UNSUPPORTED for another peft_type than LORA, an option that changes
 * what the adapter computes or a module the architecture lacks;
 * RF_ERR_INVALID for a bad r / lora_alpha; RF_ERR_NOT_FOUND without the
 * file. */
int rf_lora_peft_config(const char *dir, rf_lora_arch arch, rf_lora_config *out);

/* Merging for inference: W += (alpha / r) B A into the model's fp32 weight of
 * every targeted module (peft's merge_and_unload: Llama's q/k/v and gate/up
 * rows of the fused weights, GPT-2's Conv1D [in, out] transposed, c_attn
 * whole), after which the model computes what the model plus adapter did
 * (within round-off) with no adapter attached: the inference code
 * (causal_infer.h) runs it unchanged. lo must have an fp32 base and be made
 * for this model; the model must have no adapter attached (m->lora NULL).
 * RF_ERR_INVALID / RF_ERR_UNSUPPORTED otherwise, the model unchanged. */
int rf_lora_merge_gpt2(const rf_lora *lo, struct rf_gpt2 *m);
int rf_lora_merge_llama(const rf_lora *lo, struct rf_llama *m);
/* The PEFT adapter folder dir merged into one model (exactly one of gpt2 and
 * llama non-NULL): rf_lora_peft_config, a set for the model, rf_lora_load_peft
 * (shapes, every tensor present, nothing extra), merge. On error the model is
 * unchanged and the message names the file and the mismatch. */
int rf_lora_merge_peft(struct rf_gpt2 *gpt2, struct rf_llama *llama, const char *dir);

/* LoRA through the model interface (model_lora.c): loads the Hugging Face
 * causal LM in dir (rf_model_load: GPT-2 or Llama) or, when dir names a GGUF
 * (rf_llama_gguf_path: a .gguf file or a folder holding one and no
 * config.json), the Llama in it with rf_lora_load_llama_gguf (base q4_1 only
 * there, and only when the file's projections are Q4_1; the eos id from
 * tokenizer.ggml.eos_token_id), makes an adapter set for
 * cfg (init_seed), attaches it (quantizing the base when cfg->base asks) and
 * returns an rf_model whose flat blocks (params, grads, moments, tensor
 * table) are the adapter's alone: the optimizer, clipping, checkpoints and
 * the data-parallel all-reduce see only the adapter; save writes the PEFT
 * adapter files. One parameter unit (the adapter block); ZeRO-2/3 and
 * pipeline ranges are refused. */
struct rf_model;
/* be: the backend of the base and the adapter (NULL: the CPU). */
int rf_model_load_lora(const char *dir, const rf_lora_config *cfg, const struct rf_backend *be,
                       uint64_t init_seed, struct rf_model **out);

#endif
