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
/* The backend on device 0: its context (stream, cuBLAS handle, reduction
 * scratch) is created on the first call and kept for the process. Calls on
 * it take turns: one thread at a time (they share the stream and scratch). */
int rf_cuda_backend(const rf_backend **out);

#ifdef __cplusplus
}
#endif

#endif
