/* Eval loss and perplexity of a causal LM (lm_loss.h). */
#include "evaluator/lm_loss.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"
#include "evaluator/generate.h"
#include "evaluator/lm.h"
#include "trainer/lm_data.h"

int rf_lm_evaluate(rf_model *m, const rf_dataset *d, int batch_size, rf_lm_eval *out) {
    memset(out, 0, sizeof *out);
    if (!d->tflags) return rf_fail(RF_ERR_INVALID, "eval: causal-LM rows expected (lm_data.h)");
    size_t *idx = malloc((size_t)batch_size * sizeof *idx);
    rf_batch_buf bb = {0};
    double sum = 0;
    int rc = idx ? RF_OK : RF_ERR_NOMEM;
    for (size_t i = 0; !rc && i < d->n; i += (size_t)batch_size) {
        int nb = d->n - i < (size_t)batch_size ? (int)(d->n - i) : batch_size;
        for (int k = 0; k < nb; k++)
            idx[k] = i + (size_t)k;
        if ((rc = rf_batch_collate(&bb, d, idx, nb))) break;
        rf_model_batch b = {.B = bb.B,
                            .T = bb.T,
                            .ids = bb.ids,
                            .valid = bb.valid,
                            .labels = bb.labels,
                            .pos = bb.pos,
                            .seg = bb.seg};
        float loss;
        long counted;
        if ((rc = rf_model_forward(m, &b, false, 0)) || (rc = rf_model_loss(m, &loss, &counted)))
            break;
        sum += (double)loss * (double)counted; /* the batch's summed token loss */
        out->tokens += (uint64_t)counted;
        out->rows += (size_t)nb;
    }
    free(idx);
    rf_batch_buf_free(&bb);
    if (rc) return rc;
    if (!out->tokens) return rf_fail(RF_ERR_INVALID, "eval: no token to predict in the data");
    out->loss = sum / (double)out->tokens;
    out->perplexity = exp(out->loss);
    return RF_OK;
}

/* Appends ,"key":"text of ids[0..n)" (special tokens skipped). */
static int put_text(const rf_lm *lm, const char *key, const int32_t *ids, int n, rf_buf *json) {
    rf_buf t = RF_BUF_INIT;
    int rc = n > 0 ? rf_tok_decode(lm->tok, (const uint32_t *)ids, (size_t)n, true, &t) : RF_OK;
    if (!rc) rc = rf_buf_printf(json, ",\"%s\":", key);
    if (!rc) rc = rf_buf_append_json_str(json, t.data ? t.data : "", t.len);
    rf_buf_free(&t);
    return rc;
}

int rf_lm_samples(const rf_lm *lm, const rf_dataset *d, int n, rf_buf *json) {
    if (n <= 0 || !d->n || !d->tflags) return RF_OK;
    int32_t *ids = malloc(sizeof(int32_t) * (RF_LM_SAMPLE_PROMPT + RF_LM_SAMPLE_NEW));
    if (!ids) return RF_ERR_NOMEM;
    int rc = rf_buf_puts(json, ",\"samples\":[");
    int written = 0;
    for (int k = 0; k < n && !rc; k++) {
        size_t row = (size_t)k * d->n / (size_t)n;
        if (k && row == (size_t)(k - 1) * d->n / (size_t)n) continue; /* fewer rows than n */
        const uint32_t *t = d->tokens + d->start[row];
        const uint8_t *fl = d->tflags + d->start[row];
        int doc = 1; /* the row's first document: up to the next document start */
        while (doc < (int)d->len[row] && !(fl[doc] & RF_LM_DOC_START))
            doc++;
        if (doc < 2) continue;
        int np = doc / 2 < RF_LM_SAMPLE_PROMPT ? doc / 2 : RF_LM_SAMPLE_PROMPT;
        int nref = doc - np < RF_LM_SAMPLE_NEW ? doc - np : RF_LM_SAMPLE_NEW;
        for (int i = 0; i < np + nref; i++)
            ids[i] = (int32_t)t[i];
        rf_gen_opts go = {.max_new_tokens = RF_LM_SAMPLE_NEW};
        rf_gen_result res = {0};
        if ((rc = rf_generate_ids(lm, ids, np, &go, NULL, NULL, &res))) break;
        rc = rf_buf_printf(json, "%s{\"row\":%zu", written ? "," : "", row);
        if (!rc) rc = put_text(lm, "prompt", ids, np, json);
        if (!rc) rc = put_text(lm, "completion", res.ids, res.n, json);
        if (!rc) rc = put_text(lm, "reference", ids + np, nref, json);
        if (!rc)
            rc = rf_buf_printf(json, ",\"prompt_tokens\":%d,\"new_tokens\":%d,\"finish\":\"%s\"}",
                               np, res.n, res.finish ? res.finish : "");
        rf_gen_result_free(&res);
        written++;
    }
    if (!rc) rc = rf_buf_puts(json, "]");
    free(ids);
    return rc;
}

