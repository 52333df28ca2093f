/* The trainer stage of `refinery run` (order 40, after the stream has ended).
 * Section `trainer:` takes the keys of services/trainer/spec.h; defaults here:
 *   train   <run_dir>/tokenizer/train   (token shards written by the tokenizer stage)
 *   output  <run_dir>/trainer           (checkpoint.bin, train.json)
 *   export  <run_dir>/model             (the fine-tuned Hugging Face folder)
 *   threads the runner's thread count
 * Rerunning into the same run directory resumes from the checkpoint.
 * Under mpirun the pipeline hands the group over with
 * rf_trainer_stage_set_group (driver.h); every rank runs this stage. */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "common/stage.h"
#include "pipeline/stages.h"
#include "trainer/driver.h"

typedef struct trainer_stage {
    rf_trainer_spec spec;
    rf_run_ctx *ctx;
    char *train, *output, *export_dir;
} trainer_stage;

static void trainer_close(void *state) {
    trainer_stage *t = state;
    if (!t) return;
    free(t->train);
    free(t->output);
    free(t->export_dir);
    free(t);
}

static int trainer_open(const rf_cfg *section, rf_run_ctx *ctx, void **state) {
    trainer_stage *t = calloc(1, sizeof *t);
    if (!t) return RF_ERR_NOMEM;
    int rc = rf_trainer_spec_parse(section, &t->spec);
    if (rc) {
        trainer_close(t);
        return rc;
    }
    t->ctx = ctx;
    if (asprintf(&t->train, "%s/tokenizer/train", ctx->run_dir) < 0 ||
        asprintf(&t->output, "%s/trainer", ctx->run_dir) < 0 ||
        asprintf(&t->export_dir, "%s/model", ctx->run_dir) < 0) {
        trainer_close(t);
        return RF_ERR_NOMEM;
    }
    rf_trainer_spec *s = &t->spec;
    if (!s->train) s->train = t->train;
    if (!s->output) s->output = t->output;
    if (!s->export_dir) s->export_dir = t->export_dir;
    if (!s->threads) s->threads = ctx->threads;
    s->opts.out_dir = s->output;
    *state = t;
    return RF_OK;
}

static rf_comm *stage_group; /* set by the pipeline for `refinery run` under mpirun */

void rf_trainer_stage_set_group(rf_comm *comm) {
    stage_group = comm;
}

static int trainer_run(void *state) {
    trainer_stage *t = state;
    rf_trainer_hooks h = {.cancel = t->ctx->cancel, .stats = t->ctx->stats, .comm = stage_group};
    return rf_trainer_run(&t->spec, &h, NULL);
}

const rf_stage_ops rf_trainer_stage = {
    .name = "trainer",
    .order = 40,
    .keys = rf_trainer_spec_keys,
    .open = trainer_open,
    .run = trainer_run,
    .close = trainer_close,
};
