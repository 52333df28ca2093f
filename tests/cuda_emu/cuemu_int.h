// cuda_emu's internal interface between the runtime (cuemu.cc) and NCCL
// (cuemu_nccl.cc). Not for the code under test.
#ifndef RF_CUDA_EMU_INT_H
#define RF_CUDA_EMU_INT_H

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// Stops the program when [p, p + n) starts in a device allocation and leaves
// it (host pointers pass).
void cuemu_check_range(const void *p, size_t n, const char *what);
// The sequence number of the last NCCL operation queued on stream s (0: none).
uint64_t cuemu_nccl_issued(cudaStream_t s);
// Whether the NCCL operations on s up to upto are complete, progressing them;
// with wait, until they are. s nullptr with wait: every stream.
bool cuemu_nccl_wait(cudaStream_t s, uint64_t upto, bool wait);

#endif
