/* The 1F1B schedule and its executor (pipeline.h). */
#include "trainer/pipeline.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"

int rf_pp_warmup(int stages, int stage, int micro) {
    int w = stages - stage - 1;
    return w < micro ? w : micro;
}

int rf_pp_schedule(int stages, int stage, int micro, rf_pp_op *ops) {
    if (stages < 1 || stage < 0 || stage >= stages || micro < 1)
        return rf_fail(RF_ERR_INVALID,
                       "pipeline: stage %d of %d stages with %d micro-batch(es): need 0 <= stage "
                       "< stages and micro-batches >= 1",
                       stage, stages, micro);
    int w = rf_pp_warmup(stages, stage, micro), n = 0;
    for (int i = 0; i < w; i++)
        ops[n++] = (rf_pp_op){RF_PP_FWD, i};
    for (int k = 0; k < micro - w; k++) {
        ops[n++] = (rf_pp_op){RF_PP_FWD, w + k};
        ops[n++] = (rf_pp_op){RF_PP_BWD, k};
    }
    for (int k = micro - w; k < micro; k++)
        ops[n++] = (rf_pp_op){RF_PP_BWD, k};
    return RF_OK;
}

double rf_pp_bubble_theory(int stages, int micro) {
    return stages < 1 || micro < 1 ? 0 : (double)(stages - 1) / (double)(micro + stages - 1);
}

/* A send in flight and the buffer it reads from (freed once it completed). */
typedef struct pending {
    rf_comm_req *req;
    float *buf;
    size_t n;
} pending;

typedef struct run {
    rf_comm *pp;
    int p, s, m;
    const rf_pp_stage *st;
    float **in, **dout;    /* per micro-batch: received activation, received gradient */
    size_t *in_n, *dout_n; /* their float counts */
    rf_comm_req **in_req, **dout_req;
    pending *sends; /* 2 * m slots; a completed one has req NULL */
    int nsends;
    int next_in, next_dout; /* the next receive of each kind to post */
    size_t live, peak;      /* boundary floats held */
    rf_pp_stats *stats;
    bool lost; /* paired: a transfer failed, so its buffers may still be in use */
} run;

static void hold(run *r, size_t n) {
    r->live += n;
    if (r->live > r->peak) r->peak = r->live;
}

static int fail_comm(int rc, const char *what, int micro) {
    return rf_fail_ctx(rc, "pipeline: %s of micro-batch %d", what, micro);
}

/* Posts the receive of the next activation (from stage s - 1) or the next
 * output gradient (from stage s + 1), if there is one to post. */
static int post_recv(run *r, bool grad) {
    int *next = grad ? &r->next_dout : &r->next_in;
    if (*next >= r->m || (grad ? r->s == r->p - 1 : r->s == 0)) return RF_OK;
    int i = (*next)++, edge = grad ? r->s : r->s - 1;
    size_t n = r->st->boundary(r->st->user, edge, i);
    float *buf = malloc((n ? n : 1) * sizeof *buf);
    if (!buf) return rf_fail(RF_ERR_NOMEM, "pipeline: no memory for %zu floats", n);
    hold(r, n);
    (grad ? r->dout : r->in)[i] = buf;
    (grad ? r->dout_n : r->in_n)[i] = n;
    int rc = rf_comm_irecv(r->pp, buf, n, RF_COMM_F32, grad ? r->s + 1 : r->s - 1,
                           &(grad ? r->dout_req : r->in_req)[i]);
    return rc ? fail_comm(rc, grad ? "receive of the gradient" : "receive of the activation", i)
              : RF_OK;
}

/* Waits for a posted receive (the time is bubble), then posts the next one. */
static int await(run *r, bool grad, int i) {
    rf_comm_req **req = &(grad ? r->dout_req : r->in_req)[i];
    double t = rf_now();
    int rc = rf_comm_wait(*req);
    *req = NULL;
    r->stats->recv_s += rf_now() - t;
    if (rc) { /* the transport may still write into the buffer: it stays allocated */
        (grad ? r->dout : r->in)[i] = NULL;
        return fail_comm(rc, grad ? "receive of the gradient" : "receive of the activation", i);
    }
    r->stats->bytes_recv += (grad ? r->dout_n : r->in_n)[i] * sizeof(float);
    return post_recv(r, grad);
}

