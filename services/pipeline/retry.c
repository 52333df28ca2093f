/* Retries (retry.h). */
#include "pipeline/retry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/hash.h"

bool rf_retry_transient(int rc) {
    return rc == RF_ERR_IO;
}

double rf_retry_delay(double base, int attempt, uint64_t *seed) {
    double d = base * ldexp(1.0, attempt > 2 ? attempt - 2 : 0);
    if (d > 60) d = 60;
    *seed = rf_mix64(*seed);
    double jitter = 0.5 + (double)(*seed >> 11) / 9007199254740992.0; /* [0.5, 1.5) */
    return d * jitter;
}

void rf_retry_sleep(double seconds, volatile int *cancel) {
    while (seconds > 0 && !(cancel && *cancel)) {
        double step = seconds < 0.05 ? seconds : 0.05;
        struct timespec ts = {(time_t)step, (long)((step - (double)(time_t)step) * 1e9)};
        nanosleep(&ts, NULL);
        seconds -= step;
    }
}

int rf_retry_injected(const char *stage, int attempt) {
    const char *spec = getenv("REFINERY_TEST_FAIL");
    size_t n = strlen(stage);
    for (const char *p = spec; p && *p;) {
        if (!strncmp(p, stage, n) && p[n] == ':') {
            int times = atoi(p + n + 1);
            if (attempt <= times)
                return rf_fail(RF_ERR_IO,
                               "injected transient failure %d of %d (REFINERY_TEST_FAIL)", attempt,
                               times);
        }
        p = strchr(p, ',');
        if (p) p++;
    }
    return RF_OK;
}
