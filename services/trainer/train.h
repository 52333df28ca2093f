/* The fine-tuning loop: shuffled epochs, padded micro-batches, gradient
 * accumulation, clipping, AdamW with warmup + linear decay, periodic atomic
 * checkpoints, resume, and the Hugging Face export at the end.
 *
 * Determinism: the order of epoch e is a Fisher-Yates shuffle seeded by
 * (seed, e); each micro-batch's dropout seed is drawn from the state's RNG; all
 * kernels reduce in a fixed order. The same data, options and thread count
 * therefore give bitwise-identical weights, also across a kill and resume. */
#ifndef RF_TR_TRAIN_H
#define RF_TR_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "trainer/dataset.h"
#include "trainer/mesh.h"
#include "trainer/model.h"
#include "trainer/model_iface.h"
#include "trainer/optim.h"

/* What rf_train reports at a checkpoint (see rf_train_opts.on_checkpoint). */
typedef struct rf_train_checkpoint {
    long step, total;    /* optimizer steps done, and planned; step == total: the last one */
    double loss;         /* mean training loss since the previous checkpoint (or resume) */
    double lr;           /* learning rate of this step */
    double tokens_per_s; /* since this rf_train call started */
} rf_train_checkpoint;

/* Class weights of the training loss (see rf_op_xent_fwd). */
typedef enum rf_class_weighting {
    RF_CW_NONE,     /* plain mean: every labelled sequence counts the same */
    RF_CW_BALANCED, /* sklearn's "balanced": w_c = n / (num_labels * count_c) over the training
                       set given to rf_train; a class absent from it gets 0 */
    RF_CW_LIST,     /* class_weights[0 .. n_class_weights-1], one per label */
} rf_class_weighting;
#define RF_TRAIN_MAX_CLASS_WEIGHTS 256

typedef struct rf_train_opts {
    const char *out_dir; /* checkpoint.bin (+ checkpoint.d/), metrics.jsonl and train.json
                            go here (created) */
    int epochs;          /* >= 1 */
    long max_steps;      /* > 0: stop (and schedule) at this many optimizer steps */
    int batch_size;      /* sequences per micro-batch */
    int grad_accum;      /* micro-batches per optimizer step */
    rf_adamw optim;      /* total_steps is filled in by rf_train */
    double warmup_ratio; /* used when optim.warmup_steps < 0 */
    uint64_t seed;
    bool shuffle;          /* false: every epoch in data order (side-by-side runs) */
    bool balanced_sampler; /* each epoch: n draws with replacement, classes equally likely
                              (replaces the shuffle; see train.c balanced_order) */
    bool dropout;          /* false: dropout off (deterministic parity runs) */
    long checkpoint_every; /* optimizer steps between checkpoints; 0 = at the end only */
    long log_every;        /* optimizer steps between log lines; 0 = none */
    bool resume;           /* continue from out_dir/checkpoint.bin when present (any layout) */
    long stop_after;       /* > 0: return after this many steps (tests, time limits) */
    volatile int *cancel;  /* non-zero: checkpoint and stop */
    rf_class_weighting class_weighting;
    int n_class_weights; /* RF_CW_LIST: must equal the model's num_labels */
    float class_weights[RF_TRAIN_MAX_CLASS_WEIGHTS];
    /* Optional: called at every scheduled checkpoint (each checkpoint_every
     * steps and the last step; not at a stop_after/cancel stop) with the
     * weights after that step, just BEFORE the state is saved, so that a crash
     * during the call resumes from the previous checkpoint and calls it again
     * for this step. Non-zero stops training with that error. */
    int (*on_checkpoint)(void *user, const rf_bert *m, const rf_train_checkpoint *c);
    /* The same for any model (model_iface.h); used instead of on_checkpoint
     * when set. */
    int (*on_checkpoint_model)(void *user, const rf_model *m, const rf_train_checkpoint *c);
    void *user;
    /* Data parallelism (see "Data parallel" in train.c). comm NULL or of world
     * size 1: one process, unchanged. Otherwise every rank of comm calls
     * rf_train with the same data and options; each takes a contiguous slice
     * of every micro-batch, and zero picks what is sharded over the flat
     * blocks: 0 nothing (gradients all-reduced), 1 the AdamW moments, 2 also
     * the gradients (reduce-scattered), 3 also the parameters (per model
     * unit, see zero3.h; m holds the full weights again when rf_train
     * returns RF_OK). Every rank writes its checkpoint shard; rank 0 writes
     * the other files and calls on_checkpoint (at zero 3 every rank takes
     * part in gathering the weights it is given). The caller owns comm. */
    rf_comm *comm;
    int zero;
    /* Tensor and pipeline parallelism (issue 17; parallel.h): with tp > 1,
     * pp > 1 or microbatches > 1, comm is the whole group of dp x tp x pp
     * ranks (mesh.h's layout, dp = its world size / (tp x pp)) and rf_train
     * runs rf_train_mesh; zero 0..2 then applies to the dp axis. stages
     * (nstages = pp; 0: balanced by measured cost) are the transformer layers
     * of each pipeline stage. 0 means 1 for tp, pp and microbatches. */
    int tp, pp, microbatches;
    int nstages;
    int stages[RF_TR_MAX_STAGES];
} rf_train_opts;

typedef struct rf_train_result {
    long steps;
    double last_loss; /* mean training loss over the last log window */
    double seconds;
    uint64_t tokens; /* non-padding tokens processed */
    double tokens_per_s;
    bool resumed;
    bool finished;       /* false when stopped early (stop_after, cancel) */
    uint64_t comm_bytes; /* bytes this rank sent in collectives (ring model; see train.c) */
} rf_train_result;

rf_train_opts rf_train_defaults(void);
/* Resolves o's class weighting for the training set d and K labels into w[K]
 * (logged); *weighted = false (w untouched) for RF_CW_NONE. A list whose
 * length is not K is RF_ERR_INVALID. rf_train calls it. */
int rf_train_class_weights(const rf_train_opts *o, const rf_dataset *d, int K, float *w,
                           bool *weighted);
/* The order in which rf_train visits d's sequences in epoch `epoch` (order[d->n]):
 * the seeded shuffle, data order (shuffle false), or the balanced sampler's
 * draws. Labels must be in [0, K). */
int rf_train_epoch_order(const rf_train_opts *o, const rf_dataset *d, int K, uint64_t epoch,
                         size_t *order);
/* Trains any model (model_iface.h). m's hook slot is rf_train's while it runs. */
int rf_train_model(const rf_train_opts *o, const rf_dataset *train, rf_model *m,
                   rf_train_result *res);
/* rf_train_model on a BERT classifier (the caller keeps m). */
int rf_train(const rf_train_opts *o, const rf_dataset *train, rf_bert *m, rf_train_result *res);

/* Writes an HF folder: the model's config.json and model.safetensors
 * (rf_model_save), and the tokenizer files found in src_dir (if any:
 * tokenizer.json, vocab.txt, tokenizer_config.json, special_tokens_map.json,
 * and for a causal LM also vocab.json, merges.txt, generation_config.json). */
int rf_export_model(const rf_model *m, const char *src_dir, const char *dir);
/* rf_export_model of a BERT classifier (BertForSequenceClassification). */
int rf_export_hf(const rf_bert *m, const char *src_dir, const char *dir);

/* Sets the OpenMP and OpenBLAS thread counts. */
void rf_set_threads(int n);

#endif