/* Frees the buffers of completed sends; with `all`, waits for every one. */
static int reap(run *r, bool all) {
    for (int k = 0; k < r->nsends; k++) {
        pending *q = &r->sends[k];
        if (!q->req) continue;
        int done = 1, rc = all ? RF_OK : rf_comm_test(q->req, &done);
        if (!rc && done) {
            rc = rf_comm_wait(q->req);
            q->req = NULL;
            if (!rc) {
                free(q->buf);
                q->buf = NULL;
                r->live -= q->n;
            }
        }
        if (rc) { /* the transport may still read the buffer: it stays allocated */
            q->req = NULL;
            q->buf = NULL;
            return rf_fail_ctx(rc, "pipeline: a send to a neighbouring stage");
        }
    }
    return RF_OK;
}

static int send(run *r, float *buf, size_t n, int peer) {
    pending *q = &r->sends[r->nsends++];
    q->buf = buf;
    q->n = n;
    r->stats->bytes_sent += n * sizeof(float);
    int rc = rf_comm_isend(r->pp, buf, n, RF_COMM_F32, peer, &q->req);
    return rc ? rf_fail_ctx(rc, "pipeline: send to stage %d", peer) : RF_OK;
}

static int forward(run *r, int i) {
    int rc;
    if (r->s > 0 && (rc = await(r, false, i))) return rc;
    float *out = NULL;
    size_t n = 0;
    if (r->s < r->p - 1) {
        n = r->st->boundary(r->st->user, r->s, i);
        if (!(out = malloc((n ? n : 1) * sizeof *out)))
            return rf_fail(RF_ERR_NOMEM, "pipeline: no memory for %zu floats", n);
        hold(r, n);
    }
    double t = rf_now();
    rc = r->st->forward(r->st->user, i, r->in[i], out);
    r->stats->compute_s += rf_now() - t;
    if (rc) {
        free(out);
        return rc;
    }
    if (out && (rc = send(r, out, n, r->s + 1))) return rc;
    return reap(r, false);
}

static int backward(run *r, int i) {
    int rc;
    if (r->s < r->p - 1 && (rc = await(r, true, i))) return rc;
    float *din = NULL;
    size_t n = 0;
    if (r->s > 0) {
        n = r->st->boundary(r->st->user, r->s - 1, i);
        if (!(din = calloc(n ? n : 1, sizeof *din)))
            return rf_fail(RF_ERR_NOMEM, "pipeline: no memory for %zu floats", n);
        hold(r, n);
    }
    double t = rf_now();
    rc = r->st->backward(r->st->user, i, r->in[i], r->dout[i], din);
    r->stats->compute_s += rf_now() - t;
    if (rc) {
        free(din);
        return rc;
    }
    free(r->in[i]); /* this micro-batch is done with its input and its output's gradient */
    free(r->dout[i]);
    r->in[i] = r->dout[i] = NULL;
    r->live -= r->in_n[i] + r->dout_n[i];
    if (din && (rc = send(r, din, n, r->s - 1))) return rc;
    return reap(r, false);
}

/* ---- the paired executor (pipeline.h) ---- */

/* n floats of the stage's memory (its alloc, or malloc), counted as held. */
static float *get(run *r, size_t n) {
    float *b = r->st->alloc ? r->st->alloc(r->st->user, n) : malloc((n ? n : 1) * sizeof *b);
    if (!b && !r->st->alloc) rf_fail(RF_ERR_NOMEM, "pipeline: no memory for %zu floats", n);
    if (b) hold(r, n);
    return b;
}

/* Gives back a buffer of n floats (NULL: none). After a failed transfer the
 * transport may still write into it: it stays allocated (pipeline.h). */
static void put(run *r, float *b, size_t n) {
    if (!b || r->lost) return;
    r->live -= n;
    if (r->st->release)
        r->st->release(r->st->user, b);
    else
        free(b);
}

/* One blocking transfer: sb (sn floats) to stage dst and/or rb (rn floats)
 * from stage src, one grouped exchange when both. Its time is the stage's
 * waiting. */
