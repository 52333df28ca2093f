/* Batched inference shared by evaluation and Classify: see predict.h. The
 * logits stay in the backend's memory: the arg-max and softmax run there
 * (softmax_argmax), and only their results come back (to_host). */
#include "evaluator/predict.h"

#include <stdlib.h>

#include "common/error.h"
#include "trainer/ops.h"

int rf_softmax_argmax(const float *z, int K, float *probs) {
    int32_t best;
    rf_op_softmax_argmax(&best, probs, z, 1, K);
    return best;
}

int rf_predict_batch(rf_bert *m, const rf_dataset *d, const size_t *idx, int B, rf_batch_buf *bb,
                     int32_t *pred, float *probs, float *loss) {
    const rf_backend *be = m->be;
    int K = m->cfg.num_labels;
    int rc = rf_batch_collate(bb, d, idx, B);
    if (rc) return rc;
    rf_batch b = {bb->B, bb->T, bb->ids, bb->types, loss ? bb->labels : NULL, bb->valid};
    if ((rc = rf_bert_forward(m, &b, false, 0))) return rc;
    /* With labels the forward pass left each row's cross-entropy (the
     * training loss) in m->losses. */
    if (loss && (rc = be->to_host(be, loss, m->losses, (size_t)B * sizeof *loss))) return rc;
    void *pred_dev = NULL, *probs_dev = NULL;
    size_t pbytes = (size_t)B * K * sizeof(float);
    if ((rc = be->alloc(be, &pred_dev, (size_t)B * sizeof(int32_t)))) return rc;
    if (probs) rc = be->alloc(be, &probs_dev, pbytes);
    if (!rc) rc = be->softmax_argmax(be, pred_dev, probs_dev, m->logits, B, K);
    if (!rc) rc = be->to_host(be, pred, pred_dev, (size_t)B * sizeof(int32_t));
    if (!rc && probs) rc = be->to_host(be, probs, probs_dev, pbytes);
    be->free(be, pred_dev);
    be->free(be, probs_dev);
    return rc;
}
