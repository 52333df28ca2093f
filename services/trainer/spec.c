#include "trainer/spec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "trainer/backend.h"
#include "trainer/llama_gguf.h"
#include "trainer/mesh.h"

const char *const rf_trainer_spec_keys[] = {"model",        "train",
                                            "eval",         "output",
                                            "export",       "num_labels",
                                            "epochs",       "max_steps",
                                            "batch_size",   "grad_accum",
                                            "max_len",      "lr",
                                            "weight_decay", "warmup_ratio",
                                            "warmup_steps", "clip_norm",
                                            "beta1",        "beta2",
                                            "eps",          "seed",
                                            "dropout",      "checkpoint_every",
                                            "log_every",    "resume",
                                            "threads",      "eval_batch_size",
                                            "shuffle",      "class_weights",
                                            "sampler",      "parallel",
                                            "stop_after",   "cache",
                                            "retries",      "resources",
                                            "device",       "task",
                                            "lora",         NULL};

/* "spec.yaml:31: trainer.class_weights[1]: " (no line for environment values). */
static int cw_fail(const rf_cfg *v, const char *what, const char *got) {
    if (rf_cfg_line(v))
        return rf_fail(RF_ERR_INVALID, "%s:%d: %s: %s, got '%s'", rf_cfg_source(v), rf_cfg_line(v),
                       rf_cfg_path(v), what, got);
    return rf_fail(RF_ERR_INVALID, "%s: %s: %s, got '%s'", rf_cfg_source(v), rf_cfg_path(v), what,
                   got);
}

/* trainer.class_weights: absent or "none", "balanced", or a list of
 * num_labels non-negative numbers, not all zero. */
static int parse_class_weights(const rf_cfg *n, int num_labels, rf_train_opts *o) {
    static const char what[] = "expected 'balanced', 'none' or a list of one non-negative "
                               "weight per label";
    const rf_cfg *v = rf_cfg_get(n, "class_weights");
    o->class_weighting = RF_CW_NONE;
    if (!v) return RF_OK;
    if (rf_cfg_kind_of(v) == RF_CFG_SCALAR) {
        const char *x = rf_cfg_scalar(v);
        if (strcmp(x, "balanced") == 0)
            o->class_weighting = RF_CW_BALANCED;
        else if (strcmp(x, "none") != 0)
            return cw_fail(v, what, x);
        return RF_OK;
    }
    if (rf_cfg_kind_of(v) != RF_CFG_SEQ) return cw_fail(v, what, "(a mapping)");
    size_t len = rf_cfg_len(v);
    char msg[160];
    if (len == 0 || len > RF_TRAIN_MAX_CLASS_WEIGHTS ||
        (num_labels > 0 && len != (size_t)num_labels)) {
        char got[32];
        snprintf(got, sizeof got, "%zu weight(s)", len);
        if (num_labels > 0)
            snprintf(msg, sizeof msg, "expected %d weights (num_labels)", num_labels);
        else
            snprintf(msg, sizeof msg, "expected one weight per label (1 to %d)",
                     RF_TRAIN_MAX_CLASS_WEIGHTS);
        return cw_fail(v, msg, got);
    }
    double total = 0;
    for (size_t i = 0; i < len; i++) {
        const rf_cfg *e = rf_cfg_at(v, i);
        const char *x = rf_cfg_scalar(e);
        if (!x)
            return cw_fail(e, "expected a non-negative number (at most 1e6)",
                           "(a mapping or list)");
        char *end;
        errno = 0;
        double w = strtod(x, &end);
        if (!x[0] || errno || *end || !isfinite(w) || w < 0 || w > 1e6)
            return cw_fail(e, "expected a non-negative number (at most 1e6)", x);
        o->class_weights[i] = (float)w;
        total += w;
    }
    if (!(total > 0)) return cw_fail(v, "expected at least one weight above 0", "all zero");
    o->class_weighting = RF_CW_LIST;
    o->n_class_weights = (int)len;
    return RF_OK;
}

