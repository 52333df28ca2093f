/* Pipeline parallelism (issue 17): the 1F1B schedule and its executor.
 *
 * A model's layers are cut into `stages` contiguous stages, one per rank of a
 * pipeline group (rf_comm_mesh.pp_comm: its rank is the stage index). A batch
 * is cut into `micro` micro-batches. Each stage runs, in this order (PipeDream
 * flush / Megatron's non-interleaved 1F1B):
 *
 *   warmup    w = min(stages - stage - 1, micro) forwards F0 .. F(w-1);
 *   steady    micro - w pairs F(w+k), B(k), k = 0 .. micro-w-1;
 *   cooldown  the remaining backwards B(micro-w) .. B(micro-1).
 *
 * so at most stages - stage micro-batches are in flight on a stage (their
 * activations kept for backward), whatever `micro` is, and every stage runs
 * the backwards in micro-batch order 0, 1, .. (gradient accumulation in the
 * order of one process running F0 B0 F1 B1 ...).
 *
 * rf_pp_run drives one batch through a stage's callbacks. Between stage s and
 * s + 1 (edge s) the forward sends an activation and the backward sends its
 * gradient back, both with the comm layer's async send/recv over the pipeline
 * group; their sizes may change per micro-batch (padded sequence lengths), so
 * every stage asks the same `boundary` callback, which must give the same
 * count on both sides of an edge (every rank holds the batch's shapes).
 * Buffers are the executor's: an output is freed as soon as its send has
 * completed, a received input is kept until its micro-batch's backward has
 * returned, a received gradient until that backward has returned, and the
 * gradient of the input until its send has completed.
 *
 * The bubble: every stage measures the seconds it waits for a receive and,
 * after its last operation, for its sends and for the rest of the group (a
 * barrier on the pipeline group: the flush). Its idle share of the step is
 * set beside the theoretical (stages - 1) / (micro + stages - 1) of equal
 * stages. A barrier before the first operation lines the stages up (its time
 * is not counted: it is the previous step's imbalance, not the pipeline's).
 *
 * Two ways to move the boundaries, one schedule:
 *   - overlapped (the default, host memory): the executor's buffers are
 *     malloc'd, sends are asynchronous and one receive of each kind is posted
 *     ahead of need, so a message can arrive while the stage computes. Right
 *     for MPI; not for NCCL, which runs one rank's point-to-point operations
 *     in the order issued (comm.h): stage 0's early receive of gradient 0
 *     would hold back its send of activation 0, which that gradient needs.
 *   - paired (rf_pp_stage.paired; the trainer's device stages): every
 *     transfer is blocking, and in the steady phase each send travels with
 *     the receive it pairs with as one rf_comm_sendrecv_n (Megatron's
 *     send_forward_recv_backward / send_backward_recv_forward):
 *         warmup    recv act(i) from s-1, F(i), send act(i) to s+1
 *         (once)    recv act(w) from s-1
 *         steady    F(w+k); [send act(w+k) to s+1 | recv grad(k) from s+1];
 *                   B(k); [send grad(k) to s-1 | recv act(w+k+1) from s-1]
 *                   (the last steady step sends only)
 *         cooldown  recv grad(k) from s+1, B(k), send grad(k) to s-1
 *     (a side a stage lacks is left out). Stage s's exchanges meet stage
 *     s + 1's in the same order, so no transfer waits on one its peer issues
 *     later: it needs no buffering by the transport, which the test device
 *     checks by running it with synchronous sends (comm.h's sync_send). The
 *     buffers come from the stage's alloc/release (its device memory, so
 *     NCCL moves them without a host copy) or malloc. Nothing overlaps the
 *     transfers here: the time a stage spends in them is its bubble.
 * Either way the operations run in rf_pp_schedule's order. */
#ifndef RF_TR_PIPELINE_H
#define RF_TR_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

typedef enum rf_pp_kind {
    RF_PP_FWD = 0,
    RF_PP_BWD = 1,
} rf_pp_kind;

typedef struct rf_pp_op {
    rf_pp_kind kind;
    int micro;
} rf_pp_op;

/* Forwards before the first backward: min(stages - stage - 1, micro). */
int rf_pp_warmup(int stages, int stage, int micro);

