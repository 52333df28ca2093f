/* CUDA kernels against their CPU twins (ops.c). Built into every test run, but
 * the comparison needs `make CUDA=1` and a GPU; otherwise it is skipped and
 * says why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "../support/skip.h"

#ifdef REFINERY_CUDA
#include <cuda_runtime.h>

#include "common/rng.h"
#include "trainer/cuda_ops.h"
#include "trainer/ops.h"

static float *dev_copy(const float *h, size_t n) {
    float *d;
    assert_int_equal(cudaMalloc((void **)&d, n * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static void to_host(float *h, const float *d, size_t n) {
    assert_int_equal(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
}

static double max_rel(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-6);
        if (d > worst) worst = d;
    }
    return worst;
}

static void test_twins(void **state) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        RF_SKIP("no GPU: %s",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices");
    rf_rng r;
    rf_rng_seed(&r, 9);
    size_t n = 100000;
    float *x = malloc(n * 4), *dy = malloc(n * 4), *y_cpu = malloc(n * 4), *y_gpu = malloc(n * 4);
    float *dx_cpu = calloc(n, 4), *dx_gpu = calloc(n, 4);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(rf_rng_double(&r) * 8 - 4);
        dy[i] = (float)(rf_rng_double(&r) * 2 - 1);
    }
    float *dx = dev_copy(x, n), *ddy = dev_copy(dy, n), *dout = dev_copy(y_cpu, n),
          *ddx = dev_copy(dx_gpu, n);
    rf_op_gelu_fwd(y_cpu, x, n);
    assert_int_equal(rf_cuda_gelu_fwd(dout, dx, n), 0);
    to_host(y_gpu, dout, n);
    assert_true(max_rel(y_gpu, y_cpu, n) < 1e-5);
    rf_op_gelu_bwd(dx_cpu, x, dy, n);
    assert_int_equal(rf_cuda_gelu_bwd(ddx, dx, ddy, n), 0);
    to_host(dx_gpu, ddx, n);
    assert_true(max_rel(dx_gpu, dx_cpu, n) < 1e-5);

    int N = 64, IC = 48, OC = 40;
    float *in = malloc(N * IC * 4), *w = malloc(OC * IC * 4), *b = malloc(OC * 4),
          *o_cpu = malloc(N * OC * 4), *o_gpu = malloc(N * OC * 4);
    for (int i = 0; i < N * IC; i++)
        in[i] = (float)rf_rng_double(&r) - 0.5f;
    for (int i = 0; i < OC * IC; i++)
        w[i] = (float)rf_rng_double(&r) - 0.5f;
    for (int i = 0; i < OC; i++)
        b[i] = (float)rf_rng_double(&r);
    float *din = dev_copy(in, N * IC), *dw = dev_copy(w, OC * IC), *db = dev_copy(b, OC),
          *dob = dev_copy(o_cpu, N * OC);
    rf_op_linear_fwd(o_cpu, in, w, b, N, IC, OC);
    assert_int_equal(rf_cuda_linear_fwd(dob, din, dw, db, N, IC, OC), 0);
    to_host(o_gpu, dob, N * OC);
    assert_true(max_rel(o_gpu, o_cpu, N * OC) < 1e-4);
    cudaFree(dx), cudaFree(ddy), cudaFree(dout), cudaFree(ddx);
    cudaFree(din), cudaFree(dw), cudaFree(db), cudaFree(dob);
    free(x), free(dy), free(y_cpu), free(y_gpu), free(dx_cpu), free(dx_gpu);
    free(in), free(w), free(b), free(o_cpu), free(o_gpu);
}
#else
static void test_twins(void **state) {
    RF_SKIP("no CUDA: the kernels are built only with make CUDA=1");
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_twins)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
