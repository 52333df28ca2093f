/* CUDA twins of CPU kernels in ops.h (built only with `make CUDA=1`). Pointers
 * are device pointers; the functions launch on the default stream and return
 * 0 or a negative rf_err (with rf_fail detail) when CUDA or cuBLAS fails.
 * Only part of the backend exists so far: GELU and the linear layer. The CPU
 * twin of each is the reference its test compares against. */
#ifndef RF_TR_CUDA_OPS_H
#define RF_TR_CUDA_OPS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

int rf_cuda_gelu_fwd(float *out, const float *inp, size_t n);
int rf_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);
/* out[N,OC] = inp[N,IC] w[OC,IC]^T + b, as rf_op_linear_fwd (cuBLAS sgemm). */
int rf_cuda_linear_fwd(float *out, const float *inp, const float *w, const float *b, int N, int IC,
                       int OC);

#ifdef __cplusplus
}
#endif

#endif
