// Whether a CUDA device can be used, apart from the backend: spec validation
// (trainer.device) links this and the CUDA runtime, none of the kernels.
#include <cuda_runtime.h>

#include "common/error.h"
#include "trainer/cuda/backend_cuda.h"

extern "C" int rf_cuda_device_check(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "trainer.device: cuda: no usable GPU (%s); use device: cpu",
                       cudaGetErrorString(e));
    if (n == 0)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "trainer.device: cuda: this machine has no CUDA device; use device: cpu");
    return RF_OK;
}
