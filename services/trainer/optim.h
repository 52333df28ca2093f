/* AdamW with decoupled weight decay (as torch.optim.AdamW), the linear warmup +
 * linear decay schedule of Hugging Face, and global-norm gradient clipping (as
 * torch.nn.utils.clip_grad_norm_). Operates on the model's contiguous
 * params/grads/m/v blocks; the per-tensor decay flag comes from the table. */
#ifndef RF_TR_OPTIM_H
#define RF_TR_OPTIM_H

#include "trainer/model.h"
#include "trainer/model_iface.h"

typedef struct rf_adamw {
    float lr, beta1, beta2, eps, weight_decay;
    long warmup_steps, total_steps; /* total 0 = constant after warmup */
    float clip_norm;                /* 0 = no clipping */
} rf_adamw;

/* Defaults of the Hugging Face Trainer: lr 5e-5, betas (0.9, 0.999), eps 1e-8,
 * weight decay 0, no warmup, clip 1.0. */
rf_adamw rf_adamw_defaults(void);
/* Learning rate of optimizer step `step` (0-based). */
float rf_adamw_lr(const rf_adamw *o, long step);
/* L2 norm of all gradients, summed in a fixed order (deterministic). */
float rf_grad_norm(const rf_bert *m);
/* Scales gradients so their global norm is at most clip_norm; returns the norm
 * before clipping. */
float rf_clip_grads(rf_bert *m, float clip_norm);
/* One AdamW update with learning rate lr; step is 0-based (bias correction
 * uses step + 1). */
void rf_adamw_step(rf_bert *m, const rf_adamw *o, long step, float lr);
/* The same update restricted to parameters [lo, hi) (a ZeRO shard): mom1/mom2
 * hold the moments of that range only (mom1[0] is element lo). Each tensor's
 * weight-decay flag applies to the part of it inside the range. Element for
 * element equal to rf_adamw_step. */
void rf_adamw_step_range(rf_bert *m, const rf_adamw *o, long step, float lr, size_t lo, size_t hi,
                         float *mom1, float *mom2);
/* The same update on blocks given apart: params, grads, mom1 and mom2 each
 * hold the range [lo, hi) of the flat block (element lo at index 0), as a
 * ZeRO-3 shard does; m supplies only the tensor table and the backend (whose
 * memory the four blocks are in). Returns the backend's error code. */
int rf_adamw_step_blocks(const rf_bert *m, const rf_adamw *o, long step, float lr, size_t lo,
                         size_t hi, float *params, const float *grads, float *mom1, float *mom2);

/* The same with the backend's error code (the functions above log a failure
 * and return NaN as the norm): *norm is the norm before clipping. */
int rf_grad_norm_ex(const rf_bert *m, float *norm);
int rf_clip_grads_ex(rf_bert *m, float clip_norm, float *norm);
int rf_adamw_update(rf_bert *m, const rf_adamw *o, long step, float lr, size_t lo, size_t hi,
                    float *mom1, float *mom2);

/* The same on any model's blocks (model_iface.h): rf_clip_grads_ex,
 * rf_adamw_update and rf_adamw_step_blocks are these on an rf_bert's. */
int rf_optim_clip(const rf_model_blocks *b, float clip_norm, float *norm);
int rf_optim_adamw(const rf_model_blocks *b, const rf_adamw *o, long step, float lr, size_t lo,
                   size_t hi, float *mom1, float *mom2);
/* rf_adamw_step_blocks on any model's blocks; with ss (one double of backend
 * memory, NULL: none) it clips as rf_optim_clipped_adamw does, by
 * rf_clip_coef(*ss, o->clip_norm): ZeRO-2/3's shards and the meshes, whose
 * sum of squares is all-reduced over the group where it lies. */
int rf_optim_adamw_pieces(const rf_model_blocks *b, const rf_adamw *o, long step, float lr,
                          size_t lo, size_t hi, float *params, const float *grads, float *mom1,
                          float *mom2, const double *ss);
/* rf_optim_clip then rf_optim_adamw on the model's moments, with no host
 * round trip between: the gradients' sum of squares goes into *ss (one
 * double of the backend's memory) and AdamW clips with it on the backend
 * (rf_adamw_hp.sumsq), the gradient buffer left as it is; then *norm is the
 * norm before clipping, brought back once the update is queued (the log's
 * read, the only wait). Same parameters and moments as the two calls, bit
 * for bit. */
int rf_optim_clipped_adamw(const rf_model_blocks *b, const rf_adamw *o, long step, float lr,
                           size_t lo, size_t hi, double *ss, float *norm);

#endif
