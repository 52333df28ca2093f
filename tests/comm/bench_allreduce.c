/* All-reduce time through rf_comm (nonblocking MPI polled to a deadline)
 * against a plain blocking MPI_Allreduce on the same data, under mpirun:
 *   make build/comm/bench_allreduce
 *   scripts/mpirun.sh -np 2 build/comm/bench_allreduce
 * Rank 0 prints microseconds per call for 1 and 1000003 floats. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "common/error.h"
#include "common/sys.h"

int main(void) {
    rf_comm *c;
    if (rf_comm_init_from_env(NULL, &c) != RF_OK) {
        fprintf(stderr, "bench_allreduce: %s\n", rf_errmsg());
        return 1;
    }
    if (rf_comm_world(c) < 2) {
        fprintf(stderr, "bench_allreduce: run under mpirun with 2 or more ranks\n");
        rf_comm_destroy(c);
        return 1;
    }
    size_t sizes[] = {1, 1000003};
    int reps[] = {2000, 20};
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        float *x = calloc(n, sizeof *x);
        if (!x) return 1;
        int rc = rf_comm_allreduce(c, x, x, n, RF_COMM_F32, RF_COMM_SUM); /* warm up */
        double t = rf_now();
        for (int i = 0; i < reps[k] && rc == RF_OK; i++)
            rc = rf_comm_allreduce(c, x, x, n, RF_COMM_F32, RF_COMM_SUM);
        double ours = (rf_now() - t) / reps[k];
        MPI_Barrier(MPI_COMM_WORLD);
        t = rf_now();
        for (int i = 0; i < reps[k]; i++)
            MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double plain = (rf_now() - t) / reps[k];
        if (rc != RF_OK) fprintf(stderr, "bench_allreduce: %s\n", rf_errmsg());
        if (rf_comm_rank(c) == 0)
            printf("%d ranks, %zu floats: rf_comm_allreduce %.1f us, MPI_Allreduce %.1f us\n",
                   rf_comm_world(c), n, ours * 1e6, plain * 1e6);
        free(x);
    }
    return rf_comm_destroy(c) == RF_OK ? 0 : 1;
}
