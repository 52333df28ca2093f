/* The one trainer driver, shared by `refinery train`, the trainer stage of
 * `refinery run` and the trainer service: each caller only adapts where the
 * training data comes from (shards/JSONL named by the spec, or the service's
 * intake file) and where progress goes (stats, or the service's checkpoint
 * hook). No network code here.
 *
 * Order of a run: the caller loads the data with the max_len that
 * rf_trainer_max_len returns (the spec's, capped at the model's
 * max_position_embeddings), then rf_trainer_drive checks the label count and
 * that every token id is inside the model's vocabulary, loads the model,
 * trains (resuming per the options) and, when training reached its last step
 * and spec->export_dir is set, exports the Hugging Face folder. */
#ifndef RF_TR_DRIVER_H
#define RF_TR_DRIVER_H

#include "common/stats.h"
#include "trainer/dataset.h"
#include "trainer/spec.h"
#include "trainer/train.h"

typedef struct rf_trainer_hooks {
    volatile int *cancel; /* set to stop at the next step (a checkpoint is written) */
    rf_stats *stats;      /* trainer.steps, .sequences, .tokens, .last_loss, .tokens_per_s */
    /* Called at each checkpoint (rf_train_opts.on_checkpoint), user passed back. */
    int (*on_checkpoint)(void *user, const rf_bert *m, const rf_train_checkpoint *c);
    int (*on_checkpoint_model)(void *user, const rf_model *m, const rf_train_checkpoint *c);
    void *user;
    /* The data-parallel group (owned by the caller; NULL = one process). Its
     * world size must equal the spec's parallel.dp. Only rank 0 exports. */
    rf_comm *comm;
} rf_trainer_hooks;

/* RF_ERR_INVALID, naming both, when the group's world size (1 for NULL) is
 * not the spec's parallel.dp. Call it before loading anything. */
int rf_trainer_check_group(const rf_trainer_spec *s, const rf_comm *comm);

/* The group the trainer stage of `refinery run` trains with (NULL = one
 * process): set by the pipeline runner, which owns it through the CLI. */
void rf_trainer_stage_set_group(rf_comm *comm);

/* The max_len to load data with: max_len capped at the max_position_embeddings
 * of model_dir/config.json. */
int rf_trainer_max_len(const char *model_dir, int max_len, int *out);

/* The checks rf_trainer_drive makes before it loads the model: the group
 * (rf_trainer_check_group), at least 2 labels, the model's config.json, every
 * token id inside its vocabulary. They depend only on the arguments, so the
 * ranks of a group given the same spec and data agree on them without a
 * collective (the trainer service's group runs them on every rank first). */
int rf_trainer_check(const rf_trainer_spec *s, const rf_dataset *data, const rf_comm *comm);

/* Trains on data (loaded with rf_trainer_max_len's length; sequences without
 * a label are an error of the caller's loading). s->opts is used as given
 * (out_dir, resume), with hooks' cancel and on_checkpoint; s->threads > 0 sets
 * the thread count. res (may be NULL) gets the result; res->finished false
 * means cancelled (state kept, RF_OK). */
int rf_trainer_drive(const rf_trainer_spec *s, const rf_dataset *data,
                     const rf_trainer_hooks *hooks, rf_train_result *res);

/* Loads s->train (shards, directory, JSONL or TSV; tokenized with s->model's
 * tokenizer) with the effective max_len, then rf_trainer_drive. */
int rf_trainer_run(const rf_trainer_spec *s, const rf_trainer_hooks *hooks, rf_train_result *res);

#endif
