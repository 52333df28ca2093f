/* The CUDA backend (make CUDA=1): the C entry points device.c and backend.c
 * call. Everything else of it is C++ under this folder, one file per op. */
#ifndef RF_TR_CUDA_BACKEND_CUDA_H
#define RF_TR_CUDA_BACKEND_CUDA_H

#include "trainer/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* RF_OK when a CUDA device can be used, else RF_ERR_UNSUPPORTED saying why
 * (no driver, no device). Creates nothing. */
int rf_cuda_device_check(void);
/* The backend ("cuda") on the process's GPU: the local rank
 * (OMPI_COMM_WORLD_LOCAL_RANK, LOCAL_RANK), else the rank, modulo the visible
 * devices, as the comm layer's NCCL groups choose; device 0 for a single
 * process. Or with bf16 the one whose matrix
 * products (the layers' and, since 2026-11-28, attention's) run on bf16 tensor cores ("cuda-bf16":
 * cuBLAS compute type 32F_FAST_16BF: inputs rounded to bf16, products accumulated in fp32; weights,
 * master weights, activations, moments and every other op stay fp32). Each has its own context
 * (stream, cuBLAS handle, reduction scratch), created on its first call and kept for the process.
 * Calls on one backend take turns: one thread at a time (they share the stream and scratch). */
int rf_cuda_backend(bool bf16, const rf_backend **out);

#ifdef __cplusplus
}
#endif

#endif
