/* The evaluator stage of `refinery run` (order 50). Section `evaluator:`:
 *   model       default <run_dir>/model (the trainer's export)
 *   data        default <run_dir>/tokenizer/eval (held-out token shards)
 *   max_len     default 128 (a causal_lm run: trainer.max_len, so the eval rows
 *               are packed as the training rows were)
 *   batch_size  default 64
 *   predictions default <run_dir>/evaluator/predictions.jsonl: one JSON line
 *               per example (evaluator/predictions.h); "" writes none
 *   samples     a causal_lm run: sample generations in the report (default 3,
 *               0: none; evaluator/lm_loss.h rf_lm_samples)
 *   answers     a causal_lm run on SFT data (the eval shards have a .mask): the
 *               generated-answer accuracy on the first N held-out conversations
 *               (default 200, 0: none; evaluator/answers.h), of the trained model
 *               and of trainer.model before training (answers_before). A LoRA
 *               run's export (a PEFT adapter) is scored over trainer.model: the
 *               answers on SFT data, else the held-out documents' perplexity
 *               before and after (documents, documents_before) over the first
 *               `documents` held-out documents (default 200, 0: all).
 * Writes <run_dir>/evaluator/report.json and sets evaluator.* counters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/json.h"
#include "common/log.h"
#include "common/stage.h"
#include "pipeline/stages.h"
#include "common/sys.h"
#include "common/obs.h"
#include "evaluator/evaluate.h"

typedef struct eval_stage {
    rf_run_ctx *ctx;
    const char *model, *data, *preds;
    const char *device; /* trainer.device: the evaluator follows it */
    char *model_def, *data_def, *preds_def, *dir;
    int max_len, batch, samples, answers, documents;
    const char *base; /* a causal_lm run: trainer.model, the model before training */
} eval_stage;

static void eval_close(void *state) {
    eval_stage *e = state;
    if (!e) return;
    free(e->model_def);
    free(e->data_def);
    free(e->preds_def);
    free(e->dir);
    free(e);
}

static int eval_open(const rf_cfg *sec, rf_run_ctx *ctx, void **state) {
    eval_stage *e = calloc(1, sizeof *e);
    int64_t max_len = 128, batch = 64;
    if (!e) return RF_ERR_NOMEM;
    e->ctx = ctx;
    int rc = RF_OK;
    if (asprintf(&e->model_def, "%s/model", ctx->run_dir) < 0 ||
        asprintf(&e->data_def, "%s/tokenizer/eval", ctx->run_dir) < 0 ||
        asprintf(&e->dir, "%s/evaluator", ctx->run_dir) < 0 ||
        asprintf(&e->preds_def, "%s/predictions.jsonl", e->dir) < 0)
        rc = RF_ERR_NOMEM;
    if (!rc && sec) rc = rf_cfg_check_keys(sec, rf_evaluator_keys);
    if (!rc) rc = rf_cfg_str(sec, "model", e->model_def, &e->model);
    if (!rc) rc = rf_cfg_str(sec, "data", e->data_def, &e->data);
    if (!rc) rc = rf_cfg_str(sec, "predictions", e->preds_def, &e->preds);
    int64_t def_len = 128;
    const rf_cfg *tr = ctx->spec ? rf_cfg_get(ctx->spec, "trainer") : NULL;
    const char *task = NULL;
    if (!rc && tr && rf_cfg_str(tr, "task", "classify", &task) == RF_OK && task &&
        strcmp(task, "causal_lm") == 0) {
        rc = rf_cfg_int(tr, "max_len", 128, 2, 4096, &def_len);
        if (!rc) rc = rf_cfg_str(tr, "model", NULL, &e->base);
    }
    int64_t answers = 200;
    if (!rc) rc = rf_cfg_int(sec, "answers", 200, 0, 1 << 30, &answers);
    e->answers = (int)answers;
    int64_t documents = 200;
    if (!rc) rc = rf_cfg_int(sec, "documents", 200, 0, 1 << 30, &documents);
    e->documents = (int)documents;
    if (!rc) rc = rf_cfg_int(sec, "max_len", def_len, 2, 4096, &max_len);
    if (!rc) rc = rf_cfg_int(sec, "batch_size", 64, 1, 4096, &batch);
    int64_t samples = 3;
    if (!rc) rc = rf_cfg_int(sec, "samples", 3, 0, 100, &samples);
    if (!rc)
        rc = rf_cfg_str(ctx->spec ? rf_cfg_get(ctx->spec, "trainer") : NULL, "device", "cpu",
                        &e->device);
    if (rc) {
        eval_close(e);
        return rc;
    }
    e->max_len = (int)max_len;
    e->batch = (int)batch;
    e->samples = (int)samples;
    *state = e;
    return RF_OK;
}