/* The 1F1B order of stage `stage` of `stages` for `micro` micro-batches:
 * 2 * micro operations into ops (the caller's array of that size).
 * RF_ERR_INVALID when stages < 1, stage is not in [0, stages) or micro < 1. */
int rf_pp_schedule(int stages, int stage, int micro, rf_pp_op *ops);

/* (stages - 1) / (micro + stages - 1): the idle share of each of `stages`
 * equal stages in one 1F1B batch of `micro` micro-batches. */
double rf_pp_bubble_theory(int stages, int micro);

/* A stage, as callbacks (user is passed back). Errors are rf_err codes; the
 * first one stops rf_pp_run, which returns it. */
typedef struct rf_pp_stage {
    void *user;
    /* Floats of the activation crossing edge `edge` (from stage edge to
     * edge + 1) for micro-batch `micro`; its gradient has the same count. */
    size_t (*boundary)(void *user, int edge, int micro);
    /* Forward of micro-batch `micro`. in: the activation received from the
     * previous stage (NULL on stage 0, which reads its own data); it stays
     * valid and unchanged until backward(micro) returns. out: where to write
     * this stage's output, boundary(stage, micro) floats (NULL on the last
     * stage, which computes the loss). */
    int (*forward)(void *user, int micro, const float *in, float *out);
    /* Backward of micro-batch `micro` (the same `in` as its forward). dout:
     * the gradient of the output received from the next stage (NULL on the
     * last stage). din: where to WRITE the gradient of `in` (NULL on stage
     * 0); its contents on entry are unspecified. Gradients of the stage's
     * parameters accumulate across micro-batches, as in gradient
     * accumulation. */
    int (*backward)(void *user, int micro, const float *in, const float *dout, float *din);
    /* Optional. The paired executor (above) instead of the overlapped one. */
    bool paired;
    /* Optional, paired only (NULL, NULL: malloc and free): the boundary
     * buffers' memory, n floats (n may be 0; contents unspecified), NULL with
     * rf_fail's detail when there is none; release takes back what alloc
     * gave. The pipeline group must be able to move that memory (a device's:
     * an NCCL group). forward's out and backward's din must be complete in
     * that memory, and backward done reading dout, by the time a transfer
     * on the pipeline group runs (a device stage waits for its queue before
     * it returns, or its group is ordered after that queue: comm.h's
     * rf_comm_order_after): the executor hands them to a transfer, which may
     * run on another stream, or back to release for reuse. */
    float *(*alloc)(void *user, size_t n);
    void (*release)(void *user, float *p);
} rf_pp_stage;

/* One rf_pp_run, seen from one stage. Seconds are wall time; step_s is from
 * the end of the opening barrier to the end of the closing one, and is about
 * compute_s + recv_s + flush_s (the rest is bookkeeping and starting sends). */
typedef struct rf_pp_stats {
    int stages, stage, micro;
    double step_s;
    double compute_s; /* inside forward and backward */
    double recv_s;    /* waiting for an activation or a gradient to arrive (paired: the
                       * time in every transfer, sends included) */
    double flush_s;   /* after the last operation: waiting for sends and the group */
    double align_s;   /* in the opening barrier (not in step_s: the previous step's imbalance) */
    double bubble;    /* (recv_s + flush_s) / step_s: this stage's idle share */
    double theory;    /* rf_pp_bubble_theory(stages, micro) */
    uint64_t bytes_sent, bytes_recv;
    size_t peak_floats; /* boundary buffers (inputs, outputs, gradients) held at once */
} rf_pp_stats;

/* Runs the 1F1B schedule of this rank's stage (rf_comm_rank(pp) of
 * rf_comm_world(pp) stages; pp NULL: one stage, no communication) for
 * `micro` micro-batches. Collective over pp: every stage calls it with the
 * same `micro`. stats may be NULL. On an error (a callback's, or the comm
 * layer's: see comm.h) requests may still be pending and their buffers are
 * left allocated on purpose (the transport may still write into them): the
 * group cannot go on, and the caller should log rf_errmsg() and exit. */
int rf_pp_run(rf_comm *pp, int micro, const rf_pp_stage *st, rf_pp_stats *stats);

#endif
