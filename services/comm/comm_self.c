/* The self backend: a group of one host process. Reductions and gathers over
 * one rank are copies (nothing when in place), broadcast and barrier do
 * nothing, and a send to oneself completes a receive posted before it or is
 * buffered until the next receive (like MPI's buffered send), so code written
 * for N ranks (irecv from prev, isend to next, wait, wait) runs unchanged at
 * 1. A receive still unmatched when it is tested or waited on can never
 * complete in a group of one: it fails at once instead of timing out. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "common/error.h"

typedef struct self_msg {
    struct self_msg *next;
    size_t bytes;
    unsigned char data[];
} self_msg;

typedef struct self_req {
    rf_comm_req *next; /* posted receives not yet matched, oldest first */
    int matched;
    int err; /* a size mismatch found when matched */
} self_req;

typedef struct self_impl {
    self_msg *head, *tail;      /* sends not yet received, oldest first */
    rf_comm_req *posted, *last; /* receives waiting for a send */
} self_impl;

static self_req *sreq(rf_comm_req *r) {
    return (self_req *)r->be;
}

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
    case RF_COMM_K_SENDRECV: /* to and from rank 0: oneself (equal sizes: comm.c) */
        copy(k->recv, k->send, bytes);
        return RF_OK;
    case RF_COMM_K_BROADCAST:
    case RF_COMM_K_BARRIER:
        return RF_OK;
    case RF_COMM_K_SEND: {
        if (s->posted) { /* an earlier receive takes it */
            rf_comm_req *r = s->posted;
            s->posted = sreq(r)->next;
            if (!s->posted) s->last = NULL;
            sreq(r)->matched = 1;
            if (r->call.count * rf_comm_dtype_size(r->call.dtype) != bytes)
                sreq(r)->err = 1;
            else if (bytes)
                memcpy(r->call.recv, k->send, bytes);
            return RF_OK;
        }
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
        if (!m) { /* wait for a later send of this process */
            if (s->last)
                sreq(s->last)->next = req;
            else
                s->posted = req;
            s->last = req;
            return RF_OK;
        }
        if (m->bytes != bytes)
            return rf_fail(RF_ERR_INVALID, "the message has %zu bytes, the receive expects %zu",
                           m->bytes, bytes);
        if (bytes) memcpy(k->recv, m->data, bytes);
        s->head = m->next;
        if (!s->head) s->tail = NULL;
        free(m);
        sreq(req)->matched = 1;
        return RF_OK;
    }
    }
    return rf_fail(RF_ERR_INTERNAL, "unknown operation %d", (int)k->kind);
}

static void unpost(self_impl *s, rf_comm_req *req) {
    rf_comm_req **p = &s->posted, *prev = NULL;
    for (; *p && *p != req; prev = *p, p = &sreq(*p)->next) {
    }
    if (!*p) return;
    *p = sreq(req)->next;
    if (s->last == req) s->last = prev;
}

static int self_test(rf_comm *c, rf_comm_req *req, int *done) {
    if (req->call.kind != RF_COMM_K_RECV) {
        *done = 1;
        return RF_OK;
    }
    if (!sreq(req)->matched) {
        unpost(c->impl, req);
        /* MPI would wait forever: with one rank nobody else can send. */
        return rf_fail(RF_ERR_INVALID, "no message was sent to this rank");
    }
    *done = 1;
    if (sreq(req)->err) return rf_fail(RF_ERR_INVALID, "the message size differs from the receive");
    return RF_OK;
}

static int self_abandon(rf_comm *c, rf_comm_req *req) {
    if (req->call.kind == RF_COMM_K_RECV && c->impl) unpost(c->impl, req);
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
    .req_size = sizeof(self_req),
    .start = self_start,
    .test = self_test,
    .abandon = self_abandon,
    .split = self_split,
    .destroy = self_destroy,
};
