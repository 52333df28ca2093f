/* The trainer driver: see driver.h. */
#include "trainer/driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "trainer/bert_config.h"
#include "trainer/llama_gguf.h"
#include "trainer/lm_data.h"
#include "trainer/lora.h"

static int model_config(const char *model_dir, rf_bert_config *cfg) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    int rc = rf_bert_config_load(path, 0, cfg);
    return rc ? rf_fail_ctx(rc, "model %s", model_dir) : RF_OK;
}

int rf_trainer_max_len(const char *model_dir, int max_len, int *out) {
    rf_model_desc d;
    int rc = rf_model_describe(model_dir, &d);
    if (rc) return rc;
    if (d.task == RF_TASK_CLASSIFY) { /* the classifier's checks, as always */
        rf_bert_config cfg = {0};
        if ((rc = model_config(model_dir, &cfg))) return rc;
    }
    *out = max_len < d.max_positions ? max_len : d.max_positions;
    return RF_OK;
}

/* The spec's task against the model folder's architecture. */
static int check_task(const rf_trainer_spec *s, rf_model_desc *d) {
    int rc = rf_model_describe(s->model, d);
    if (rc) return rc;
    if (d->task == s->task) return RF_OK;
    if (s->task == RF_TASK_CAUSAL_LM)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.task is causal_lm but %s is a '%s' model (gpt2 or llama expected)",
                       s->model, d->arch);
    return rf_fail(RF_ERR_INVALID,
                   "%s is a '%s' causal language model: set trainer.task: causal_lm (task "
                   "classify trains BERT classifiers)",
                   s->model, d->arch);
}

static int check_vocab(const rf_dataset *d, int vocab, const char *model) {
    for (size_t i = 0; i < d->ntokens; i++)
        if (d->tokens[i] >= (uint32_t)vocab)
            return rf_fail(RF_ERR_INVALID,
                           "token id %u is outside the vocabulary of %s (%d ids): data "
                           "tokenized for another model?",
                           d->tokens[i], model, vocab);
    return RF_OK;
}

int rf_trainer_check_group(const rf_trainer_spec *s, const rf_comm *comm) {
    int world = comm ? rf_comm_world(comm) : 1, dp = s->dp > 0 ? s->dp : 1;
    int tp = s->opts.tp > 1 ? s->opts.tp : 1, pp = s->opts.pp > 1 ? s->opts.pp : 1;
    if (tp * pp == 1 && world != dp)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel.dp is %d but the group has %d rank(s) (world size): start "
                       "it with mpirun -np %d, or set dp: %d",
                       dp, world, dp, world);
    if (world != dp * tp * pp)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel: dp %d x tp %d x pp %d = %d rank(s) but the group has %d "
                       "(world size): start it with mpirun -np %d",
                       dp, tp, pp, dp * tp * pp, world, dp * tp * pp);
    return RF_OK;
}

/* The mesh against the model (mesh.h): heads, layers, micro-batches. */
static int check_mesh_model(const rf_trainer_spec *s, const rf_model_desc *d,
                            const rf_bert_config *cfg) {
    rf_tr_parallel p = {.dp = s->dp > 0 ? s->dp : 1,
                        .tp = s->opts.tp > 1 ? s->opts.tp : 1,
                        .pp = s->opts.pp > 1 ? s->opts.pp : 1,
                        .zero = s->opts.zero,
                        .microbatches = s->opts.microbatches > 1 ? s->opts.microbatches : 1,
                        .nstages = s->opts.nstages};
    memcpy(p.stages, s->opts.stages, sizeof p.stages);
    if (p.tp * p.pp * p.microbatches == 1) return RF_OK;
    if (cfg) return rf_tr_parallel_check_model(&p, cfg, s->opts.batch_size);
    return RF_OK; /* a causal model's layers and heads: checked when it is loaded (parallel.c) */
}

int rf_trainer_check(const rf_trainer_spec *s, const rf_dataset *data, const rf_comm *comm) {
    rf_bert_config cfg = {0};
    int k = s->num_labels ? s->num_labels : rf_dataset_num_labels(data);
    int rc = rf_trainer_check_group(s, comm);
    if (rc) return rc;
    rf_model_desc d;
    if ((rc = check_task(s, &d))) return rc;
    if (s->task == RF_TASK_CAUSAL_LM) {
        if ((rc = check_mesh_model(s, &d, NULL))) return rc;
        if (!data->tflags)
            return rf_fail(RF_ERR_INVALID, "trainer: task causal_lm needs causal-LM rows "
                                           "(rf_lm_data_load, lm_data.h)");
        return check_vocab(data, d.vocab, s->model);
    }
    rc = k < 2 ? rf_fail(RF_ERR_INVALID,
                         "trainer: the training data has %d label(s); need at least 2 classes", k)
               : RF_OK;
    if (!rc) rc = model_config(s->model, &cfg);
    if (!rc) rc = check_mesh_model(s, &d, &cfg);
    if (!rc) rc = check_vocab(data, cfg.vocab_size, s->model);
    return rc;
}

