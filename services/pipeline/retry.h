/* Retries of a failed stage (`retries: N` in its section): which failures are
 * worth another attempt, and how long to wait before it. */
#ifndef RF_PIPELINE_RETRY_H
#define RF_PIPELINE_RETRY_H

#include <stdbool.h>
#include <stdint.h>

/* Transient failures, decided by error code: RF_ERR_IO (a read or write that
 * failed, a peer or store that could not be reached). A bad spec or bad data
 * (INVALID, PARSE, CORRUPT, NOT_FOUND, UNSUPPORTED, RANGE), an exceeded memory
 * budget (RANGE), a cancellation and a bug are never retried. */
bool rf_retry_transient(int rc);

/* The pause before attempt `attempt` (2, 3, ...): base * 2^(attempt-2), at
 * most 60 s, times a jitter in [0.5, 1.5) drawn from *seed. */
double rf_retry_delay(double base, int attempt, uint64_t *seed);

/* Sleeps seconds, waking early when *cancel is set. */
void rf_retry_sleep(double seconds, volatile int *cancel);

/* The test hook REFINERY_TEST_FAIL="stage:N[,stage:N]": the first N attempts of
 * that stage fail with RF_ERR_IO before it starts. Returns the injected
 * failure or 0. */
int rf_retry_injected(const char *stage, int attempt);

#endif
