/* The peak the MFU column of the parallelism benches is measured against:
 * OpenBLAS sgemm (the library the trainer's linears call) on square fp32
 * matrices, best of several runs, for 1 and for all of the given threads.
 * usage: sgemm_peak [N [THREADS]]; prints one JSON line. Built and run by
 * scripts/bench/sst2_parallel_table.sh and bench_distributed.sh. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void openblas_set_num_threads(int n);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double best_gflops(int n, int threads, const float *a, const float *b, float *c) {
    openblas_set_num_threads(threads);
    double best = 0;
    for (int r = 0; r < 7; r++) {
        double t = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = now() - t;
        double g = 2.0 * n * (double)n * n / dt / 1e9;
        if (r > 0 && g > best) best = g; /* the first run warms up */
    }
    return best;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1024, threads = argc > 2 ? atoi(argv[2]) : 2;
    if (n < 64 || threads < 1) return 2;
    float *a = malloc((size_t)n * n * sizeof *a), *b = malloc((size_t)n * n * sizeof *b),
          *c = malloc((size_t)n * n * sizeof *c);
    if (!a || !b || !c) return 1;
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.25f;
        b[i] = (float)(i % 5) * 0.5f;
    }
    double g1 = best_gflops(n, 1, a, b, c), gn = best_gflops(n, threads, a, b, c);
    printf("{\"n\":%d,\"gflops_1thread\":%.2f,\"threads\":%d,\"gflops\":%.2f}\n", n, g1, threads, gn);
    free(a), free(b), free(c);
    return 0;
}
