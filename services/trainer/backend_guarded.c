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
#define GUARDED(slot, params, ...)                                                                 \
    static int g_##slot params {                                                                   \
        int rc = guard_open();                                                                     \
        if (rc == RF_OK) rc = base->slot(__VA_ARGS__);                                             \
        int closed = guard_close();                                                                \
        return rc ? rc : closed;                                                                   \
    }
GUARDED(zero, (const rf_backend *be, void *p, size_t bytes), be, p, bytes)
GUARDED(to_host, (const rf_backend *be, void *dst, const void *src, size_t bytes), be, dst, src,
        bytes)
GUARDED(to_device, (const rf_backend *be, void *dst, const void *src, size_t bytes), be, dst, src,
        bytes)
GUARDED(copy, (const rf_backend *be, void *dst, const void *src, size_t bytes), be, dst, src, bytes)
GUARDED(copy2d,
        (const rf_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch,
         size_t width, size_t rows),
        be, dst, dpitch, src, spitch, width, rows)
GUARDED(embed_fwd,
        (const rf_backend *be, float *out, const int32_t *ids, const int32_t *types,
         const float *wte, const float *wpe, const float *wtt, int B, int T, int C),
        be, out, ids, types, wte, wpe, wtt, B, T, C)
GUARDED(embed_bwd,
        (const rf_backend *be, float *dwte, float *dwpe, float *dwtt, const float *dout,
         const int32_t *ids, const int32_t *types, int B, int T, int C, int V, int TV),
        be, dwte, dwpe, dwtt, dout, ids, types, B, T, C, V, TV)
GUARDED(layernorm_fwd,
        (const rf_backend *be, float *out, float *mean, float *rstd, const float *inp,
         const float *w, const float *b, int N, int C, float eps),
        be, out, mean, rstd, inp, w, b, N, C, eps)
GUARDED(layernorm_bwd,
        (const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
         const float *inp, const float *w, const float *mean, const float *rstd, int N, int C),
        be, dinp, dw, db, dout, inp, w, mean, rstd, N, C)
GUARDED(linear_fwd,
        (const rf_backend *be, float *out, const float *inp, const float *w, const float *b, int N,
         int IC, int OC),
        be, out, inp, w, b, N, IC, OC)
GUARDED(linear_bwd,
        (const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
         const float *inp, const float *w, int N, int IC, int OC),
        be, dinp, dw, db, dout, inp, w, N, IC, OC)
GUARDED(attention_fwd,
        (const rf_backend *be, float *out, float *att, float *scratch, const float *qkv,
         const uint8_t *valid, int B, int T, int Tq, int C, int NH, int h0, int NHall, float pdrop,
         uint64_t seed),
        be, out, att, scratch, qkv, valid, B, T, Tq, C, NH, h0, NHall, pdrop, seed)
GUARDED(attention_bwd,
        (const rf_backend *be, float *dqkv, float *scratch, const float *dout, const float *qkv,
         const float *att, int B, int T, int Tq, int C, int NH, int h0, int NHall, float pdrop,
         uint64_t seed),
        be, dqkv, scratch, dout, qkv, att, B, T, Tq, C, NH, h0, NHall, pdrop, seed)
GUARDED(linear_ld_fwd,
        (const rf_backend *be, float *out, int ldo, const float *inp, int ldi, const float *w,
         int ldw, const float *b, int N, int IC, int OC),
        be, out, ldo, inp, ldi, w, ldw, b, N, IC, OC)
GUARDED(linear_ld_bwd,
        (const rf_backend *be, float *dinp, int lddi, float *dw, int lddw, float *db,
         const float *dout, int ldd, const float *inp, int ldi, const float *w, int ldw, int N,
         int IC, int OC),
        be, dinp, lddi, dw, lddw, db, dout, ldd, inp, ldi, w, ldw, N, IC, OC)
GUARDED(embed_rows_fwd,
        (const rf_backend *be, float *out, const int32_t *ids, const float *w, int lo, int hi,
         int N, int C),
        be, out, ids, w, lo, hi, N, C)
GUARDED(embed_add_fwd,
        (const rf_backend *be, float *out, const int32_t *pos, const int32_t *types,
         const float *wpe, const float *wtt, int B, int T, int C),
        be, out, pos, types, wpe, wtt, B, T, C)
GUARDED(kv_attention_fwd,
        (const rf_backend *be, float *out, float *scores, const float *qkv, const float *kc,
         const float *vc, int n, int len, int NH, int NKV, int hd),
        be, out, scores, qkv, kc, vc, n, len, NH, NKV, hd)
GUARDED(vxent_stats,
        (const rf_backend *be, float *mx, float *tl, const float *logits, int ldz,
         const int32_t *tgt, int lo, int hi, int N),
        be, mx, tl, logits, ldz, tgt, lo, hi, N)
