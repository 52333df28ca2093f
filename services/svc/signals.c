/* Termination signals, taken synchronously by the main thread. */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "common/error.h"
#include "svc/svc.h"

static atomic_bool stop_flag;

static void term_set(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
}

int rf_svc_signals_init(void) {
    sigset_t set;
    term_set(&set);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
        return rf_fail(RF_ERR_INTERNAL, "cannot block termination signals");
    /* A closed pipe (a peer gone) must not kill the process. */
    signal(SIGPIPE, SIG_IGN);
    return RF_OK;
}

int rf_svc_wait_signal(double timeout_s) {
    sigset_t set;
    term_set(&set);
    for (;;) {
        int sig;
        if (timeout_s < 0) {
            sig = sigwaitinfo(&set, NULL);
        } else {
            struct timespec ts = {(time_t)timeout_s, (long)((timeout_s - floor(timeout_s)) * 1e9)};
            sig = sigtimedwait(&set, NULL, &ts);
        }
        if (sig > 0) {
            rf_svc_request_stop();
            return sig;
        }
        if (timeout_s >= 0) return 0; /* timed out (or interrupted: the caller loops) */
    }
}

void rf_svc_request_stop(void) {
    atomic_store(&stop_flag, true);
}

/* Also takes a pending termination signal, so that a loop that only polls
 * this (no thread in rf_svc_wait_signal) still stops on SIGTERM. */
bool rf_svc_stopping(void) {
    if (atomic_load(&stop_flag)) return true;
    sigset_t set;
    term_set(&set);
    struct timespec zero = {0, 0};
    if (sigtimedwait(&set, NULL, &zero) > 0) rf_svc_request_stop();
    return atomic_load(&stop_flag);
}