static int xfer(run *r, const float *sb, size_t sn, int dst, float *rb, size_t rn, int src,
                const char *what, int micro) {
    double t = rf_now();
    int rc = sb && rb ? rf_comm_sendrecv_n(r->pp, sb, sn, dst, rb, rn, src, RF_COMM_F32)
             : sb     ? rf_comm_send(r->pp, sb, sn, RF_COMM_F32, dst)
                      : rf_comm_recv(r->pp, rb, rn, RF_COMM_F32, src);
    r->stats->recv_s += rf_now() - t;
    if (rc) {
        r->lost = true;
        return fail_comm(rc, what, micro);
    }
    if (sb) r->stats->bytes_sent += sn * sizeof(float);
    if (rb) r->stats->bytes_recv += rn * sizeof(float);
    return RF_OK;
}

/* Allocates micro-batch i's input (edge s - 1) into r->in[i]. */
static int get_in(run *r, int i) {
    r->in_n[i] = r->st->boundary(r->st->user, r->s - 1, i);
    return (r->in[i] = get(r, r->in_n[i])) ? RF_OK : RF_ERR_NOMEM;
}

/* F(i) into a new output buffer (*out NULL on the last stage). */
static int paired_fwd(run *r, int i, float **out, size_t *n) {
    *out = NULL;
    *n = 0;
    if (r->s < r->p - 1) {
        *n = r->st->boundary(r->st->user, r->s, i);
        if (!(*out = get(r, *n))) return RF_ERR_NOMEM;
    }
    double t = rf_now();
    int rc = r->st->forward(r->st->user, i, r->in[i], *out);
    r->stats->compute_s += rf_now() - t;
    return rc;
}

/* B(k) with its received gradient dout (NULL on the last stage) into a new
 * input gradient *din (NULL on stage 0); frees the input and dout. */
static int paired_bwd(run *r, int k, float *dout, size_t nd, float **din, size_t *n) {
    *din = NULL;
    *n = 0;
    if (r->s > 0) {
        *n = r->st->boundary(r->st->user, r->s - 1, k);
        if (!(*din = get(r, *n))) return RF_ERR_NOMEM;
    }
    double t = rf_now();
    int rc = r->st->backward(r->st->user, k, r->in[k], dout, *din);
    r->stats->compute_s += rf_now() - t;
    put(r, dout, nd);
    put(r, r->in[k], r->in_n[k]);
    r->in[k] = NULL;
    return rc;
}

static int run_paired(run *r) {
    int s = r->s, m = r->m, w = rf_pp_warmup(r->p, s, m), rc = RF_OK;
    bool first = s == 0, last = s == r->p - 1;
    float *out = NULL, *dout = NULL, *din = NULL;
    size_t no = 0, nd = 0, ni = 0;
    for (int i = 0; i < w && !rc; i++) { /* warmup: never the last stage */
        if (!first && !(rc = get_in(r, i)))
            rc = xfer(r, NULL, 0, -1, r->in[i], r->in_n[i], s - 1, "receive of the activation", i);
        if (!rc && !(rc = paired_fwd(r, i, &out, &no)))
            rc = xfer(r, out, no, s + 1, NULL, 0, -1, "send of the activation", i);
        put(r, out, no);
        out = NULL;
    }
    if (!rc && w < m && !first && !(rc = get_in(r, w)))
        rc = xfer(r, NULL, 0, -1, r->in[w], r->in_n[w], s - 1, "receive of the activation", w);
    for (int k = 0; k < m - w && !rc; k++) { /* steady */
        int i = w + k;
        if ((rc = paired_fwd(r, i, &out, &no))) break;
        if (!last) {
            nd = r->st->boundary(r->st->user, s, k);
            if (!(dout = get(r, nd))) rc = RF_ERR_NOMEM;
            if (!rc)
                rc = xfer(r, out, no, s + 1, dout, nd, s + 1,
                          "send of the activation with the receive of the gradient", i);
        }
        put(r, out, no);
        out = NULL;
        if (rc) break;
        rc = paired_bwd(r, k, dout, nd, &din, &ni);
        dout = NULL;
        if (!rc && !first) {
            if (i + 1 < m && !(rc = get_in(r, i + 1)))
                rc = xfer(r, din, ni, s - 1, r->in[i + 1], r->in_n[i + 1], s - 1,
                          "send of the gradient with the receive of the activation", k);
            else if (!rc)
                rc = xfer(r, din, ni, s - 1, NULL, 0, -1, "send of the gradient", k);
        }
        put(r, din, ni);
        din = NULL;
    }
    for (int k = m - w; k < m && !rc; k++) { /* cooldown: never the last stage */
        nd = r->st->boundary(r->st->user, s, k);
        if (!(dout = get(r, nd))) {
            rc = RF_ERR_NOMEM;
            break;
        }
        if ((rc = xfer(r, NULL, 0, -1, dout, nd, s + 1, "receive of the gradient", k))) break;
        rc = paired_bwd(r, k, dout, nd, &din, &ni);
        dout = NULL;
        if (!rc && !first) rc = xfer(r, din, ni, s - 1, NULL, 0, -1, "send of the gradient", k);
        put(r, din, ni);
        din = NULL;
    }
    put(r, dout, nd);
    for (int i = 0; i < m; i++) { /* inputs left by an error */
        put(r, r->in[i], r->in_n[i]);
        r->in[i] = NULL;
    }
    return rc;
}