int rf_trainer_spec_parse(const rf_cfg *n, rf_trainer_spec *s) {
    int64_t i64;
    double d;
    bool b;
    int rc;
    *s = (rf_trainer_spec){0};
    s->opts = rf_train_defaults();
    rf_train_opts *o = &s->opts;
    if (!n) return rf_fail(RF_ERR_INVALID, "trainer: missing section");
    if ((rc = rf_cfg_check_keys(n, rf_trainer_spec_keys))) return rc;
#define STR(key, dst, def)                                                                         \
    if ((rc = rf_cfg_str(n, key, def, &dst))) return rc
#define INT(key, def, lo, hi, dst)                                                                 \
    do {                                                                                           \
        if ((rc = rf_cfg_int(n, key, def, lo, hi, &i64))) return rc;                               \
        dst = i64;                                                                                 \
    } while (0)
#define REAL(key, def, lo, hi, dst)                                                                \
    do {                                                                                           \
        if ((rc = rf_cfg_real(n, key, def, lo, hi, &d))) return rc;                                \
        dst = d;                                                                                   \
    } while (0)
    static const char *const tasks[] = {"classify", "causal_lm", NULL};
    int task;
    if ((rc = rf_cfg_enum(n, "task", tasks, 0, &task))) return rc;
    s->task = task == 1 ? RF_TASK_CAUSAL_LM : RF_TASK_CLASSIFY;
    STR("model", s->model, NULL);
    STR("train", s->train, NULL);
    STR("eval", s->eval, NULL);
    STR("output", s->output, NULL);
    STR("export", s->export_dir, NULL);
    STR("device", s->device, "cpu");
    if ((rc = rf_device_check(s->device))) return rc;
    INT("num_labels", 0, 0, 4096, s->num_labels);
    INT("max_len", 128, 2, 4096, s->max_len);
    INT("threads", 0, 0, 256, s->threads);
    INT("eval_batch_size", 64, 1, 4096, s->eval_batch_size);
    INT("epochs", 1, 1, 1000, o->epochs);
    INT("max_steps", 0, 0, 1000000000, o->max_steps);
    INT("batch_size", 32, 1, 65536, o->batch_size);
    INT("grad_accum", 1, 1, 65536, o->grad_accum);
    INT("seed", 42, 0, INT64_MAX, o->seed);
    INT("checkpoint_every", 0, 0, 1000000000, o->checkpoint_every);
    INT("stop_after", 0, 0, 1000000000, o->stop_after);
    INT("log_every", 50, 0, 1000000000, o->log_every);
    INT("warmup_steps", -1, -1, 1000000000, o->optim.warmup_steps);
    REAL("lr", 5e-5, 0, 10, o->optim.lr);
    REAL("weight_decay", 0.0, 0, 10, o->optim.weight_decay);
    REAL("warmup_ratio", 0.0, 0, 1, o->warmup_ratio);
    REAL("clip_norm", 1.0, 0, 1e9, o->optim.clip_norm);
    REAL("beta1", 0.9, 0, 0.999999, o->optim.beta1);
    REAL("beta2", 0.999, 0, 0.999999999, o->optim.beta2);
    REAL("eps", 1e-8, 0, 1, o->optim.eps);
    if ((rc = rf_cfg_bool(n, "dropout", true, &b))) return rc;
    o->dropout = b;
    if ((rc = rf_cfg_bool(n, "shuffle", true, &b))) return rc;
    o->shuffle = b;
    if ((rc = rf_cfg_bool(n, "resume", true, &b))) return rc;
    o->resume = b;
    if ((rc = parse_class_weights(n, s->num_labels, o))) return rc;
    static const char *const samplers[] = {"shuffle", "balanced", NULL};
    int sampler;
    if ((rc = rf_cfg_enum(n, "sampler", samplers, 0, &sampler))) return rc;
    o->balanced_sampler = sampler == 1;
    if (o->balanced_sampler && !o->shuffle)
        return rf_fail(RF_ERR_INVALID, "trainer.sampler: balanced draws at random; it cannot be "
                                       "combined with shuffle: false");
    /* parallel: {dp, tp, pp, zero, microbatches, stages} (mesh.h) */
    rf_tr_parallel par;
    if ((rc = rf_tr_parallel_parse(n, &par))) return rc;
    s->dp = par.dp;
    o->zero = par.zero;
    o->tp = par.tp;
    o->pp = par.pp;
    o->microbatches = par.microbatches;
    o->nstages = par.nstages;
    memcpy(o->stages, par.stages, sizeof o->stages);
    /* data, tensor and pipeline parallelism run on any backend (NCCL on
     * device memory) */
#undef STR
#undef INT
#undef REAL
    if (s->task == RF_TASK_CAUSAL_LM) { /* what only a classifier has */
        static const char *const cls_only[] = {"num_labels", "class_weights", "sampler"};
        for (size_t i = 0; i < sizeof cls_only / sizeof *cls_only; i++)
            if (rf_cfg_get(n, cls_only[i]))
                return rf_fail(RF_ERR_INVALID,
                               "trainer.%s: applies to task: classify only (this is causal_lm)",
                               cls_only[i]);
    }
    /* a llama.cpp GGUF model (a .gguf file or a folder holding one): LoRA only */
    char *gpath = NULL;
    if (s->model && (rc = rf_llama_gguf_path(s->model, &gpath))) return rc;
    bool gguf = gpath != NULL;
    free(gpath);
    const rf_cfg *lora = rf_cfg_get(n, "lora");
    if (gguf && !lora)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "trainer.model: %s names a GGUF file; the trainer fine-tunes a GGUF with "
                       "trainer.lora only (full fine-tuning of a llama.cpp file is out of scope: "
                       "use the model's Hugging Face folder)",
                       s->model);
    if (lora) {
        if (s->task != RF_TASK_CAUSAL_LM)
            return rf_fail(RF_ERR_INVALID, "trainer.lora: applies to task: causal_lm only");
        if (rf_cfg_kind_of(lora) != RF_CFG_MAP)
            return rf_fail(RF_ERR_INVALID, "trainer.lora: expected a mapping {rank, alpha, "
                                           "dropout, targets, base}");
        if ((rc = rf_lora_config_parse(lora, &s->lora_cfg))) return rc;
        /* a path not here yet (a spec checked before its model is fetched):
         * rf_model_load_lora refuses q4_1 over a Hugging Face folder */
        struct stat st;
        if (s->lora_cfg.base == RF_QT_Q4_1 && !gguf && s->model && stat(s->model, &st) == 0)
            return rf_fail(RF_ERR_UNSUPPORTED,
                           "trainer.lora.base: q4_1 keeps a GGUF file's blocks, and trainer.model "
                           "%s is not a GGUF (a Hugging Face folder loads as fp32, int8 or nf4)",
                           s->model ? s->model : "(absent)");
        if (o->zero > 1)
            return rf_fail(RF_ERR_UNSUPPORTED,
                           "trainer.lora: parallel.zero %d shards per unit; use zero 0 or 1 (the "
                           "adapter is one unit)",
                           o->zero);
        if (o->tp > 1 || o->pp > 1)
            return rf_fail(RF_ERR_UNSUPPORTED,
                           "trainer.lora: parallel tp %d x pp %d (the adapter trains with data "
                           "parallelism only; use dp)",
                           o->tp, o->pp);
        if (s->eval)
            return rf_fail(RF_ERR_UNSUPPORTED, "trainer.eval: the export of a LoRA run is a PEFT "
                                               "adapter, which the evaluator does not load yet");
        s->lora = true;
    }
    if (!s->model)
        return rf_fail(RF_ERR_INVALID, "trainer.model: required (a Hugging Face model folder, "
                                       "or a GGUF file with trainer.lora)");
    return RF_OK;
}