GUARDED(vxent_sumexp,
        (const rf_backend *be, double *se, const float *logits, int ldz, const float *mx, int lo,
         int hi, int N),
        be, se, logits, ldz, mx, lo, hi, N)
GUARDED(vxent_loss,
        (const rf_backend *be, float *loss, float *losses, const float *mx, const double *se,
         const int32_t *tgt, int N),
        be, loss, losses, mx, se, tgt, N)
GUARDED(vxent_bwd,
        (const rf_backend *be, float *dlogits, int ldd, const float *logits, int ldz,
         const float *mx, const double *se, const int32_t *tgt, int lo, int hi, int N, float scale),
        be, dlogits, ldd, logits, ldz, mx, se, tgt, lo, hi, N, scale)
GUARDED(embed_rows_bwd,
        (const rf_backend *be, float *dw, float *dwpe, float *dwtt, const float *dout,
         const int32_t *ids, const int32_t *types, int lo, int hi, int B, int T, int C),
        be, dw, dwpe, dwtt, dout, ids, types, lo, hi, B, T, C)
GUARDED(gelu_fwd, (const rf_backend *be, float *out, const float *inp, size_t n), be, out, inp, n)
GUARDED(gelu_bwd,
        (const rf_backend *be, float *dinp, const float *inp, const float *dout, size_t n), be,
        dinp, inp, dout, n)
GUARDED(tanh_fwd, (const rf_backend *be, float *out, const float *inp, size_t n), be, out, inp, n)
GUARDED(tanh_bwd,
        (const rf_backend *be, float *dinp, const float *out, const float *dout, size_t n), be,
        dinp, out, dout, n)
GUARDED(dropout_fwd,
        (const rf_backend *be, float *out, const float *inp, size_t n, float p, uint64_t seed), be,
        out, inp, n, p, seed)
GUARDED(dropout_bwd,
        (const rf_backend *be, float *dinp, const float *dout, size_t n, float p, uint64_t seed),
        be, dinp, dout, n, p, seed)
GUARDED(residual_fwd,
        (const rf_backend *be, float *out, const float *a, const float *b, size_t n, float p,
         uint64_t seed),
        be, out, a, b, n, p, seed)
GUARDED(residual_bwd,
        (const rf_backend *be, float *da, float *db, const float *dout, size_t n, float p,
         uint64_t seed),
        be, da, db, dout, n, p, seed)
GUARDED(xent_fwd,
        (const rf_backend *be, float *loss, float *probs, float *losses, const float *logits,
         const int32_t *labels, const float *weights, int B, int K),
        be, loss, probs, losses, logits, labels, weights, B, K)
GUARDED(xent_bwd,
        (const rf_backend *be, float *dlogits, const float *probs, const int32_t *labels,
         const float *weights, int B, int K, float scale),
        be, dlogits, probs, labels, weights, B, K, scale)
GUARDED(softmax_argmax,
        (const rf_backend *be, int32_t *pred, float *probs, const float *logits, int B, int K), be,
        pred, probs, logits, B, K)
GUARDED(tokpos_fwd,
        (const rf_backend *be, float *out, const int32_t *ids, const int32_t *pos, const float *wte,
         const float *wpe, int B, int T, int C),
        be, out, ids, pos, wte, wpe, B, T, C)
GUARDED(tokpos_bwd,
        (const rf_backend *be, float *dwte, float *dwpe, const float *dout, const int32_t *ids,
         const int32_t *pos, int B, int T, int C, int V, int P),
        be, dwte, dwpe, dout, ids, pos, B, T, C, V, P)
GUARDED(conv1d_fwd,
        (const rf_backend *be, float *out, const float *inp, const float *w, const float *b, int N,
         int IC, int OC),
        be, out, inp, w, b, N, IC, OC)
GUARDED(conv1d_bwd,
        (const rf_backend *be, float *dinp, float *dw, float *db, const float *dout,
         const float *inp, const float *w, int N, int IC, int OC),
        be, dinp, dw, db, dout, inp, w, N, IC, OC)
GUARDED(rmsnorm_fwd,
        (const rf_backend *be, float *out, float *rstd, const float *inp, const float *w, int N,
         int C, float eps),
        be, out, rstd, inp, w, N, C, eps)
GUARDED(rmsnorm_bwd,
        (const rf_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
         const float *w, const float *rstd, int N, int C),
        be, dinp, dw, dout, inp, w, rstd, N, C)
GUARDED(rope_fwd,
        (const rf_backend *be, float *out, const float *inp, const int32_t *pos, int N, int T,
         int nh, int hs, int stride, float theta),
        be, out, inp, pos, N, T, nh, hs, stride, theta)
