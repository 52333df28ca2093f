/* Finite-difference gradient checks of the ops' backward functions
 * (header-only; test_ops.c and test_ops_causal.c, each its own binary). A
 * check holds the op's forward (writing out from the inputs in ctx) and a
 * random cotangent R; the objective is sum(out * R), so an op's backward
 * given R is the objective's gradient, compared with central differences
 * (h 1e-2) at up to 200 spread elements. Seed rng before use. */
#ifndef RF_TEST_GRADCHECK_H
#define RF_TEST_GRADCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/rng.h"

static rf_rng rng;

static inline float *randn(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((rf_rng_double(&rng) * 2 - 1) * scale);
    return x;
}

static inline float *zeros(size_t n) {
    return calloc(n, sizeof(float));
}

typedef struct check {
    void (*fwd)(struct check *);
    float *out, *R;
    size_t nout;
    void *ctx;
} check;

static inline double objective(check *c) {
    c->fwd(c);
    double s = 0;
    for (size_t i = 0; i < c->nout; i++)
        s += (double)c->out[i] * c->R[i];
    return s;
}

/* ||numeric - analytic|| / ||numeric|| over the sampled elements of x[n];
 * *num_norm the numeric gradient's norm there. */
static inline double grad_error(check *c, float *x, size_t n, const float *analytic,
                                double *num_norm) {
    const float h = 1e-2f;
    double num2 = 0, diff2 = 0;
    size_t stride = n > 200 ? n / 200 : 1;
    for (size_t i = 0; i < n; i += stride) {
        float keep = x[i];
        x[i] = keep + h;
        double fp = objective(c);
        x[i] = keep - h;
        double fm = objective(c);
        x[i] = keep;
        double num = (fp - fm) / (2 * h);
        num2 += num * num;
        diff2 += (num - analytic[i]) * (num - analytic[i]);
    }
    *num_norm = sqrt(num2);
    return sqrt(diff2) / (sqrt(num2) + 1e-12);
}

/* Fails unless the error is below 1e-2 and the numeric gradient is not
 * identically zero (a vacuous check). */
static inline void expect_grad(check *c, float *x, size_t n, const float *analytic,
                               const char *what) {
    double nn, rel = grad_error(c, x, n, analytic, &nn);
    printf("  %-28s rel err %.2e\n", what, rel);
    if (!(rel < 1e-2)) fail_msg("%s: relative gradient error %.3g", what, rel);
    if (nn == 0) fail_msg("%s: gradient is identically zero, check is vacuous", what);
}

#endif
