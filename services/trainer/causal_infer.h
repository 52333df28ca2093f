/* Inference-only incremental forward of the causal LMs (gpt2.h, llama.h)
 * with a key/value cache: the same ops as their training forward
 * (ops.h / ops_causal.h), no activations kept for backward, and the
 * attention of new tokens over the cached keys done with sgemm per head.
 *
 * A state holds one sequence: the keys and values of its first len tokens
 * for every layer ([cap, NKV * hd] per layer, after RoPE for Llama) and
 * scratch for up to `chunk` new tokens at a time (longer inputs are run in
 * chunks). rf_infer_forward appends tokens at positions len, len + 1, ...
 * and returns their final hidden states (after the last norm); the LM head
 * is separate (rf_infer_logits) so that callers that need a few rows (the
 * next token) or one target per row (perplexity) never hold [T, vocab].
 *
 * The model's weights are only read: any number of states (one per thread)
 * may share one model, as long as nobody trains it meanwhile. Feeding the
 * prefix at once or a token at a time gives the logits of the full forward
 * (rf_gpt2_forward / rf_llama_forward) within round-off
 * (tests/trainer/test_causal_infer.c). */
#ifndef RF_TR_CAUSAL_INFER_H
#define RF_TR_CAUSAL_INFER_H

#include <stdint.h>

#include "trainer/gpt2.h"
#include "trainer/llama.h"

/* One of the two architectures (the other pointer NULL); not owned. */
typedef struct rf_causal_model {
    rf_gpt2 *gpt2;
    rf_llama *llama;
} rf_causal_model;

/* Sizes of a model, as the inference code sees them. */
typedef struct rf_causal_dims {
    int vocab, C, L, NH, NKV, hd, F, max_pos;
} rf_causal_dims;

int rf_causal_dims_of(const rf_causal_model *m, rf_causal_dims *d);

typedef struct rf_infer rf_infer;

/* A state for sequences of up to cap tokens (cap <= the model's positions),
 * running up to chunk new tokens per pass (scratch grows with it: NH x chunk
 * x cap floats of attention scores). On the model's backend: a device's
 * state runs every step through its slots on its memory (the cache too);
 * RF_ERR_UNSUPPORTED for a backend without kv_attention_fwd or copy2d. */
int rf_infer_new(const rf_causal_model *m, int cap, int chunk, rf_infer **out);
void rf_infer_free(rf_infer *s);
/* Forgets the sequence (len = 0); the buffers stay. */
void rf_infer_reset(rf_infer *s);
int rf_infer_len(const rf_infer *s);
int rf_infer_cap(const rf_infer *s);
const rf_causal_dims *rf_infer_dims(const rf_infer *s);

/* Appends ids[0..n) at positions len.. (RF_ERR_RANGE past cap, or for an id
 * outside the vocabulary: nothing is appended then). hidden (host memory,
 * may be NULL) receives the n final hidden states [n, C]. On a device a
 * backend error may leave len short of the input. */
int rf_infer_forward(rf_infer *s, const int32_t *ids, int n, float *hidden);
/* logits[n, vocab] of hidden rows h[n, C] (the LM head); host memory both.
 * RF_OK, or the backend's error (a device: its memory for n rows). */
int rf_infer_logits(rf_infer *s, const float *h, int n, float *logits);

#endif
