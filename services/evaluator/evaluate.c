#include "evaluator/evaluate.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"

int rf_evaluate(rf_bert *m, const rf_dataset *d, int batch_size, rf_metrics *out) {
    int K = m->cfg.num_labels, rc = rf_metrics_init(out, K);
    if (rc) return rc;
    size_t *idx = malloc((size_t)batch_size * sizeof *idx);
    rf_batch_buf bb = {0};
    if (!idx) rc = RF_ERR_NOMEM;
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
        if ((rc = rf_batch_collate(&bb, d, idx, nb))) break;
        rf_batch b = {bb.B, bb.T, bb.ids, bb.types, bb.labels, bb.valid};
        if ((rc = rf_bert_forward(m, &b, false, 0))) break;
        float losses[nb];
        float *probs = malloc((size_t)nb * K * sizeof(float));
        if (!probs) {
            rc = RF_ERR_NOMEM;
            break;
        }
        m->be->xent_fwd(probs, losses, m->logits, bb.labels, NULL, nb, K);
        for (int r = 0; r < nb; r++) {
            const float *z = m->logits + (size_t)r * K;
            int best = 0;
            for (int c = 1; c < K; c++)
                if (z[c] > z[best]) best = c;
            rf_metrics_add(out, bb.labels[r], best, losses[r]);
        }
        free(probs);
    }
    free(idx);
    rf_batch_buf_free(&bb);
    if (rc) rf_metrics_free(out);
    return rc;
}

int rf_evaluate_path(const char *model_dir, const char *data, int max_len, int batch_size,
                     const char *report_path, rf_buf *json) {
    rf_bert *m = NULL;
    rf_dataset d = {0};
    rf_metrics mt = {0};
    rf_buf b = RF_BUF_INIT;
    double t0 = rf_now();
    int rc = rf_bert_load(model_dir, 0, 0, rf_backend_cpu(), &m);
    if (!rc) rc = rf_dataset_load(&d, data, model_dir, max_len, NULL, "evaluator");
    if (!rc && d.n == 0) rc = rf_fail(RF_ERR_INVALID, "eval: no labelled sequences in %s", data);
    if (!rc) rc = rf_evaluate(m, &d, batch_size, &mt);
    if (!rc) rc = rf_metrics_to_json(&mt, &b);
    if (!rc) {
        b.len--; /* reopen the object to add provenance */
        rc = rf_buf_printf(&b, ",\"skipped\":%zu,\"seconds\":%.3f,\"model\":", d.skipped,
                           rf_now() - t0);
        if (!rc) rc = rf_buf_append_json_str(&b, model_dir, strlen(model_dir));
        if (!rc) rc = rf_buf_puts(&b, ",\"data\":");
        if (!rc) rc = rf_buf_append_json_str(&b, data, strlen(data));
        if (!rc) rc = rf_buf_puts(&b, "}\n");
    }
    if (!rc && report_path) {
        rc = rf_write_file_atomic(report_path, b.data, b.len);
        if (rc) rc = rf_fail_ctx(rc, "eval: cannot write %s", report_path);
    }
    if (!rc && json) rc = rf_buf_append(json, b.data, b.len);
    rf_buf_free(&b);
    rf_metrics_free(&mt);
    rf_dataset_free(&d);
    rf_bert_free(m);
    return rc;
}
