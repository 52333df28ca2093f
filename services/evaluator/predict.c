/* Batched inference shared by evaluation and Classify: see predict.h. */
#include "evaluator/predict.h"

#include <math.h>
#include <stdlib.h>

#include "common/error.h"

int rf_softmax_argmax(const float *z, int K, float *probs) {
    int best = 0;
    for (int k = 1; k < K; k++)
        if (z[k] > z[best]) best = k;
    if (probs) {
        double sum = 0;
        for (int k = 0; k < K; k++)
            sum += exp((double)z[k] - z[best]);
        for (int k = 0; k < K; k++)
            probs[k] = (float)(exp((double)z[k] - z[best]) / sum);
    }
    return best;
}

int rf_predict_batch(rf_bert *m, const rf_dataset *d, const size_t *idx, int B, rf_batch_buf *bb,
                     int32_t *pred, float *probs, float *loss) {
    int K = m->cfg.num_labels;
    int rc = rf_batch_collate(bb, d, idx, B);
    if (rc) return rc;
    rf_batch b = {bb->B, bb->T, bb->ids, bb->types, loss ? bb->labels : NULL, bb->valid};
    if ((rc = rf_bert_forward(m, &b, false, 0))) return rc;
    if (loss) {
        /* The backend's cross-entropy (the training loss), probabilities into
         * scratch: the ones handed out are rf_softmax_argmax's. */
        float *scratch = malloc((size_t)B * K * sizeof *scratch);
        if (!scratch) return RF_ERR_NOMEM;
        m->be->xent_fwd(scratch, loss, m->logits, bb->labels, NULL, B, K);
        free(scratch);
    }
    for (int r = 0; r < B; r++)
        pred[r] =
            rf_softmax_argmax(m->logits + (size_t)r * K, K, probs ? probs + (size_t)r * K : NULL);
    return RF_OK;
}
