/* Termination signals. They are blocked in the thread that calls
 * rf_svc_signals_init (and so in the threads it starts afterwards) and taken
 * synchronously with sigtimedwait; a handler also catches them in any thread
 * that did not inherit the mask (one started earlier, e.g. by a library
 * constructor), so that no thread dies of the default action. */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "common/error.h"
#include "runtime/svc.h"

static atomic_bool stop_flag;
static volatile sig_atomic_t caught; /* the signal the handler took, if any */

static void term_set(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
}

static void on_term(int sig) {
    caught = sig;
    atomic_store(&stop_flag, true);
}

int rf_svc_signals_init(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0 ||
        sigaction(SIGHUP, &sa, NULL) < 0)
        return rf_fail(RF_ERR_INTERNAL, "cannot install signal handlers");
    sigset_t set;
    term_set(&set);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
        return rf_fail(RF_ERR_INTERNAL, "cannot block termination signals");
    /* A closed pipe (a peer gone) must not kill the process. */
    signal(SIGPIPE, SIG_IGN);
    return RF_OK;
}

/* Takes a pending termination signal within wait_s seconds: its number or 0. */
static int take(double wait_s) {
    sigset_t set;
    term_set(&set);
    struct timespec ts = {(time_t)wait_s, (long)((wait_s - floor(wait_s)) * 1e9)};
    int sig = sigtimedwait(&set, NULL, &ts);
    if (sig > 0) {
        rf_svc_request_stop();
        return sig;
    }
    return 0;
}

int rf_svc_wait_signal(double timeout_s) {
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        if (atomic_load(&stop_flag)) return caught ? caught : SIGTERM;
        int sig = take(0.1);
        if (sig > 0) return sig;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited = (double)(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) * 1e-9;
        if (timeout_s >= 0 && waited >= timeout_s) return 0;
    }
}

void rf_svc_request_stop(void) {
    atomic_store(&stop_flag, true);
}

/* Also takes a pending termination signal, so that a loop that only polls
 * this (no thread in rf_svc_wait_signal) still stops on SIGTERM. */
bool rf_svc_stopping(void) {
    if (atomic_load(&stop_flag)) return true;
    take(0);
    return atomic_load(&stop_flag);
}
