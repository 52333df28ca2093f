#include "evaluator/evaluate.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"
#include "common/log.h"
#include "evaluator/lm_loss.h"
#include "evaluator/predict.h"
#include "evaluator/predictions.h"

int rf_evaluate_ex(rf_bert *m, const rf_dataset *d, int batch_size, const rf_eval_sink *sink,
                   rf_metrics *out) {
    int K = m->cfg.num_labels, rc = rf_metrics_init(out, K);
    if (rc) return rc;
    size_t *idx = malloc((size_t)batch_size * sizeof *idx);
    int32_t *pred = malloc((size_t)batch_size * sizeof *pred);
    float *loss = malloc((size_t)batch_size * sizeof *loss);
    float *probs = malloc((size_t)batch_size * K * sizeof *probs);
    rf_batch_buf bb = {0};
    if (!idx || !pred || !loss || !probs) rc = RF_ERR_NOMEM;
    size_t i = 0;
    while (!rc && i < d->n) {
        int nb = 0;
        for (; i < d->n && nb < batch_size; i++) {
            if (d->label[i] < 0) continue;
            if (d->label[i] >= K) {
                rc = rf_fail(RF_ERR_INVALID, "eval: sequence %zu has label %d, the model has %d", i,
                             d->label[i], K);
                break;
            }
            idx[nb++] = i;
        }
        if (rc || nb == 0) break;
        if ((rc = rf_predict_batch(m, d, idx, nb, &bb, pred, probs, loss))) break;
        for (int r = 0; r < nb && !rc; r++) {
            rf_metrics_add(out, d->label[idx[r]], pred[r], loss[r]);
            if (sink && sink->example)
                rc = sink->example(sink->user, d, idx[r], d->label[idx[r]], pred[r],
                                   probs + (size_t)r * K, K);
        }
    }
    free(idx);
    free(pred);
    free(loss);
    free(probs);
    rf_batch_buf_free(&bb);
    if (rc) rf_metrics_free(out);
    return rc;
}

int rf_evaluate(rf_bert *m, const rf_dataset *d, int batch_size, rf_metrics *out) {
    return rf_evaluate_ex(m, d, batch_size, NULL, out);
}

/* rf_evaluate_model on the backend of device (NULL: the CPU). */
static int evaluate_on(const char *device, const char *model_dir, int max_len, int batch_size,
                       rf_eval_load_fn load, void *user, const rf_eval_sink *sink, rf_dataset *d,
                       rf_metrics *mt) {
    rf_bert *m = NULL;
    const rf_backend *be;
    int rc = rf_backend_for(device, &be);
    if (rc) return rc;
    if ((rc = rf_bert_load(model_dir, 0, 0, be, &m))) return rf_fail_ctx(rc, "model %s", model_dir);
    if (max_len > m->cfg.max_position) max_len = m->cfg.max_position;
    rc = load(user, max_len, d);
    if (!rc && (rc = rf_evaluate_ex(m, d, batch_size, sink, mt)))
        rc = rf_fail_ctx(rc, "evaluating %s", model_dir);
    rf_bert_free(m);
    return rc;
}

int rf_evaluate_model(const char *model_dir, int max_len, int batch_size, rf_eval_load_fn load,
                      void *user, const rf_eval_sink *sink, rf_dataset *d, rf_metrics *mt) {
    return evaluate_on(NULL, model_dir, max_len, batch_size, load, user, sink, d, mt);
}

static int load_files(void *user, int max_len, rf_dataset *d) {
    const rf_eval_opts *o = user;
    int rc = rf_dataset_load(d, o->data, o->model_dir, max_len, NULL, "evaluator");
    if (!rc && d->n == 0)
        rc = rf_fail(RF_ERR_INVALID, "eval: no labelled sequences in %s", o->data);
    return rc;
}

/* A causal LM's folder (trainer.task causal_lm) gets its eval loss and
 * perplexity (lm_loss.h) in place of the classifier's metrics. */
static int evaluate_lm(const rf_eval_opts *o, rf_buf *json) {
    rf_buf b = RF_BUF_INIT;
    if (o->predictions_path)
        rf_info("evaluator", "a causal LM has no per-example predictions; %s not written",
                o->predictions_path);
    int rc = rf_lm_evaluate_path(o->model_dir, o->data, o->max_len, o->batch_size, o->samples, &b);
    if (!rc && o->report_path) {
        rc = rf_write_file_atomic(o->report_path, b.data, b.len);
        if (rc) rc = rf_fail_ctx(rc, "eval: cannot write %s", o->report_path);
    }
    if (!rc && json) rc = rf_buf_append(json, b.data, b.len);
    rf_buf_free(&b);
    return rc;
}

int rf_evaluate_run(const rf_eval_opts *o, rf_buf *json) {
    rf_model_desc md;
    if (rf_model_describe(o->model_dir, &md) == RF_OK && md.task == RF_TASK_CAUSAL_LM)
        return evaluate_lm(o, json);
    rf_dataset d = {0};
    rf_metrics mt = {0};
    rf_pred_writer *pw = NULL;
    rf_buf b = RF_BUF_INIT;
    double t0 = rf_now();
    int rc = RF_OK;
    if (o->predictions_path)
        rc = rf_pred_writer_open(o->predictions_path, o->data, o->model_dir, &pw);
    rf_eval_sink sink = {rf_pred_writer_example, pw};
    if (!rc)
        rc = evaluate_on(o->device, o->model_dir, o->max_len, o->batch_size, load_files, (void *)o,
                         pw ? &sink : NULL, &d, &mt);
    if (!rc) rc = rf_metrics_to_json(&mt, &b);
    if (!rc) {
        b.len--; /* reopen the object to add provenance */
        rc = rf_buf_printf(&b, ",\"skipped\":%zu,\"seconds\":%.3f,\"model\":", d.skipped,
                           rf_now() - t0);
        if (!rc) rc = rf_buf_append_json_str(&b, o->model_dir, strlen(o->model_dir));
        if (!rc) rc = rf_buf_puts(&b, ",\"data\":");
        if (!rc) rc = rf_buf_append_json_str(&b, o->data, strlen(o->data));
        if (!rc) rc = rf_buf_puts(&b, "}\n");
    }
    if (!rc && pw) rc = rf_pred_writer_commit(pw);
    if (!rc && o->report_path) {
        rc = rf_write_file_atomic(o->report_path, b.data, b.len);
        if (rc) rc = rf_fail_ctx(rc, "eval: cannot write %s", o->report_path);
    }
    if (!rc && json) rc = rf_buf_append(json, b.data, b.len);
    rf_pred_writer_free(pw);
    rf_buf_free(&b);
    rf_metrics_free(&mt);
    rf_dataset_free(&d);
    return rc;
}

int rf_evaluate_path(const char *model_dir, const char *data, int max_len, int batch_size,
                     const char *report_path, rf_buf *json) {
    rf_eval_opts o = {.model_dir = model_dir,
                      .data = data,
                      .max_len = max_len,
                      .batch_size = batch_size,
                      .report_path = report_path};
    return rf_evaluate_run(&o, json);
}