int rf_pp_run(rf_comm *pp, int micro, const rf_pp_stage *st, rf_pp_stats *stats) {
    rf_pp_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    run r = {.pp = pp,
             .p = pp ? rf_comm_world(pp) : 1,
             .s = pp ? rf_comm_rank(pp) : 0,
             .m = micro,
             .st = st,
             .stats = stats};
    rf_pp_op *ops = micro > 0 ? malloc(2 * (size_t)micro * sizeof *ops) : NULL;
    if (micro > 0 && !ops) return RF_ERR_NOMEM;
    int rc = rf_pp_schedule(r.p, r.s, micro, ops);
    if (rc) {
        free(ops);
        return rc;
    }
    stats->stages = r.p;
    stats->stage = r.s;
    stats->micro = micro;
    stats->theory = rf_pp_bubble_theory(r.p, micro);
    size_t m = (size_t)micro;
    r.in = calloc(m, sizeof *r.in);
    r.dout = calloc(m, sizeof *r.dout);
    r.in_n = calloc(m, sizeof *r.in_n);
    r.dout_n = calloc(m, sizeof *r.dout_n);
    r.in_req = calloc(m, sizeof *r.in_req);
    r.dout_req = calloc(m, sizeof *r.dout_req);
    r.sends = calloc(2 * m, sizeof *r.sends);
    if (!r.in || !r.dout || !r.in_n || !r.dout_n || !r.in_req || !r.dout_req || !r.sends)
        rc = rf_fail(RF_ERR_NOMEM, "pipeline: no memory for %d micro-batches", micro);
    double ta = rf_now();
    if (!rc && r.p > 1 && (rc = rf_comm_barrier(pp)))
        rc = rf_fail_ctx(rc, "pipeline: barrier before the first micro-batch");
    double t0 = rf_now();
    stats->align_s = t0 - ta;
    if (!rc && st->paired) {
        rc = run_paired(&r);
    } else if (!rc) {
        rc = post_recv(&r, false);
        if (!rc) rc = post_recv(&r, true);
        for (int k = 0; !rc && k < 2 * micro; k++)
            rc = ops[k].kind == RF_PP_FWD ? forward(&r, ops[k].micro) : backward(&r, ops[k].micro);
    }
    double t1 = rf_now();
    if (!rc && !st->paired) rc = reap(&r, true);
    if (!rc && r.p > 1 && (rc = rf_comm_barrier(pp)))
        rc = rf_fail_ctx(rc, "pipeline: barrier after the last micro-batch");
    double t2 = rf_now();
    /* one stage sends nothing and waits for nobody: no flush (what reap took
     * there is bookkeeping, and a bubble of 0 at p 1 is exact) */
    stats->flush_s = r.p > 1 ? t2 - t1 : 0;
    stats->step_s = t2 - t0;
    stats->bubble = stats->step_s > 0 ? (stats->recv_s + stats->flush_s) / stats->step_s : 0;
    stats->peak_floats = r.peak;
    /* Buffers whose request is still pending (after an error) stay allocated
     * on purpose (see pipeline.h); everything else is freed (run_paired
     * gave its own back). */
    for (int i = 0; i < micro && r.in && !st->paired; i++) {
        if (r.in_req && !r.in_req[i]) free(r.in[i]);
        if (r.dout_req && !r.dout_req[i]) free(r.dout[i]);
    }
    for (int k = 0; k < r.nsends; k++)
        if (!r.sends[k].req) free(r.sends[k].buf);
    free(r.in);
    free(r.dout);
    free(r.in_req);
    free(r.dout_req);
    free(r.sends);
    free(r.in_n);
    free(r.dout_n);
    free(ops);
    return rc;
}
