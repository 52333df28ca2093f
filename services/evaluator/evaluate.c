#include "evaluator/evaluate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sys.h"
#include "evaluator/answers.h"
#include "evaluator/lm_loss.h"
#include "evaluator/perplexity.h"
#include "evaluator/predict.h"
#include "evaluator/predictions.h"
#include "tokenizer/shard.h"

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

/* ,"<key>":{answers of model (+ adapter)} (answers.h): on the device of
 * o->device without an adapter (merging one runs on the CPU) */
static int add_answers(const rf_eval_opts *o, const char *key, const char *model,
                       const char *adapter, rf_buf *b) {
    rf_lm *lm = NULL;
    rf_answers a;
    const rf_backend *be = rf_backend_cpu();
    int rc = adapter ? RF_OK : rf_backend_for(o->device, &be);
    if (!rc) rc = adapter ? rf_lm_load_adapter(model, adapter, &lm) : rf_lm_load_on(model, be, &lm);
    if (!rc) rc = rf_buf_printf(b, ",\"%s\":", key);
    if (!rc) rc = rf_lm_answers(lm, o->data, o->answers, b, &a);
    if (!rc)
        rf_info("evaluator", "%s: answer accuracy %.4f (%zu of %zu) in %.1f s: %s%s%s", o->data,
                a.accuracy, a.correct, a.n, a.seconds, model, adapter ? " + " : "",
                adapter ? adapter : "");
    rf_lm_free(lm);
    return rc ? rf_fail_ctx(rc, "answers of %s", adapter ? adapter : model) : RF_OK;
}

static bool has_mask(const char *data) {
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s.mask", data);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* ,"<key>":{perplexity of model (+ adapter) over the documents of the shard
 * prefix data, each its own sequence of at most max_len tokens (longer ones
 * in windows of max_len with stride max_len / 2, perplexity.h)} */
static int add_doc_perplexity(const rf_eval_opts *o, const char *key, const char *model,
                              const char *adapter, rf_buf *b) {
    rf_lm *lm = NULL;
    rf_shard *sh = NULL;
    double t0 = rf_now(), nll_sum = 0;
    int64_t tokens = 0, docs = 0;
    int rc = rf_lm_load_adapter(model, adapter, &lm);
    if (!rc) rc = rf_shard_open(o->data, &sh);
    int32_t *ids = NULL;
    size_t cap = 0;
    const rf_shard_info *in = rc ? NULL : rf_shard_get_info(sh);
    for (uint64_t i = 0; !rc && i < in->n_seqs && (o->documents <= 0 || docs < o->documents); i++) {
        rf_shard_seq q;
        if ((rc = rf_shard_get(sh, i, &q)) || q.len < 2) continue;
        if (q.len > cap) {
            int32_t *nb = realloc(ids, q.len * sizeof *nb);
            if (!nb) {
                rc = RF_ERR_NOMEM;
                break;
            }
            ids = nb, cap = q.len;
        }
        for (uint32_t k = 0; k < q.len; k++)
            ids[k] = (int32_t)q.ids[k];
        rf_ppl_opts po = {.max_len = o->max_len};
        rf_ppl_result r;
        if ((rc = rf_perplexity_ids(lm, ids, q.len, &po, &r))) break;
        nll_sum += r.nll_sum, tokens += r.tokens, docs++;
    }
    if (!rc && tokens == 0) rc = rf_fail(RF_ERR_INVALID, "eval: no document of %s", o->data);
    if (!rc)
        rc = rf_buf_printf(b,
                           ",\"%s\":{\"perplexity\":%.6f,\"nll\":%.6f,\"tokens\":%lld,"
                           "\"documents\":%lld,\"max_len\":%d,\"seconds\":%.3f}",
                           key, exp(nll_sum / (double)tokens), nll_sum / (double)tokens,
                           (long long)tokens, (long long)docs, o->max_len, rf_now() - t0);
    if (!rc)
        rf_info("evaluator", "%s: perplexity %.4f on %lld tokens of %lld documents: %s%s%s",
                o->data, exp(nll_sum / (double)tokens), (long long)tokens, (long long)docs, model,
                adapter ? " + " : "", adapter ? adapter : "");
    free(ids);
    rf_shard_close(sh);
    rf_lm_free(lm);
    return rc ? rf_fail_ctx(rc, "perplexity of %s", adapter ? adapter : model) : RF_OK;
}

/* A PEFT adapter folder (a LoRA run's export), scored over its base: on SFT
 * data the answers, on other data the documents' perplexity (each before
 * and after). */
