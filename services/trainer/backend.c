/* The backend of a device name (backend.h). */
#include <stdint.h>
#include <stdlib.h>
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

int rf_backend_attention_stats(const rf_backend *be, int hs, bool *stats) {
    *stats = false;
    return be->attention_stats ? be->attention_stats(be, hs, stats) : RF_OK;
}

int rf_inputs_alloc(rf_inputs *in, const rf_backend *be, int n, const size_t *sizes) {
    if (n < 1 || n > RF_INPUTS_MAX) return rf_fail(RF_ERR_INVALID, "inputs: %d pieces", n);
    rf_inputs t = {.n = n};
    for (int i = 0; i < n; i++) {
        size_t a = (t.off[i] + 15) & ~(size_t)15;
        if (a < t.off[i] || sizes[i] > SIZE_MAX - a)
            return rf_fail(RF_ERR_NOMEM, "inputs: %zu bytes do not fit", sizes[i]);
        t.off[i] = a;
        t.off[i + 1] = a + sizes[i];
    }
    t.host = calloc(1, t.off[n] ? t.off[n] : 1); /* padding sent too: defined bytes */
    t.dev = t.host ? rf_backend_alloc(be, t.off[n]) : NULL;
    if (!t.dev) {
        free(t.host);
        return rf_fail(RF_ERR_NOMEM, "inputs: no memory for a batch's %zu bytes", t.off[n]);
    }
    rf_inputs_free(in, be);
    *in = t;
    return RF_OK;
}

void *rf_inputs_host(const rf_inputs *in, int i) {
    return in->host + in->off[i];
}

void *rf_inputs_dev(const rf_inputs *in, int i) {
    return in->dev + in->off[i];
}

int rf_inputs_send(const rf_inputs *in, const rf_backend *be, int k) {
    if (k < 1 || k > in->n) return rf_fail(RF_ERR_INVALID, "inputs: send of %d pieces", k);
    return be->to_device(be, in->dev, in->host, in->off[k]);
}

void rf_inputs_free(rf_inputs *in, const rf_backend *be) {
    free(in->host);
    rf_backend_free(be, in->dev);
    *in = (rf_inputs){0};
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
