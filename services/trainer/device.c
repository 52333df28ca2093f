/* Checking a device name (backend.h) without creating a backend: spec
 * validation links this alone, not the kernels. The CUDA backend exists only
 * in a CUDA=1 build (services/trainer/cuda/backend_cuda.cu). */
#include <string.h>

#include "common/error.h"
#include "trainer/backend.h"

#ifdef REFINERY_CUDA
#include "trainer/cuda/backend_cuda.h"
#endif

static bool is_cpu(const char *device) {
    return !device || !device[0] || strcmp(device, "cpu") == 0;
}

int rf_device_check(const char *device) {
    if (is_cpu(device) || !strcmp(device, "cpu-staged") || !strcmp(device, "cpu-guarded"))
        return RF_OK; /* the test devices */
    if (strcmp(device, "cuda") != 0 && strcmp(device, "cuda-bf16") != 0)
        return rf_fail(RF_ERR_INVALID, "trainer.device: expected cpu, cuda or cuda-bf16, got '%s'",
                       device);
#ifdef REFINERY_CUDA
    return rf_cuda_device_check();
#else
    return rf_fail(RF_ERR_UNSUPPORTED,
                   "trainer.device: %s is not available in this build (it has the CPU backend "
                   "only; rebuild with make CUDA=1 on a machine with a GPU), use device: cpu",
                   device);
#endif
}