GUARDED(rope_bwd,
        (const rf_backend *be, float *dinp, const float *dout, const int32_t *pos, int N, int T,
         int nh, int hs, int stride, float theta),
        be, dinp, dout, pos, N, T, nh, hs, stride, theta)
GUARDED(swiglu_fwd, (const rf_backend *be, float *out, const float *gu, int N, int F), be, out, gu,
        N, F)
GUARDED(swiglu_bwd,
        (const rf_backend *be, float *dgu, const float *dout, const float *gu, int N, int F), be,
        dgu, dout, gu, N, F)
GUARDED(gelu_tanh_fwd, (const rf_backend *be, float *out, const float *inp, size_t n), be, out, inp,
        n)
GUARDED(gelu_tanh_bwd,
        (const rf_backend *be, float *dinp, const float *inp, const float *dout, size_t n), be,
        dinp, inp, dout, n)
GUARDED(causal_attention_fwd,
        (const rf_backend *be, float *out, float *att, const float *qkv, const uint8_t *valid,
         const int32_t *seg, int B, int T, int NH, int NKV, int hs),
        be, out, att, qkv, valid, seg, B, T, NH, NKV, hs)
GUARDED(causal_attention_bwd,
        (const rf_backend *be, float *dqkv, float *scratch, const float *dout, const float *qkv,
         const float *att, int B, int T, int NH, int NKV, int hs),
        be, dqkv, scratch, dout, qkv, att, B, T, NH, NKV, hs)
GUARDED(lm_head_fwd,
        (const rf_backend *be, float *logits, const float *h, const float *wte, int N, int C,
         int V),
        be, logits, h, wte, N, C, V)
GUARDED(lm_head_bwd,
        (const rf_backend *be, float *dh, float *dwte, const float *dlogits, const float *h,
         const float *wte, int N, int C, int V),
        be, dh, dwte, dlogits, h, wte, N, C, V)
GUARDED(causal_xent_fwd,
        (const rf_backend *be, float *loss, int *counted, float *lse, float *losses,
         const float *logits, const int32_t *labels, int B, int T, int V),
        be, loss, counted, lse, losses, logits, labels, B, T, V)
GUARDED(causal_xent_bwd,
        (const rf_backend *be, float *dlogits, const float *logits, const float *lse,
         const int32_t *labels, int B, int T, int V, float scale),
        be, dlogits, logits, lse, labels, B, T, V, scale)
GUARDED(lora_fwd,
        (const rf_backend *be, float *out, int ldo, float *u, float *xd, const float *x,
         const float *A, const float *B, int N, int IC, int OC, int r, float scale, float p,
         uint64_t seed),
        be, out, ldo, u, xd, x, A, B, N, IC, OC, r, scale, p, seed)
GUARDED(lora_bwd,
        (const rf_backend *be, float *dx, float *dA, float *dB, float *du, float *xd,
         const float *dout, int ldo, const float *x, const float *u, const float *A, const float *B,
         int N, int IC, int OC, int r, float scale, float p, uint64_t seed),
        be, dx, dA, dB, du, xd, dout, ldo, x, u, A, B, N, IC, OC, r, scale, p, seed)
GUARDED(qlinear_fwd,
        (const rf_backend *be, float *out, int ldo, const float *inp, const struct rf_qweight *w,
         const float *b, int N),
        be, out, ldo, inp, w, b, N)
GUARDED(qlinear_bwd,
        (const rf_backend *be, float *dinp, const float *dout, int ldo, const struct rf_qweight *w,
         int N),
        be, dinp, dout, ldo, w, N)
