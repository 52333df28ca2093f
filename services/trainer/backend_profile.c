/* The backend profiler (backend_profile.h): a wrapper per slot, generated
 * from backend_slots.h, that forwards to the inner backend and, while
 * profiling is on, waits for its queue and charges the time to the slot. */
#include "trainer/backend_profile.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"
#include "trainer/backend_slots.h"

/* Every slot's index, in the struct's order. */
#define SLOT_INDEX(slot, params, args) SLOT_##slot,
enum { RF_BACKEND_SLOTS(SLOT_INDEX) NSLOTS };
#undef SLOT_INDEX

/* The slot list covers rf_backend from zero to its end: a slot added to the
 * struct but not to backend_slots.h stops the build here. */
#define SLOT_MEMBER(slot, params, args) void (*slot)(void);
struct slot_list {
    RF_BACKEND_SLOTS(SLOT_MEMBER)
};
#undef SLOT_MEMBER
_Static_assert(sizeof(rf_backend) - offsetof(rf_backend, zero) == sizeof(struct slot_list),
               "backend_slots.h does not list every slot of rf_backend");

#define SLOT_NAME(slot, params, args) #slot,
static const char *const slot_names[NSLOTS] = {RF_BACKEND_SLOTS(SLOT_NAME)};
#undef SLOT_NAME

struct rf_backend_profile {
    rf_backend be; /* the wrapper; be.ctx points back here */
    const rf_backend *inner;
    void *sync; /* one byte of inner's memory, read back to wait for its queue */
    bool on;
    long calls[NSLOTS];
    double seconds[NSLOTS];
    char name[64];
};

static int p_alloc(const rf_backend *be, void **out, size_t bytes) {
    const rf_backend *in = ((const rf_backend_profile *)be->ctx)->inner;
    return in->alloc(in, out, bytes);
}

static int p_free(const rf_backend *be, void *p) {
    const rf_backend *in = ((const rf_backend_profile *)be->ctx)->inner;
    return in->free(in, p);
}

/* The arguments after the backend, so that inner gets itself as be. */
#define AFTER_BE(be, ...) __VA_ARGS__

/* (The locals are prefixed: a slot's own parameters take plain names.) */
#define PROFILED(slot, params, args)                                                               \
    static int p_##slot params {                                                                   \
        rf_backend_profile *prof_p = be->ctx;                                                      \
        const rf_backend *prof_in = prof_p->inner;                                                 \
        if (!prof_p->on) return prof_in->slot(prof_in, AFTER_BE args);                             \
        double prof_t0 = rf_now();                                                                 \
        int prof_rc = prof_in->slot(prof_in, AFTER_BE args);                                       \
        char prof_byte;                                                                            \
        int prof_waited = prof_in->to_host(prof_in, &prof_byte, prof_p->sync, 1);                  \
        prof_p->seconds[SLOT_##slot] += rf_now() - prof_t0;                                        \
        prof_p->calls[SLOT_##slot]++;                                                              \
        return prof_rc ? prof_rc : prof_waited;                                                    \
    }
RF_BACKEND_SLOTS(PROFILED)
#undef PROFILED

int rf_backend_profile_new(const rf_backend *inner, rf_backend_profile **out) {
    *out = NULL;
    rf_backend_profile *p = calloc(1, sizeof *p);
    if (!p) return rf_fail(RF_ERR_NOMEM, "backend profile: out of memory");
    int rc = inner->alloc(inner, &p->sync, 1);
    if (rc) {
        free(p);
        return rc;
    }
    p->inner = inner;
    snprintf(p->name, sizeof p->name, "%s+profile", inner->name);
    p->be = *inner;
    p->be.name = p->name;
    p->be.ctx = p;
    p->be.alloc = p_alloc;
    p->be.free = p_free;
#define WRAP(slot, params, args) p->be.slot = inner->slot ? p_##slot : NULL;
    RF_BACKEND_SLOTS(WRAP)
#undef WRAP
    *out = p;
    return RF_OK;
}

const rf_backend *rf_backend_profile_backend(const rf_backend_profile *p) {
    return &p->be;
}

void rf_backend_profile_enable(rf_backend_profile *p, bool on) {
    p->on = on;
}

void rf_backend_profile_reset(rf_backend_profile *p) {
    memset(p->calls, 0, sizeof p->calls);
    memset(p->seconds, 0, sizeof p->seconds);
}

size_t rf_backend_profile_rows(const rf_backend_profile *p, rf_slot_time *rows, size_t room) {
    size_t n = 0;
    for (int s = 0; s < NSLOTS; s++) {
        if (!p->calls[s]) continue;
        rf_slot_time r = {slot_names[s], p->calls[s], p->seconds[s]};
        /* insertion into the first min(n, room) rows, most seconds first */
        size_t k = n < room ? n : room;
        while (k > 0 && rows[k - 1].seconds < r.seconds) {
            if (k < room) rows[k] = rows[k - 1];
            k--;
        }
        if (k < room) rows[k] = r;
        n++;
    }
    return n;
}

void rf_backend_profile_free(rf_backend_profile *p) {
    if (!p) return;
    (void)p->inner->free(p->inner, p->sync);
    free(p);
}