static int eval_run(void *state) {
    eval_stage *e = state;
    char path[4096];
    int rc = rf_mkdir_p(e->dir);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/report.json", e->dir);
    rf_buf json = RF_BUF_INIT;
    rf_eval_opts eo = {.model_dir = e->model,
                       .data = e->data,
                       .max_len = e->max_len,
                       .batch_size = e->batch,
                       .report_path = path,
                       .predictions_path = e->preds && e->preds[0] ? e->preds : NULL,
                       .device = e->device,
                       .samples = e->samples,
                       .answers = e->answers,
                       .documents = e->documents,
                       .base = e->base};
    rc = rf_evaluate_run(&eo, &json);
    if (!rc) {
        rf_json_doc *d = rf_json_doc_new();
        const rf_json *r;
        if (d && rf_json_parse(d, json.data, json.len, &r) == 0) {
            const rf_json *ppl = rf_json_get(r, "perplexity"), *el = rf_json_get(r, "eval_loss");
            const rf_json *tk = rf_json_get(r, "tokens");
            const rf_json *aa = rf_json_get(rf_json_get(r, "answers"), "accuracy");
            const rf_json *ab = rf_json_get(rf_json_get(r, "answers_before"), "accuracy");
            const rf_json *pa = rf_json_get(rf_json_get(r, "documents"), "perplexity");
            const rf_json *pb = rf_json_get(rf_json_get(r, "documents_before"), "perplexity");
            if (aa) rf_stats_set_real(e->ctx->stats, "evaluator.answer_accuracy", aa->num);
            if (ab) rf_stats_set_real(e->ctx->stats, "evaluator.answer_accuracy_before", ab->num);
            if (pa) rf_stats_set_real(e->ctx->stats, "evaluator.perplexity", pa->num);
            if (pb) rf_stats_set_real(e->ctx->stats, "evaluator.perplexity_before", pb->num);
            if (pa && !ppl) {
                rf_info("evaluator", "%s: perplexity %.4f (before training %.4f)", e->data, pa->num,
                        pb ? pb->num : -1.0);
                rf_json_doc_free(d);
                rf_buf_free(&json);
                return rc;
            }
            if (aa && !ppl) { /* a LoRA run's adapter: answers only */
                rf_info("evaluator", "%s: answer accuracy %.4f (before fine-tuning %.4f)", e->data,
                        aa->num, ab ? ab->num : -1.0);
                rf_json_doc_free(d);
                rf_buf_free(&json);
                return rc;
            }
            if (ppl && el) { /* a causal LM (lm_loss.h) */
                rf_stats_set_real(e->ctx->stats, "evaluator.eval_loss", el->num);
                rf_stats_set_real(e->ctx->stats, "evaluator.perplexity", ppl->num);
                if (tk) rf_stats_set(e->ctx->stats, "evaluator.tokens", (int64_t)tk->num);
                rf_info("evaluator", "%s: eval loss %.4f perplexity %.2f on %.0f predicted tokens",
                        e->data, el->num, ppl->num, tk ? tk->num : 0);
                rf_json_doc_free(d);
                rf_buf_free(&json);
                return rc;
            }
            const rf_json *acc = rf_json_get(r, "accuracy"), *mac = rf_json_get(r, "macro");
            const rf_json *f1 = rf_json_get(mac, "f1"), *n = rf_json_get(r, "examples");
            if (acc) rf_stats_set_real(e->ctx->stats, "evaluator.accuracy", acc->num);
            if (f1) rf_stats_set_real(e->ctx->stats, "evaluator.macro_f1", f1->num);
            if (n) rf_stats_set(e->ctx->stats, "evaluator.examples", (int64_t)n->num);
            rf_obs_eval_done(acc ? acc->num : 0, f1 ? f1->num : 0, n ? n->num : 0);
            rf_info("evaluator", "%s: accuracy %.4f macro-F1 %.4f on %.0f examples", e->data,
                    acc ? acc->num : 0, f1 ? f1->num : 0, n ? n->num : 0);
        }
        rf_json_doc_free(d);
    }
    rf_buf_free(&json);
    return rc;
}

const rf_stage_ops rf_evaluator_stage = {
    .name = "evaluator",
    .order = 50,
    .keys = rf_evaluator_keys,
    .open = eval_open,
    .run = eval_run,
    .close = eval_close,
};
