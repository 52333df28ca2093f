/* The test device "cpu-staged" (backend.h): the CPU backend's table under
 * another identity. Copied at first use, so it has every slot the CPU has. */
#include <pthread.h>

#include "trainer/backend.h"

static rf_backend staged;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    staged = *rf_backend_cpu();
    staged.name = "cpu-staged";
    staged.device_memory = false; /* host memory: MPI carries its collectives */
}

const rf_backend *rf_backend_cpu_staged(void) {
    pthread_once(&once, init);
    return &staged;
}