int rf_trainer_drive(const rf_trainer_spec *s, const rf_dataset *data,
                     const rf_trainer_hooks *hooks, rf_train_result *res) {
    static const rf_trainer_hooks none = {0};
    const rf_trainer_hooks *h = hooks ? hooks : &none;
    rf_train_result r = {0};
    rf_model *m = NULL;
    bool causal = s->task == RF_TASK_CAUSAL_LM;
    int k = causal ? 0 : s->num_labels ? s->num_labels : rf_dataset_num_labels(data);
    int rc = rf_trainer_check(s, data, h->comm);
    if (rc) return rc;
    if (causal)
        rf_info("trainer", "%zu training rows of at most %d tokens, %zu tokens (%zu skipped)",
                data->n, s->max_len, data->ntokens, data->skipped);
    else
        rf_info("trainer", "%zu training sequences (%zu skipped), %d labels", data->n,
                data->skipped, k);
    if (s->threads > 0) rf_set_threads(s->threads);
    const rf_backend *be;
    if ((rc = rf_backend_for(s->device, &be))) return rc;
    rf_model_load_opts lo = {.num_labels = k, .seed = s->opts.seed};
    if (s->lora) { /* the adapter over the frozen model (lora.h) */
        if ((rc = rf_model_load_lora(s->model, &s->lora_cfg, be, s->opts.seed, &m))) return rc;
        rf_model_blocks bl;
        if (!rf_model_blocks_of(m, &bl))
            rf_info("trainer", "LoRA: rank %d, alpha %g, %zu adapter parameters, %s base",
                    s->lora_cfg.rank, (double)s->lora_cfg.alpha, bl.nparams,
                    rf_lora_base_name(s->lora_cfg.base));
    } else if ((rc = rf_model_load(s->model, &lo, be, &m))) {
        return rc;
    }
    rf_train_opts o = s->opts;
    o.cancel = h->cancel;
    o.on_checkpoint = h->on_checkpoint;
    o.on_checkpoint_model = h->on_checkpoint_model;
    o.user = h->user;
    o.comm = h->comm;
    int rank = h->comm ? rf_comm_rank(h->comm) : 0;
    rc = rf_train_model(&o, data, m, &r);
    if (!rc && h->stats) {
        rf_stats_set(h->stats, "trainer.steps", r.steps);
        rf_stats_set(h->stats, "trainer.sequences", (int64_t)data->n);
        rf_stats_set(h->stats, "trainer.tokens", (int64_t)r.tokens);
        rf_stats_set_real(h->stats, "trainer.last_loss", r.last_loss);
        rf_stats_set_real(h->stats, "trainer.tokens_per_s", r.tokens_per_s);
    }
    if (!rc && !r.finished)
        rf_info("trainer", "stopped at step %ld before the end; state kept, rerun to resume",
                r.steps);
    if (!rc && r.finished && s->export_dir && rank == 0) {
        /* a GGUF keeps its tokenizer in its metadata: no files to copy */
        char *gguf = NULL;
        if (!(rc = rf_llama_gguf_path(s->model, &gguf)) && gguf)
            rf_info("trainer",
                    "export: the base is the GGUF %s; its tokenizer lives in the file's metadata, "
                    "so %s holds the adapter without tokenizer files",
                    gguf, s->export_dir);
        if (!rc) rc = rf_export_model(m, gguf ? NULL : s->model, s->export_dir);
        free(gguf);
        if (!rc)
            rf_info("trainer", "exported %s (loss %.4f, %.0f tokens/s)", s->export_dir, r.last_loss,
                    r.tokens_per_s);
    }
    rf_model_free(m);
    if (res) *res = r;
    return rc;
}

int rf_trainer_run(const rf_trainer_spec *s, const rf_trainer_hooks *hooks, rf_train_result *res) {
    rf_dataset train = {0};
    int max_len;
    if (!s->train) return rf_fail(RF_ERR_INVALID, "trainer.train: no training data given");
    int rc = rf_trainer_check_group(s, hooks ? hooks->comm : NULL);
    rf_model_desc d;
    if (!rc) rc = check_task(s, &d);
    if (!rc) rc = rf_trainer_max_len(s->model, s->max_len, &max_len);
    if (!rc && s->task == RF_TASK_CAUSAL_LM)
        rc = rf_lm_data_load(&train, s->train, s->model, max_len, d.eos_token_id,
                             hooks ? hooks->stats : NULL, "trainer");
    else if (!rc)
        rc = rf_dataset_load(&train, s->train, s->model, max_len, hooks ? hooks->stats : NULL,
                             "trainer");
    if (!rc) rc = rf_trainer_drive(s, &train, hooks, res);
    rf_dataset_free(&train);
    return rc;
}