GUARDED(sumsq, (const rf_backend *be, double *out, const float *x, size_t n), be, out, x, n)
GUARDED(scale, (const rf_backend *be, float *x, size_t n, float s), be, x, n, s)
GUARDED(adamw,
        (const rf_backend *be, float *params, const float *grads, float *mom1, float *mom2,
         size_t lo, size_t hi, const rf_param_span *spans, size_t nspans, const rf_adamw_hp *hp),
        be, params, grads, mom1, mom2, lo, hi, spans, nspans, hp)

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
    if (base->zero) guarded.zero = g_zero;
    if (base->to_host) guarded.to_host = g_to_host;
    if (base->to_device) guarded.to_device = g_to_device;
    if (base->copy) guarded.copy = g_copy;
    if (base->copy2d) guarded.copy2d = g_copy2d;
    if (base->embed_fwd) guarded.embed_fwd = g_embed_fwd;
    if (base->embed_bwd) guarded.embed_bwd = g_embed_bwd;
    if (base->layernorm_fwd) guarded.layernorm_fwd = g_layernorm_fwd;
    if (base->layernorm_bwd) guarded.layernorm_bwd = g_layernorm_bwd;
    if (base->linear_fwd) guarded.linear_fwd = g_linear_fwd;
    if (base->linear_bwd) guarded.linear_bwd = g_linear_bwd;
    if (base->attention_fwd) guarded.attention_fwd = g_attention_fwd;
    if (base->attention_bwd) guarded.attention_bwd = g_attention_bwd;
    if (base->gelu_fwd) guarded.gelu_fwd = g_gelu_fwd;
    if (base->gelu_bwd) guarded.gelu_bwd = g_gelu_bwd;
    if (base->tanh_fwd) guarded.tanh_fwd = g_tanh_fwd;
    if (base->tanh_bwd) guarded.tanh_bwd = g_tanh_bwd;
    if (base->dropout_fwd) guarded.dropout_fwd = g_dropout_fwd;
    if (base->dropout_bwd) guarded.dropout_bwd = g_dropout_bwd;
    if (base->residual_fwd) guarded.residual_fwd = g_residual_fwd;
    if (base->residual_bwd) guarded.residual_bwd = g_residual_bwd;
    if (base->xent_fwd) guarded.xent_fwd = g_xent_fwd;
    if (base->xent_bwd) guarded.xent_bwd = g_xent_bwd;
    if (base->linear_ld_fwd) guarded.linear_ld_fwd = g_linear_ld_fwd;
    if (base->linear_ld_bwd) guarded.linear_ld_bwd = g_linear_ld_bwd;
    if (base->embed_rows_fwd) guarded.embed_rows_fwd = g_embed_rows_fwd;
    if (base->embed_add_fwd) guarded.embed_add_fwd = g_embed_add_fwd;
    if (base->embed_rows_bwd) guarded.embed_rows_bwd = g_embed_rows_bwd;
    if (base->kv_attention_fwd) guarded.kv_attention_fwd = g_kv_attention_fwd;
    if (base->vxent_stats) guarded.vxent_stats = g_vxent_stats;
    if (base->vxent_sumexp) guarded.vxent_sumexp = g_vxent_sumexp;
    if (base->vxent_loss) guarded.vxent_loss = g_vxent_loss;
    if (base->vxent_bwd) guarded.vxent_bwd = g_vxent_bwd;
    if (base->softmax_argmax) guarded.softmax_argmax = g_softmax_argmax;
    if (base->tokpos_fwd) guarded.tokpos_fwd = g_tokpos_fwd;
    if (base->tokpos_bwd) guarded.tokpos_bwd = g_tokpos_bwd;
    if (base->conv1d_fwd) guarded.conv1d_fwd = g_conv1d_fwd;
    if (base->conv1d_bwd) guarded.conv1d_bwd = g_conv1d_bwd;
    if (base->rmsnorm_fwd) guarded.rmsnorm_fwd = g_rmsnorm_fwd;
    if (base->rmsnorm_bwd) guarded.rmsnorm_bwd = g_rmsnorm_bwd;
    if (base->rope_fwd) guarded.rope_fwd = g_rope_fwd;
    if (base->rope_bwd) guarded.rope_bwd = g_rope_bwd;
    if (base->swiglu_fwd) guarded.swiglu_fwd = g_swiglu_fwd;
    if (base->swiglu_bwd) guarded.swiglu_bwd = g_swiglu_bwd;
    if (base->gelu_tanh_fwd) guarded.gelu_tanh_fwd = g_gelu_tanh_fwd;
    if (base->gelu_tanh_bwd) guarded.gelu_tanh_bwd = g_gelu_tanh_bwd;
    if (base->causal_attention_fwd) guarded.causal_attention_fwd = g_causal_attention_fwd;
    if (base->causal_attention_bwd) guarded.causal_attention_bwd = g_causal_attention_bwd;
    if (base->lm_head_fwd) guarded.lm_head_fwd = g_lm_head_fwd;
    if (base->lm_head_bwd) guarded.lm_head_bwd = g_lm_head_bwd;
    if (base->causal_xent_fwd) guarded.causal_xent_fwd = g_causal_xent_fwd;
    if (base->causal_xent_bwd) guarded.causal_xent_bwd = g_causal_xent_bwd;
    if (base->lora_fwd) guarded.lora_fwd = g_lora_fwd;
    if (base->lora_bwd) guarded.lora_bwd = g_lora_bwd;
    if (base->qlinear_fwd) guarded.qlinear_fwd = g_qlinear_fwd;
    if (base->qlinear_bwd) guarded.qlinear_bwd = g_qlinear_bwd;
    if (base->sumsq) guarded.sumsq = g_sumsq;
    if (base->scale) guarded.scale = g_scale;
    if (base->adamw) guarded.adamw = g_adamw;
}

const rf_backend *rf_backend_cpu_guarded(void) {
    pthread_once(&once, init);
    return &guarded;
}
