/* The kernel table the model runs on. The CPU backend points at ops.h; a CUDA
 * backend (services/trainer/<name>.cu with CUDA=1) supplies device twins with the same
 * signatures and its own buffer allocation, so model.c never names a device.
 * Buffers are plain pointers into the backend's memory: parameters, gradients
 * and moments are each one contiguous block, which is what ZeRO-style sharding
 * slices later. */
#ifndef RF_TR_BACKEND_H
#define RF_TR_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct rf_backend {
    const char *name;
    void *(*alloc)(size_t bytes); /* zeroed */
    void (*free)(void *p);
    void (*zero)(void *p, size_t bytes);
    void (*to_host)(void *dst, const void *src, size_t bytes);
    void (*to_device)(void *dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes); /* device to device */

    void (*embed_fwd)(float *out, const int32_t *ids, const int32_t *types, const float *wte,
                      const float *wpe, const float *wtt, int B, int T, int C);
    void (*embed_bwd)(float *dwte, float *dwpe, float *dwtt, const float *dout, const int32_t *ids,
                      const int32_t *types, int B, int T, int C, int V, int TV);
    void (*layernorm_fwd)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C, float eps);
    void (*layernorm_bwd)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, const float *mean, const float *rstd, int N, int C);
    void (*linear_fwd)(float *out, const float *inp, const float *w, const float *b, int N, int IC,
                       int OC);
    void (*linear_bwd)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                       const float *w, int N, int IC, int OC);
    void (*attention_fwd)(float *out, float *att, float *scratch, const float *qkv,
                          const uint8_t *valid, int B, int T, int Tq, int C, int NH, float pdrop,
                          uint64_t seed);
    void (*attention_bwd)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                          const float *att, int B, int T, int Tq, int C, int NH, float pdrop,
                          uint64_t seed);
    void (*gelu_fwd)(float *out, const float *inp, size_t n);
    void (*gelu_bwd)(float *dinp, const float *inp, const float *dout, size_t n);
    void (*tanh_fwd)(float *out, const float *inp, size_t n);
    void (*tanh_bwd)(float *dinp, const float *out, const float *dout, size_t n);
    void (*dropout_fwd)(float *out, const float *inp, size_t n, float p, uint64_t seed);
    void (*dropout_bwd)(float *dinp, const float *dout, size_t n, float p, uint64_t seed);
    void (*residual_fwd)(float *out, const float *a, const float *b, size_t n, float p,
                         uint64_t seed);
    void (*residual_bwd)(float *da, float *db, const float *dout, size_t n, float p, uint64_t seed);
    /* weights: NULL or num_labels class weights (see rf_op_xent_fwd) */
    float (*xent_fwd)(float *probs, float *losses, const float *logits, const int32_t *labels,
                      const float *weights, int B, int K);
    void (*xent_bwd)(float *dlogits, const float *probs, const int32_t *labels,
                     const float *weights, int B, int K, float scale);
} rf_backend;

const rf_backend *rf_backend_cpu(void);

#endif