static int evaluate_adapter(const rf_eval_opts *o, rf_buf *json) {
    char *base = o->base ? strdup(o->base) : NULL, *text = NULL, p[4200];
    size_t len;
    int rc = RF_OK;
    snprintf(p, sizeof p, "%s/adapter_config.json", o->model_dir);
    if (!base && rf_read_file(p, 1 << 20, &text, &len) == RF_OK) {
        rf_json_doc *d = rf_json_doc_new();
        const rf_json *r, *v;
        if (d && rf_json_parse(d, text, len, &r) == RF_OK &&
            rf_json_is_str(v = rf_json_get(r, "base_model_name_or_path")))
            base = strndup(v->u.str, v->len);
        rf_json_doc_free(d);
        free(text);
    }
    if (!base)
        rc = rf_fail(RF_ERR_INVALID, "eval: %s is a PEFT adapter and no base model is known",
                     o->model_dir);
    bool sft = has_mask(o->data);
    if (!rc && sft && o->answers <= 0)
        rc = rf_fail(RF_ERR_INVALID,
                     "eval: %s is a PEFT adapter and %s is SFT data: say how many answers to "
                     "score (evaluator.answers, refinery eval --answers N)",
                     o->model_dir, o->data);
    rf_buf b = RF_BUF_INIT;
    double t0 = rf_now();
    if (!rc) rc = rf_buf_puts(&b, "{\"task\":\"causal_lm\",\"adapter\":");
    if (!rc) rc = rf_buf_append_json_str(&b, o->model_dir, strlen(o->model_dir));
    if (!rc) rc = rf_buf_puts(&b, ",\"base\":");
    if (!rc) rc = rf_buf_append_json_str(&b, base, strlen(base));
    if (!rc) rc = rf_buf_puts(&b, ",\"data\":");
    if (!rc) rc = rf_buf_append_json_str(&b, o->data, strlen(o->data));
    if (!rc && sft) rc = add_answers(o, "answers", base, o->model_dir, &b);
    if (!rc && sft) rc = add_answers(o, "answers_before", base, NULL, &b);
    if (!rc && !sft) rc = add_doc_perplexity(o, "documents", base, o->model_dir, &b);
    if (!rc && !sft) rc = add_doc_perplexity(o, "documents_before", base, NULL, &b);
    if (!rc) rc = rf_buf_printf(&b, ",\"seconds\":%.3f}\n", rf_now() - t0);
    if (!rc && o->report_path) {
        rc = rf_write_file_atomic(o->report_path, b.data, b.len);
        if (rc) rc = rf_fail_ctx(rc, "eval: cannot write %s", o->report_path);
    }
    if (!rc && json) rc = rf_buf_append(json, b.data, b.len);
    rf_buf_free(&b);
    free(base);
    return rc;
}

/* A causal LM's folder (trainer.task causal_lm) gets its eval loss and
 * perplexity (lm_loss.h) in place of the classifier's metrics, and on SFT
 * data the answers (answers.h). */
static int evaluate_lm(const rf_eval_opts *o, rf_buf *json) {
    rf_buf b = RF_BUF_INIT;
    if (o->predictions_path)
        rf_info("evaluator", "a causal LM has no per-example predictions; %s not written",
                o->predictions_path);
    /* the eval loss, the samples and the answers run on the device
     * (causal_infer.c's slot path); an adapter's answers on the CPU (it is
     * merged there) */
    int rc = rf_lm_evaluate_path(o->model_dir, o->device, o->data, o->max_len, o->batch_size,
                                 o->samples, &b);
    if (!rc && o->answers > 0 && has_mask(o->data)) {
        b.len -= 2; /* reopen the object: "}\n" */
        rc = add_answers(o, "answers", o->model_dir, NULL, &b);
        if (!rc && o->base) rc = add_answers(o, "answers_before", o->base, NULL, &b);
        if (!rc) rc = rf_buf_puts(&b, "}\n");
    }
    if (!rc && o->report_path) {
        rc = rf_write_file_atomic(o->report_path, b.data, b.len);
        if (rc) rc = rf_fail_ctx(rc, "eval: cannot write %s", o->report_path);
    }
    if (!rc && json) rc = rf_buf_append(json, b.data, b.len);
    rf_buf_free(&b);
    return rc;
}

int rf_evaluate_run(const rf_eval_opts *o, rf_buf *json) {
    char ac[4200];
    struct stat st;
    snprintf(ac, sizeof ac, "%s/adapter_config.json", o->model_dir);
    if (stat(ac, &st) == 0) return evaluate_adapter(o, json);
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
