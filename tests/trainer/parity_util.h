/* Shared helpers of the PyTorch parity tests (header-only: each test is its own binary). */
#ifndef RF_TEST_PARITY_UTIL_H
#define RF_TEST_PARITY_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/safetensors.h"

/* Fixture tensor as a malloc'd float array (fails the test when absent). */
static float *fx_get(const rf_st_file *f, const char *name, size_t *n) {
    const rf_st_tensor *t = rf_st_find(f, name);
    if (!t) fail_msg("fixture lacks '%s'", name);
    float *x = malloc(t->numel * sizeof(float) + 1);
    assert_int_equal(rf_st_to_f32(t, x), 0);
    if (n) *n = t->numel;
    return x;
}

static int32_t *fx_ints(const rf_st_file *f, const char *name, size_t *n) {
    size_t k;
    float *x = fx_get(f, name, &k);
    int32_t *o = malloc(k * sizeof(int32_t) + 1);
    for (size_t i = 0; i < k; i++)
        o[i] = (int32_t)x[i];
    free(x);
    if (n) *n = k;
    return o;
}

/* ||a - b|| / max(||b||, 1e-6): norm-wise relative error. The floor matters
 * only for tensors whose exact value is zero (the key biases' gradient:
 * softmax is invariant to them), where both sides hold round-off noise of
 * order 1e-9 and the error becomes an absolute one. */
static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d) / fmax(sqrt(r), 1e-6);
}

static char *fixture_path(const char *rel) {
    const char *root = getenv("REFINERY_ROOT");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/tests/fixtures/trainer/%s", root ? root : ".", rel);
    return p;
}

#endif
