/* Eval loss and perplexity of a causal LM (lm_loss.h). */
#include "evaluator/lm_loss.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"
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

int rf_lm_evaluate_path(const char *model_dir, const char *data, int max_len, int batch_size,
                        rf_buf *json) {
    rf_model *m = NULL;
    rf_dataset d = {0};
    rf_lm_eval ev;
    double t0 = rf_now();
    int rc = rf_model_load(model_dir, NULL, rf_backend_cpu(), &m);
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
    if (!rc) rc = rf_buf_puts(json, "}\n");
    rf_dataset_free(&d);
    rf_model_free(m);
    return rc;
}
