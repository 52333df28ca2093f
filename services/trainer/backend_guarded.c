/* The test device "cpu-guarded" (backend.h): cpu-staged whose memory host
 * code cannot touch. Every buffer of its alloc is a mapping of its own, kept
 * PROT_NONE except while one of its slots runs (then every mapping is
 * readable and writable, and the CPU's kernel runs on it). A host read or
 * write of a model buffer outside the backend, which on a GPU would read
 * garbage or crash, is here a SIGSEGV at the access, named by the handler
 * below with the allocation it hit and a backtrace. A collective on a host
 * group opens the buffers it reads and writes from its start to its wait
 * (comm.h's access hooks), so that MPI can move them; host code touching
 * those in that window goes unchecked, any other buffer stays closed.
 *
 * A count of the slots running says when every buffer is open, a count per
 * buffer when a collective holds it. The cost, an mprotect per buffer at
 * each change, suits the tiny test models. */
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/error.h"
#include "trainer/backend.h"
#include "trainer/backend_slots.h"

typedef struct region {
    void *p;
    size_t len;   /* mapped bytes, whole pages */
    size_t bytes; /* asked for */
    int holds;    /* collectives in flight on it */
} region;

static rf_backend guarded;
static const rf_backend *base; /* the CPU's table */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock;
static int opens;       /* slots running: every buffer is open */
static region *regions; /* the live allocations */
static size_t n_regions, cap_regions;
static size_t page;

static int protect(const region *r) {
    int prot = opens || r->holds ? PROT_READ | PROT_WRITE : PROT_NONE;
    if (mprotect(r->p, r->len, prot) != 0)
        return rf_fail(RF_ERR_IO, "cpu-guarded: mprotect of a buffer of %zu bytes failed",
                       r->bytes);
    return RF_OK;
}

static int protect_all(void) {
    int rc = RF_OK;
    for (size_t i = 0; i < n_regions && !rc; i++)
        rc = protect(&regions[i]);
    return rc;
}

/* Opens every buffer for a slot; guard_close follows it whatever it returns.
 * The buffers close again when no slot runs, but for those a collective
 * holds. */
static int guard_open(void) {
    pthread_mutex_lock(&lock);
    int rc = opens++ == 0 ? protect_all() : RF_OK;
    pthread_mutex_unlock(&lock);
    return rc;
}

static int guard_close(void) {
    pthread_mutex_lock(&lock);
    int rc = --opens == 0 ? protect_all() : RF_OK;
    pthread_mutex_unlock(&lock);
    return rc;
}

/* The comm layer's access hooks (comm.h): the buffers under [p, p + n) are
 * open from a collective's start to its wait, when MPI may read or write
 * them; host code touching any other buffer in that window still dies. */
static int hold(const void *p, size_t n, int by) {
    int rc = RF_OK;
    const char *a = p;
    for (size_t i = 0; n && i < n_regions && !rc; i++) {
        const char *q = regions[i].p;
        if (a < q + regions[i].len && q < a + n) {
            regions[i].holds += by;
            if (regions[i].holds == (by > 0)) rc = protect(&regions[i]); /* 0 <-> 1 */
        }
    }
    return rc;
}

static int comm_hold(const void *send, size_t sbytes, const void *recv, size_t rbytes, int by) {
    pthread_mutex_lock(&lock);
    int rc = hold(send, sbytes, by);
    int rc2 = hold(recv, rbytes, by);
    pthread_mutex_unlock(&lock);
    return rc ? rc : rc2;
}

static int comm_enter(const void *send, size_t sbytes, const void *recv, size_t rbytes) {
    return comm_hold(send, sbytes, recv, rbytes, 1);
}

static int comm_leave(const void *send, size_t sbytes, const void *recv, size_t rbytes) {
    return comm_hold(send, sbytes, recv, rbytes, -1);
}

static struct sigaction prev_segv; /* the handler ours replaced */

/* Names the buffer a stray access hit, then gives the signal back to the
 * handler that was there before (the default kills the process) for the
 * access's retry. */
static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    const char *a = si->si_addr;
    for (size_t i = 0; i < n_regions; i++) {
        const char *p = regions[i].p;
        if (a >= p && a < p + regions[i].len) {
            char msg[200];
            int n = snprintf(msg, sizeof msg,
                             "cpu-guarded: host code touched device memory at %p, byte %zu of a "
                             "buffer of %zu bytes, outside the backend's slots:\n",
                             si->si_addr, (size_t)(a - p), regions[i].bytes);
            if (n > 0) (void)!write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
            void *frames[32];
            backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
            break;
        }
    }
    sigaction(sig, &prev_segv, NULL);
}

/* Installs on_segv unless it is the handler already: at every allocation,
 * since a test harness (cmocka) may set its own between them. */
static void own_segv(void) {
    struct sigaction cur;
    if (sigaction(SIGSEGV, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
        cur.sa_sigaction == on_segv)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &prev_segv);
}

static int g_alloc(const rf_backend *be, void **out, size_t bytes) {
    (void)be;
    *out = NULL;
    size_t len = ((bytes ? bytes : 1) + page - 1) / page * page;
    pthread_mutex_lock(&lock);
    own_segv();
    int rc = RF_OK;
    if (n_regions == cap_regions) {
        size_t cap = cap_regions ? 2 * cap_regions : 64;
        region *r = realloc(regions, cap * sizeof *r);
        if (!r)
            rc = RF_ERR_NOMEM;
        else {
            regions = r;
            cap_regions = cap;
        }
    }
    void *p = MAP_FAILED;
    if (rc == RF_OK) {
        p = mmap(NULL, len, opens ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0); /* zeroed */
        if (p == MAP_FAILED) rc = rf_fail(RF_ERR_NOMEM, "cpu-guarded: mmap of %zu bytes", len);
    }
    if (rc == RF_OK) {
        regions[n_regions++] = (region){p, len, bytes, 0};
        *out = p;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static int g_free(const rf_backend *be, void *p) {
    (void)be;
    if (!p) return RF_OK;
    pthread_mutex_lock(&lock);
    size_t i = 0;
    while (i < n_regions && regions[i].p != p)
        i++;
    int rc = i == n_regions
                 ? rf_fail(RF_ERR_INVALID, "cpu-guarded: free of %p, not one of its buffers", p)
             : munmap(p, regions[i].len) ? rf_fail(RF_ERR_IO, "cpu-guarded: munmap of %p", p)
                                         : RF_OK;
    if (i < n_regions) regions[i] = regions[--n_regions];
    pthread_mutex_unlock(&lock);
    return rc;
}

/* One wrapper per slot: the CPU's kernel with the memory open. */
#define GUARDED(slot, params, args)                                                                \
    static int g_##slot params {                                                                   \
        int rc = guard_open();                                                                     \
        if (rc == RF_OK) rc = base->slot args;                                                     \
        int closed = guard_close();                                                                \
        return rc ? rc : closed;                                                                   \
    }
RF_BACKEND_SLOTS(GUARDED)
#undef GUARDED

static void init(void) {
    base = rf_backend_cpu();
    page = (size_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_init(&lock, NULL);
    rf_comm_set_access_hooks(comm_enter, comm_leave);
    guarded = *base;
    guarded.name = "cpu-guarded";
    guarded.device_memory = false;
    guarded.alloc = g_alloc;
    guarded.free = g_free;
#define WRAP(slot, params, args)                                                                   \
    if (base->slot) guarded.slot = g_##slot;
    RF_BACKEND_SLOTS(WRAP)
#undef WRAP
}

const rf_backend *rf_backend_cpu_guarded(void) {
    pthread_once(&once, init);
    return &guarded;
}