int rf_lm_evaluate_path(const char *model_dir, const char *device, const char *data, int max_len,
                        int batch_size, int samples, rf_buf *json) {
    rf_model *m = NULL;
    rf_dataset d = {0};
    rf_lm_eval ev;
    double t0 = rf_now();
    const rf_backend *be;
    int rc = rf_backend_for(device, &be);
    if (rc) return rc;
    rc = rf_model_load(model_dir, NULL, be, &m);
    if (rc) return rf_fail_ctx(rc, "model %s", model_dir);
    rf_model_info in = rf_model_info_of(m);
    if (in.task != RF_TASK_CAUSAL_LM)
        rc = rf_fail(RF_ERR_INVALID, "eval: %s is not a causal language model", model_dir);
    if (max_len > in.max_positions) max_len = in.max_positions;
    if (!rc) rc = rf_lm_data_load(&d, data, model_dir, max_len, in.eos_token_id, NULL, "evaluator");
    if (!rc && (rc = rf_lm_evaluate(m, &d, batch_size, &ev)))
        rc = rf_fail_ctx(rc, "evaluating %s on %s", model_dir, data);
    if (!rc)
        rc = rf_buf_printf(json,
                           "{\"task\":\"causal_lm\",\"eval_loss\":%.6f,\"perplexity\":%.4f,"
                           "\"tokens\":%llu,\"rows\":%zu,\"max_len\":%d,\"skipped\":%zu,"
                           "\"seconds\":%.3f,\"model\":",
                           ev.loss, ev.perplexity, (unsigned long long)ev.tokens, ev.rows, max_len,
                           d.skipped, rf_now() - t0);
    if (!rc) rc = rf_buf_append_json_str(json, model_dir, strlen(model_dir));
    if (!rc) rc = rf_buf_puts(json, ",\"data\":");
    if (!rc) rc = rf_buf_append_json_str(json, data, strlen(data));
    if (!rc && samples > 0) { /* the generation model: KV-cache inference (lm.h) */
        rf_lm *lm = NULL;
        double t1 = rf_now();
        rc = rf_lm_load_on(model_dir, be, &lm);
        if (!rc) rc = rf_lm_samples(lm, &d, samples, json);
        const rf_backend *gb =
            lm ? (lm->model.gpt2 ? lm->model.gpt2->be : lm->model.llama->be) : be;
        if (!rc)
            rc = rf_buf_printf(json, ",\"samples_seconds\":%.3f,\"samples_device\":\"%s\"",
                               rf_now() - t1, gb->name);
        if (rc) rc = rf_fail_ctx(rc, "sample generations of %s", model_dir);
        rf_lm_free(lm);
    }
    if (!rc) rc = rf_buf_puts(json, "}\n");
    rf_dataset_free(&d);
    rf_model_free(m);
    return rc;
}
