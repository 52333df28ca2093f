/* cuda_emu: the part of the CUDA runtime API Refinery calls, run on the CPU
 * (tests/cuda_emu/README.md). "Device" memory is host memory from malloc,
 * filled with 0xff bytes (NaN floats) as cudaMalloc leaves garbage; streams
 * and events exist but every operation completes when it is called. Kernels
 * (C++ only, below) run their blocks one after another and a block's threads
 * as fibers that switch at __syncthreads and the warp operations, which check
 * what CUDA leaves undefined: a full-mask warp operation needs all 32 lanes
 * of the warp present and live. */
#ifndef RF_CUDA_EMU_RUNTIME_H
#define RF_CUDA_EMU_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
} cudaError_t;

typedef struct cuemu_stream *cudaStream_t;
typedef struct cuemu_event *cudaEvent_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
#define cudaStreamNonBlocking  0x01
#define cudaEventDisableTiming 0x02

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);

/* Test hook: the number of bytes of emulated device memory live now. */
size_t cuemu_live_bytes(void);
/* Test hook: the calls so far that make the host wait for the device on a
 * GPU: cudaStreamSynchronize, cudaDeviceSynchronize, cudaMemcpy and cudaFree
 * (which synchronises the device). With CUEMU_STATS set in the environment
 * the process prints the count to stderr when it exits (CUEMU_STATS=trace:
 * and the callers of each wait as it happens). */
uint64_t cuemu_host_waits(void);
/* Test hook: the operations queued for the device so far: kernel launches,
 * cuBLAS calls, asynchronous copies and memsets (NCCL's are not counted).
 * CUEMU_STATS prints the count too; CUEMU_STATS=ops and the count by name. */
uint64_t cuemu_device_ops(void);
/* Test hook: cuBLASLt's heuristic refuses (NOT_SUPPORTED) the pedantic fp32
 * compute type when pedantic is non-zero, every compute type when all is,
 * as a real GPU's may; both 0 (the default) restores it. Plans made before
 * keep their algorithm. */
void cuemu_lt_refuse(int pedantic, int all);

#ifdef __cplusplus
}

#include "cuemu_kernel.h"
#endif

#endif
