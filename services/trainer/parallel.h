/* Training on a dp x tp x pp mesh (issue 17): tensor parallelism inside the
 * model's layers, pipeline stages over its units, data parallelism with
 * ZeRO-1/2 on the dp axis, all through the model interface (model_iface.h).
 * rf_train_model calls rf_train_mesh when o->tp, o->pp or o->microbatches is
 * above 1; every rank of o->comm (dp x tp x pp ranks, mesh.h's layout: tp
 * fastest, then pp, then dp) calls it with the same data and options.
 *
 * One optimizer step, on every rank:
 *   - the batches of the step (grad_accum of them) are cut as data
 *     parallelism cuts them (dp rank i: the i-th contiguous slice of each),
 *     and each slice into `microbatches` pieces; every piece is one
 *     micro-batch of the 1F1B schedule (pipeline.h), all of the step's in one
 *     rf_pp_run, so the bubble is (p - 1) / (accum x microbatches + p - 1);
 *   - a stage runs forward/backward over its units [u0, u1) (the boundary is
 *     the residual stream, model_iface.h), one model instance per
 *     micro-batch in flight (rf_model_sibling), all bound to the stage's one
 *     parameter and gradient block; with tp > 1 each instance is a tp shard
 *     (rf_model_tp_split: BERT, GPT-2 or Llama) and the stage's tp ranks run
 *     the same schedule, their collectives inside the model;
 *   - after the last micro-batch's backward: a tied LM head's gradient of the
 *     word embedding goes from the last stage to stage 0 (Megatron's
 *     embedding group, point to point), then the dp gradient sync, once:
 *     all-reduce (zero 0 and 1) or reduce-scatter (zero 2) of the stage's
 *     block over the dp group;
 *   - the global gradient norm: each rank sums the squares of its dp shard
 *     of its stage's block, tp-replicated parameters on tp rank 0 only, one
 *     all-reduce over the world; clipping as one process (torch's formula);
 *   - AdamW on the stage's block (zero 0) or the rank's dp shard of it (zero
 *     1 and 2, then an all-gather of the parameters over dp), and stage 0
 *     sends the updated word embedding to the last stage (tied heads).
 *
 * Stages: `stages` (layers per stage) as given, or balanced by measured
 * cost: every rank times each unit's forward and backward (the unit hook's
 * events) on a piece of the first batch, the times are summed over the
 * world, and the contiguous split minimising the slowest stage is taken.
 *
 * Checkpoints are the sharded format of checkpoint.h in the WHOLE model's
 * coordinates (the split's spans, model_tp.h): each rank writes its dp shard of its
 * stage's block, tp-replicated pieces from tp rank 0 only, so every element
 * is written once and the checkpoint loads at any layout (1 process, dp N,
 * another mesh). When rf_train_mesh returns RF_OK, m is the whole model again
 * on every rank (stages broadcast over pp, tp shards gathered and merged), so
 * the caller exports it as any other.
 *
 * Refused before any work (RF_ERR_INVALID / RF_ERR_UNSUPPORTED, naming the
 * numbers): a world that is not dp x tp x pp, zero 3 on a tp/pp mesh, heads
 * (Llama: also key/value heads) or intermediate size not divisible by tp
 * (rf_model_tp_check), LoRA at tp > 1, more stages than
 * layers, a stages list not summing to the layers, a batch not divisible
 * into micro-batches, a backend without tensor parallelism's slots at tp > 1
 * (backend.h), the per-checkpoint callbacks (the trainer service's; they
 * need the whole model on rank 0).
 *
 * metrics.jsonl (rank 0) adds per step: step_s, compute_s (forward/backward
 * and the optimizer, without the tp collectives), comm_s (tp collectives,
 * the dp sync, the norm and loss all-reduces, the tied exchange), bubble_s
 * (pipeline receive waits and flush), each the mean over the ranks, the
 * bubble as a share of the pipeline's time (mean and max over ranks) and the
 * theory; train.json adds the mesh, the stages and their means. */
#ifndef RF_TR_PARALLEL_H
#define RF_TR_PARALLEL_H

#include "trainer/train.h"

int rf_train_mesh(const rf_train_opts *o, const rf_dataset *data, rf_model *m,
                  rf_train_result *res);

#endif
