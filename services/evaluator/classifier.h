/* A checkpoint folder loaded for inference (model + its tokenizer), and a
 * small cache of them shared by the gRPC workers of refinery-evaluator.
 * The forward pass, padding and softmax are evaluator/predict.h's, the ones
 * rf_evaluate uses.
 *
 * Texts are tokenized as rf_dataset_load_jsonl does for evaluation ([CLS]
 * text [SEP], truncated to max_len, which is capped at the model's
 * max_position_embeddings), run through the model with dropout off in
 * batches of similar lengths (sorted by token count, so that little of a
 * batch is padding), and each gets the arg-max label (the first of equal logits, as
 * rf_evaluate) and the softmax of its logits. The model's activation
 * buffers are its own, so forward passes on one classifier take turns
 * (a mutex); different classifiers run in parallel. */
#ifndef RF_EVAL_CLASSIFIER_H
#define RF_EVAL_CLASSIFIER_H

#include <stddef.h>
#include <stdint.h>

typedef struct rf_classifier rf_classifier;

int rf_classifier_load(const char *dir, int max_len, rf_classifier **out);
void rf_classifier_free(rf_classifier *c);
int rf_classifier_num_labels(const rf_classifier *c);
/* texts[0..n) (UTF-8, checked by the caller) -> labels[n] and probs[n * K],
 * batch_size texts per forward pass. */
int rf_classifier_run(rf_classifier *c, const char *const *texts, size_t n, int batch_size,
                      int32_t *labels, float *probs);

/* The last `cap` folders used stay loaded (least recently used evicted). An
 * entry handed out stays valid until released, even if evicted meanwhile. */
typedef struct rf_classifier_cache rf_classifier_cache;

int rf_classifier_cache_new(int cap, int max_len, rf_classifier_cache **out);
void rf_classifier_cache_free(rf_classifier_cache *cc);
/* The classifier of folder dir, loaded on a miss (a folder that fails to
 * load is not cached: the error is returned each time). */
int rf_classifier_cache_get(rf_classifier_cache *cc, const char *dir, rf_classifier **out);
void rf_classifier_cache_release(rf_classifier_cache *cc, rf_classifier *c);
/* Folders loaded so far (misses), for tests and logs. */
int64_t rf_classifier_cache_loads(rf_classifier_cache *cc);

#endif
