/* The backend profiler: where a training step's device time goes, slot by
 * slot, on any backend, without a vendor profiler (a GPU machine lent for a
 * few minutes has no package registry to install one from).
 *
 * rf_backend_profile_new wraps a backend ("inner") in a backend of its own
 * whose every slot forwards to inner's. While profiling is on, each slot
 * then waits for inner's queue (a 1-byte to_host from a buffer of inner's)
 * and charges the wall time from its call to the end of that wait to the
 * slot: calls and seconds per slot. The time is the device's time for the
 * kernels the slot queued plus one launch and one wait, because the wait
 * leaves nothing else queued; the waits serialise host and device, so a
 * profiled step is slower than a plain one, and what the breakdown is for is
 * the shares. While it is off, a slot forwards and nothing else.
 *
 * The wrapper's memory is inner's (alloc and free forward), so is its queue
 * and device_memory; its name is "<inner>+profile". Results are inner's bit
 * for bit. Like every backend that is not the CPU's own, code that checks
 * be == rf_backend_cpu() takes its device paths (as for cpu-staged).
 *
 * Ownership: the caller frees the profile (and so the backend) after
 * everything allocated on it is freed. One thread at a time, as the backends
 * it wraps. */
#ifndef RF_TR_BACKEND_PROFILE_H
#define RF_TR_BACKEND_PROFILE_H

#include <stdbool.h>
#include <stddef.h>

#include "trainer/backend.h"

typedef struct rf_backend_profile rf_backend_profile;

/* One slot's total since the last reset. */
typedef struct rf_slot_time {
    const char *slot; /* the rf_backend member's name, "linear_fwd" */
    long calls;
    double seconds;
} rf_slot_time;

/* A profile wrapping inner, profiling off. RF_ERR_NOMEM, or inner's error
 * for its 1-byte buffer. */
int rf_backend_profile_new(const rf_backend *inner, rf_backend_profile **out);
/* The wrapping backend (owned by p). */
const rf_backend *rf_backend_profile_backend(const rf_backend_profile *p);
/* Profiling on or off (off: the slots only forward). */
void rf_backend_profile_enable(rf_backend_profile *p, bool on);
/* Every slot's calls and seconds back to zero. */
void rf_backend_profile_reset(rf_backend_profile *p);
/* The slots called since the last reset, most seconds first (ties: the
 * struct's order), at most room of them into rows; returns how many were
 * called, which may exceed room. */
size_t rf_backend_profile_rows(const rf_backend_profile *p, rf_slot_time *rows, size_t room);
/* Frees p and its buffer; NULL is a no-op. */
void rf_backend_profile_free(rf_backend_profile *p);

#endif
