/* Shared helpers of the PyTorch parity tests (header-only: each test is its own binary). */
#ifndef RF_TEST_PARITY_UTIL_H
#define RF_TEST_PARITY_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/safetensors.h"

/* Fixture tensor as a malloc'd float array (fails the test when absent). */
static inline float *fx_get(const rf_st_file *f, const char *name, size_t *n) {
    const rf_st_tensor *t = rf_st_find(f, name);
    if (!t) fail_msg("fixture lacks '%s'", name);
    float *x = malloc(t->numel * sizeof(float) + 1);
    assert_int_equal(rf_st_to_f32(t, x), 0);
    if (n) *n = t->numel;
    return x;
}

static inline int32_t *fx_ints(const rf_st_file *f, const char *name, size_t *n) {
    size_t k;
    float *x = fx_get(f, name, &k);
    int32_t *o = malloc(k * sizeof(int32_t) + 1);
    for (size_t i = 0; i < k; i++)
        o[i] = (int32_t)x[i];
    free(x);
    if (n) *n = k;
    return o;
}

/* A causal-LM fixture's batch of B rows (scripts/parity: in.ids, in.mask as
 * the valid bytes, in.labels), T = n / B; fx_batch_free releases it. */
typedef struct fx_batch {
    int32_t *ids, *labels;
    uint8_t *valid;
    size_t n;
    int B, T;
} fx_batch;

static inline fx_batch fx_causal_batch(const rf_st_file *f, int B) {
    fx_batch b = {.B = B};
    int32_t *mask = fx_ints(f, "in.mask", NULL);
    b.ids = fx_ints(f, "in.ids", &b.n);
    b.labels = fx_ints(f, "in.labels", NULL);
    b.valid = malloc(b.n + 1);
    for (size_t i = 0; i < b.n; i++)
        b.valid[i] = (uint8_t)mask[i];
    free(mask);
    b.T = (int)(b.n / (size_t)B);
    return b;
}

static inline void fx_batch_free(fx_batch *b) {
    free(b->ids), free(b->labels), free(b->valid);
    b->ids = b->labels = NULL, b->valid = NULL;
}

/* ||a - b|| / max(||b||, floor): norm-wise relative error. */
static inline double rel_err_floor(const float *a, const float *b, size_t n, double floor) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d) / fmax(sqrt(r), floor);
}

static inline double rel_err(const float *a, const float *b, size_t n) {
    return rel_err_floor(a, b, n, 1e-6);
}

static inline double norm(const float *a, size_t n) {
    double r = 0;
    for (size_t i = 0; i < n; i++)
        r += (double)a[i] * a[i];
    return sqrt(r);
}

/* The gradient of a key bias is exactly zero (softmax is invariant to adding
 * the same q.b_k to every score), so both sides hold only round-off noise.
 * Its error is measured against the scale of the same layer's query-bias
 * gradient instead of its own (noise-sized) norm. */
static inline double grad_scale_floor(const rf_st_file *ref, const char *name) {
    const char *k = strstr(name, "attention.self.key.bias");
    if (!k) return 1e-6;
    char q[200];
    snprintf(q, sizeof q, "%.*sattention.self.query.bias", (int)(k - name), name);
    const rf_st_tensor *t = rf_st_find(ref, q);
    if (!t) fail_msg("fixture lacks '%s'", q);
    float *x = malloc(t->numel * sizeof(float));
    rf_st_to_f32(t, x);
    double s = norm(x, t->numel);
    free(x);
    return s;
}

static inline char *fixture_path(const char *rel) {
    const char *root = getenv("REFINERY_ROOT");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/tests/fixtures/trainer/%s", root ? root : ".", rel);
    return p;
}

#endif
