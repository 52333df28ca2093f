/* ZeRO stages 3 and 2: the gradients and moments are sharded per model unit,
 * and at stage 3 the parameters too (see "Data parallel" in train.c and the
 * README's ZeRO section). Stage 2 is stage 3 without the parameter shards:
 * m->params stays full on every rank (no all-gather before a unit), the
 * gradient path is the same, and after the step every rank's updated pieces
 * are all-gathered into m->params.
 *
 * The flat parameter block is cut into the model's units (rf_model_units:
 * the embeddings, each transformer layer, the head; model_iface.h). Each unit of s
 * floats is split over the N ranks in blocks of b = ceil(s / N) (FSDP's flat
 * parameter with padding): rank r holds elements [r*b, min((r+1)*b, s)) of
 * every unit, zero-padded to b. Its shard block is the concatenation of those
 * pieces, and gradients and both AdamW moments are shards of the same layout.
 *
 * The model's unit hook (rf_model_hook) drives the communication:
 *   forward, unit u:  wait for u's all-gather (started as a prefetch while
 *                     u-1 ran, or now), point u's views at it, release the
 *                     buffer of the unit before, start the all-gather of u+1;
 *   backward, unit u: the same in reverse order (the head's buffer is still
 *                     there from forward), plus a zeroed full-size gradient
 *                     buffer for u's views;
 *   backward done u:  start the reduce-scatter of u's gradient (async; it is
 *                     waited for, and its block added into the shard's
 *                     gradient, when the buffer is needed again or at the end
 *                     of backward).
 * So a rank holds its shards (params, grads, moments: 4 psi / N floats plus
 * padding) and working buffers of at most two units' parameters and two
 * units' gradients at a time; rf_zero3_memory reports both. On a device
 * (be->device_memory) those four buffers have the largest unit's size and
 * are kept from their first use to the end, so that a step allocates and
 * frees nothing (cudaFree synchronises the device).
 *
 * Every rank must raise the same events in the same order: a rank whose
 * slice of a micro-batch is empty calls rf_zero3_idle instead of
 * forward/backward. The collectives run on one thread (the caller's). */
#ifndef RF_TR_ZERO3_H
#define RF_TR_ZERO3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "trainer/model_iface.h"
#include "trainer/optim.h"

typedef struct rf_zero3 rf_zero3;

typedef struct rf_zero3_memory {
    size_t shard_floats;   /* this rank's params shard (= grads shard = each moment) */
    size_t working_peak;   /* largest floats held at once in unit buffers (params + grads) */
    size_t working_params; /* of which parameter buffers, at that peak */
} rf_zero3_memory;

/* Takes m's parameters (the same on every rank) apart into this rank's
 * shards, moments zero, frees m's full blocks (m->params, and grads/m/v if
 * allocated, become NULL; with shard_params false, stage 2, m->params stays)
 * and installs the unit hook. A resumed state is then
 * read into the shards (rf_zero3_shards, rf_checkpoint_load_pieces). c must
 * have world size > 1 and outlive z. */
int rf_zero3_new(rf_comm *c, rf_model *m, bool shard_params, rf_zero3 **out);
/* Gathers the full parameters back into m (every rank; collective), removes
 * the hook and frees z; m->params is full again (grads/m/v stay NULL). With
 * restore false only frees (after an error: no collective). */
int rf_zero3_free(rf_zero3 *z, bool restore);

/* Zeroes the gradient shard (start of an optimizer step), on the backend. */
int rf_zero3_zero_grad(rf_zero3 *z);
/* The events of one micro-batch for a rank without rows (backward: whether
 * the other ranks run backward); contributes zero gradients. */
int rf_zero3_idle(rf_zero3 *z, bool backward);
/* After the model's backward: waits for the pending reduce-scatters and folds
 * them into the gradient shard; returns the first error of any hook event. */
int rf_zero3_end_backward(rf_zero3 *z);
/* Global gradient norm (all-reduced), clipping as rf_clip_grads, and AdamW on
 * this rank's shard (stage 2: then the all-gather of m->params); *norm is the
 * norm before clipping. */
int rf_zero3_step(rf_zero3 *z, const rf_adamw *o, long step, float lr, float *norm);

/* The full block of params (which 0), first moments (1) or second moments
 * (2), every rank's shards put together into full[nparams], HOST memory
 * (collective: all ranks call it; full may be NULL on ranks that do not need
 * it... it is filled on every rank where it is not NULL). */
int rf_zero3_gather(rf_zero3 *z, int which, float *full);
/* Copies the full blocks' (params, moments; NULL = leave) pieces that this
 * rank holds into its shards; the blocks are the backend's memory (like the
 * model's). */
int rf_zero3_scatter(rf_zero3 *z, const float *params, const float *mom1, const float *mom2);

/* This rank's piece of unit u: global range [*lo, *hi) of the flat block
 * (possibly empty) and its offset in the shard block; returns the unit's
 * block size b. */
size_t rf_zero3_piece(const rf_zero3 *z, int u, size_t *lo, size_t *hi, size_t *shard_off);
int rf_zero3_units(const rf_zero3 *z);
/* The shard blocks (params, first and second moments; see rf_zero3_piece),
 * in the model's backend memory (read and write them through to_host and
 * to_device on a device backend). *p is NULL at stage 2 (the rank's pieces
 * are in m->params). */
void rf_zero3_shards(rf_zero3 *z, float **p, float **m1, float **m2);
rf_zero3_memory rf_zero3_memory_of(const rf_zero3 *z);
/* Ring-model bytes this rank sent so far (all-gather and reduce-scatter:
 * (N-1) x the unit's block each). */
uint64_t rf_zero3_bytes(const rf_zero3 *z);

#endif
