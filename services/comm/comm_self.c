/* The self backend: a group of one host process. Reductions and gathers over
 * one rank are copies (nothing when in place), broadcast and barrier do
 * nothing, and a send to oneself is buffered until the matching receive (like
 * MPI's buffered send), so code written for N ranks runs unchanged at 1. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "common/error.h"

typedef struct self_msg {
    struct self_msg *next;
    size_t bytes;
    unsigned char data[];
} self_msg;

typedef struct self_impl {
    self_msg *head, *tail; /* sends not yet received, oldest first */
} self_impl;

static self_impl *impl_of(rf_comm *c) {
    if (!c->impl) c->impl = calloc(1, sizeof(self_impl));
    return c->impl;
}

static void copy(void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memmove(dst, src, bytes);
}

static int self_start(rf_comm *c, const rf_comm_call *k, rf_comm_req *req) {
    size_t bytes = k->count * rf_comm_dtype_size(k->dtype);
    self_impl *s = impl_of(c);
    if (!s) return rf_fail(RF_ERR_NOMEM, "out of memory");
    switch (k->kind) {
    case RF_COMM_K_ALLREDUCE:      /* the sum, max, min or mean of one value is that value */
    case RF_COMM_K_REDUCE_SCATTER: /* one block of world*count = count elements */
    case RF_COMM_K_ALLGATHER:
        copy(k->recv, k->send, bytes);
        return RF_OK;
    case RF_COMM_K_BROADCAST:
    case RF_COMM_K_BARRIER:
        return RF_OK;
    case RF_COMM_K_SEND: {
        self_msg *m = malloc(sizeof *m + bytes);
        if (!m) return rf_fail(RF_ERR_NOMEM, "out of memory");
        m->next = NULL, m->bytes = bytes;
        if (bytes) memcpy(m->data, k->send, bytes);
        if (s->tail)
            s->tail->next = m;
        else
            s->head = m;
        s->tail = m;
        return RF_OK;
    }
    case RF_COMM_K_RECV: {
        self_msg *m = s->head;
        /* MPI would wait forever here: with one rank nobody else can send. */
        if (!m) return rf_fail(RF_ERR_INVALID, "no message was sent to this rank");
        if (m->bytes != bytes)
            return rf_fail(RF_ERR_INVALID, "the message has %zu bytes, the receive expects %zu",
                           m->bytes, bytes);
        if (bytes) memcpy(k->recv, m->data, bytes);
        s->head = m->next;
        if (!s->head) s->tail = NULL;
        free(m);
        return RF_OK;
    }
    }
    return rf_fail(RF_ERR_INTERNAL, "unknown operation %d", (int)k->kind);
}

static int self_test(rf_comm *c, rf_comm_req *req, int *done) {
    *done = 1;
    return RF_OK;
}

static int self_abandon(rf_comm *c, rf_comm_req *req) {
    return RF_OK;
}

static int self_split(rf_comm *c, int color, int key, rf_comm *out) {
    out->rank = 0, out->world = 1, out->impl = NULL;
    return RF_OK;
}

static int self_destroy(rf_comm *c, int finalize) {
    self_impl *s = c->impl;
    if (!s) return RF_OK;
    for (self_msg *m = s->head, *n; m; m = n) {
        n = m->next;
        free(m);
    }
    free(s);
    c->impl = NULL;
    return RF_OK;
}

const rf_comm_backend rf_comm_self_backend = {
    .name = "self",
    .req_size = 0,
    .start = self_start,
    .test = self_test,
    .abandon = self_abandon,
    .split = self_split,
    .destroy = self_destroy,
};
