/* The backend of a device name (backend.h). */
#include <string.h>

#include "common/error.h"
#include "trainer/backend.h"

#ifdef REFINERY_CUDA
#include "trainer/cuda/backend_cuda.h"
#endif

void *rf_backend_alloc(const rf_backend *be, size_t bytes) {
    void *p = NULL;
    return be->alloc(be, &p, bytes ? bytes : 1) ? NULL : p;
}

void rf_backend_free(const rf_backend *be, void *p) {
    if (p) (void)be->free(be, p);
}

int rf_backend_need_cpu(const rf_backend *be, const char *who, const char *what) {
    if (be == rf_backend_cpu()) return RF_OK;
    return rf_fail(RF_ERR_UNSUPPORTED, "%s: %s runs on the CPU backend only (trainer.device: cpu)",
                   who, what);
}

int rf_backend_check_slots(const rf_backend *be, const char *who, const rf_backend_slot *s,
                           size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i].missing)
            return rf_fail(RF_ERR_UNSUPPORTED,
                           "%s: the %s backend has no '%s' kernel (trainer.device: cpu runs it)",
                           who, be->name, s[i].name);
    return RF_OK;
}

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
    if (strcmp(device, "cpu-guarded") == 0) {
        *out = rf_backend_cpu_guarded();
        return RF_OK;
    }
#ifdef REFINERY_CUDA
    return rf_cuda_backend(strcmp(device, "cuda-bf16") == 0, out);
#else
    return rf_fail(RF_ERR_INTERNAL, "trainer.device: unreachable");
#endif
}
