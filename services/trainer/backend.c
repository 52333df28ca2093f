/* The backend of a device name (backend.h). */
#include <string.h>

#include "common/error.h"
#include "trainer/backend.h"

#ifdef REFINERY_CUDA
#include "trainer/cuda/backend_cuda.h"
#endif

int rf_backend_for(const char *device, const rf_backend **out) {
    *out = NULL;
    int rc = rf_device_check(device);
    if (rc) return rc;
    if (!device || !device[0] || strcmp(device, "cpu") == 0) {
        *out = rf_backend_cpu();
        return RF_OK;
    }
    if (strcmp(device, "cpu-staged") == 0) {
        *out = rf_backend_cpu_staged();
        return RF_OK;
    }
#ifdef REFINERY_CUDA
    return rf_cuda_backend(strcmp(device, "cuda-bf16") == 0, out);
#else
    return rf_fail(RF_ERR_INTERNAL, "trainer.device: unreachable");
#endif
}
