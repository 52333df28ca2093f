/* LoRA adapters on GPT-2 and Llama projections; see lora.h. */
#include "trainer/lora.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "common/json.h"
#include "common/rng.h"
#include "common/sys.h"
#include "trainer/backend.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/ops.h"
#include "trainer/ops_causal.h"
#include "trainer/safetensors.h"

#define ROW_PIECES 8 /* as ops.c: pieces of a product along an output dimension */
#define W_PIECES   4
#define PIECE_MIN  128

static int pieces(int n, int want) {
    int p = n / PIECE_MIN;
    return p < 1 ? 1 : p < want ? p : want;
}

static inline int cut(int n, int i, int np) {
    return (int)((long)n * i / np);
}

/* ---- the op ---- */

/* Every sgemm below is issued from inside a parallel region, one piece per
 * task, so it runs single-threaded and each element comes from the same call
 * whatever the thread count (ops.c's scheme). */
void rf_op_lora_fwd(float *out, int ldo, float *u, float *xd, const float *x, const float *A,
                    const float *B, int N, int IC, int OC, int r, float scale, float p,
                    uint64_t seed) {
    const float *in = x;
    if (p > 0) {
        rf_op_dropout_fwd(xd, x, (size_t)N * IC, p, seed);
        in = xd;
    }
    int np = pieces(N, ROW_PIECES);
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < np; i++) {
        int r0 = cut(N, i, np), r1 = cut(N, i + 1, np);
        float *ui = u + (size_t)r0 * r;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r, IC, 1.0f,
                    in + (size_t)r0 * IC, IC, A, IC, 0.0f, ui, r);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, OC, r, scale, ui, r, B, r,
                    1.0f, out + (size_t)r0 * ldo, ldo);
    }
}

void rf_op_lora_bwd(float *dx, float *dA, float *dB, float *du, float *xd, const float *dout,
                    int ldo, const float *x, const float *u, const float *A, const float *B, int N,
                    int IC, int OC, int r, float scale, float p, uint64_t seed) {
    int np = pieces(N, ROW_PIECES), bp = pieces(OC, W_PIECES), ap = pieces(IC, W_PIECES);
    /* du = s dout B (row pieces) and dB += s dout^T u (pieces of B's rows) */
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < np + bp; t++) {
        if (t < np) {
            int r0 = cut(N, t, np), r1 = cut(N, t + 1, np);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, r, OC, scale,
                        dout + (size_t)r0 * ldo, ldo, B, r, 0.0f, du + (size_t)r0 * r, r);
        } else {
            int j0 = cut(OC, t - np, bp), j1 = cut(OC, t - np + 1, bp);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, r, N, scale, dout + j0,
                        ldo, u, r, 1.0f, dB + (size_t)j0 * r, r);
        }
    }
    const float *in = x;
    if (p > 0) {
        rf_op_dropout_fwd(xd, x, (size_t)N * IC, p, seed); /* the forward's drop(x) again */
        in = xd;
    }
    /* dA += du^T drop(x) (pieces of A's columns); without dropout also dx += du A */
    int nx = dx && p <= 0 ? np : 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < ap + nx; t++) {
        if (t < ap) {
            int k0 = cut(IC, t, ap), k1 = cut(IC, t + 1, ap);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, k1 - k0, N, 1.0f, du, r,
                        in + k0, IC, 1.0f, dA + k0, IC);
        } else {
            int r0 = cut(N, t - ap, np), r1 = cut(N, t - ap + 1, np);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, IC, r, 1.0f,
                        du + (size_t)r0 * r, r, A, IC, 1.0f, dx + (size_t)r0 * IC, IC);
        }
    }
    if (!dx || p <= 0) return;
        /* with dropout: xd = du A, then dx += mask * xd / (1 - p) */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < np; i++) {
        int r0 = cut(N, i, np), r1 = cut(N, i + 1, np);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, IC, r, 1.0f,
                    du + (size_t)r0 * r, r, A, IC, 0.0f, xd + (size_t)r0 * IC, IC);
    }
    rf_op_dropout_bwd(dx, xd, (size_t)N * IC, p, seed);
}

/* ---- memory on the adapter set's backend ---- */

static bool on_cpu(const rf_lora *lo) {
    return lo->be == rf_backend_cpu();
}

static float *lalloc(const rf_lora *lo, size_t nfloats) {
    return rf_backend_alloc(lo->be, nfloats * sizeof(float));
}

static void lfree(const rf_lora *lo, void *p) {
    rf_backend_free(lo->be, p);
}

/* The sizes of a quantized weight's three arrays (quant.c's allocations). */
static void qsizes(const rf_qweight *q, size_t *nq, size_t *nscale, size_t *nabs) {
    size_t n = (size_t)q->rows * q->cols;
    *nq = *nscale = *nabs = 0;
    if (q->type == RF_QT_INT8)
        *nq = n, *nscale = (size_t)q->rows * sizeof(float);
    else if (q->type == RF_QT_NF4)
        *nq = (n + 1) / 2, *nscale = q->ngroups * sizeof(float), *nabs = q->nblocks;
    else if (q->type == RF_QT_Q4_1)
        *nq = n / RF_Q4_1_BLOCK * RF_Q4_1_BYTES;
}

static int upload_bytes(const rf_backend *be, void **dst, const void *src, size_t n) {
    *dst = NULL;
    if (!src || !n) return RF_OK;
    int rc = be->alloc(be, dst, n);
    if (!rc) rc = be->to_device(be, *dst, src, n);
    return rc;
}

/* Moves part p's quantized arrays into the backend's memory (all or none). */
static int upload_part(const rf_lora *lo, rf_lora_part *p) {
    const rf_backend *be = lo->be;
    size_t nq, ns, na;
    qsizes(&p->q, &nq, &ns, &na);
    void *dq = NULL, *ds = NULL, *da = NULL;
    int rc = upload_bytes(be, &dq, p->q.q, nq);
    if (!rc) rc = upload_bytes(be, &ds, p->q.scale, ns);
    if (!rc) rc = upload_bytes(be, &da, p->q.qabsmax, na);
    if (rc) {
        lfree(lo, dq), lfree(lo, ds), lfree(lo, da);
        return rf_fail_ctx(rc, "lora: moving the base of %s to %s", p->module, be->name);
    }
    free(p->q.q), free(p->q.scale), free(p->q.qabsmax);
    p->q.q = dq, p->q.scale = ds, p->q.qabsmax = da;
    p->qdev = true;
    return RF_OK;
}

/* ---- options ---- */

rf_lora_config rf_lora_defaults(void) {
    return (rf_lora_config){
        .rank = 8, .alpha = 16, .dropout = 0, .targets = RF_LORA_Q | RF_LORA_V, .base = RF_QT_F32};
}

static const struct {
    const char *name;
    unsigned bit;
} target_names[] = {{"q", RF_LORA_Q},      {"k", RF_LORA_K},   {"v", RF_LORA_V},
                    {"o", RF_LORA_O},      {"up", RF_LORA_UP}, {"down", RF_LORA_DOWN},
                    {"gate", RF_LORA_GATE}};

unsigned rf_lora_target_bit(const char *name) {
    for (size_t i = 0; i < sizeof target_names / sizeof *target_names; i++)
        if (strcmp(name, target_names[i].name) == 0) return target_names[i].bit;
    return 0;
}

static const char *base_names[] = {"fp32", "int8", "nf4", "q4_1"};
static const char *const base_names_z[] = {"fp32", "int8", "nf4", "q4_1", NULL};

int rf_lora_base_parse(const char *name) {
    for (int i = 0; i < 4; i++)
        if (strcmp(name, base_names[i]) == 0) return i;
    return -1;
}

const char *rf_lora_base_name(rf_qtype t) {
    return (unsigned)t < 4 ? base_names[t] : "?";
}

int rf_lora_config_parse(const rf_cfg *n, rf_lora_config *out) {
    static const char *const keys[] = {"rank", "alpha", "dropout", "targets", "base", NULL};
    *out = rf_lora_defaults();
    int64_t rank;
    double alpha, dropout;
    int base, rc;
    if ((rc = rf_cfg_check_keys(n, keys)) || (rc = rf_cfg_int(n, "rank", 8, 1, 4096, &rank)) ||
        (rc = rf_cfg_real(n, "alpha", 2.0 * rank, 1e-6, 1e6, &alpha)) ||
        (rc = rf_cfg_real(n, "dropout", 0, 0, 0.999, &dropout)) ||
        (rc = rf_cfg_enum(n, "base", base_names_z, RF_QT_F32, &base)))
        return rc;
    out->rank = (int)rank, out->alpha = (float)alpha, out->dropout = (float)dropout;
    out->base = (rf_qtype)base;
    const rf_cfg *t = rf_cfg_get(n, "targets");
    if (!t) return RF_OK;
    const char **list;
    size_t count;
    if ((rc = rf_cfg_strlist(n, "targets", &list, &count))) return rc;
    out->targets = 0;
    for (size_t i = 0; i < count && !rc; i++) {
        unsigned b = rf_lora_target_bit(list[i]);
        if (!b)
            rc = rf_fail(RF_ERR_INVALID,
                         "%s:%d: %s: unknown target '%s' (expected q, k, v, o, up, down, gate)",
                         rf_cfg_source(t), rf_cfg_line(t), rf_cfg_path(t), list[i]);
        out->targets |= b;
    }
    free(list);
    if (!rc && !count)
        rc = rf_fail(RF_ERR_INVALID, "%s:%d: %s: at least one target module", rf_cfg_source(t),
                     rf_cfg_line(t), rf_cfg_path(t));
    return rc;
}

static int check_config(const rf_lora_config *c) {
    if (c->rank < 1 || c->rank > 4096)
        return rf_fail(RF_ERR_INVALID, "lora: rank %d is not in [1, 4096]", c->rank);
    if (!(c->alpha > 0) || !isfinite(c->alpha))
        return rf_fail(RF_ERR_INVALID, "lora: alpha %g must be positive", c->alpha);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return rf_fail(RF_ERR_INVALID, "lora: dropout %g is not in [0, 1)", c->dropout);
    if (!c->targets || c->targets >= RF_LORA_GATE << 1)
        return rf_fail(RF_ERR_INVALID,
                       "lora: no valid target modules (q, k, v, o, up, down, gate)");
    if ((unsigned)c->base > RF_QT_Q4_1)
        return rf_fail(RF_ERR_INVALID, "lora: unknown base format %d", (int)c->base);
    return RF_OK;
}

/* ---- building the adapter set ---- */

static void add_part(rf_lora_proj *pj, unsigned bit, int off, int len, const char *fmt, int l) {
    rf_lora_part *p = &pj->part[pj->nparts++];
    snprintf(p->module, sizeof p->module, fmt, l);
    p->bit = bit, p->off = off, p->len = len, p->a = p->b = -1;
}

static void add_tensor(rf_lora *lo, const char *module, const char *ab, int d0, int d1) {
    rf_tensor_info *t = &lo->tensors[lo->ntensors++];
    snprintf(t->name, sizeof t->name, "%s.lora_%s.weight", module, ab);
    t->offset = lo->nparams, t->ndim = 2, t->shape[0] = d0, t->shape[1] = d1;
    t->numel = (size_t)d0 * d1, t->decay = true;
    lo->nparams += t->numel;
}

/* Lays out the adapters of the parts whose module is targeted, allocates the
 * block and initialises it (A uniform, B zero). */
static int finish(rf_lora *lo, uint64_t seed) {
    size_t nparts = 0;
    int r = lo->cfg.rank;
    for (int i = 0; i < lo->nlayers * RF_NPROJ; i++)
        nparts += (size_t)lo->proj[i].nparts;
    if (!(lo->tensors = calloc(2 * nparts, sizeof *lo->tensors))) return RF_ERR_NOMEM;
    size_t k = 0;
    for (int i = 0; i < lo->nlayers * RF_NPROJ; i++) {
        rf_lora_proj *pj = &lo->proj[i];
        for (int j = 0; j < pj->nparts; j++) {
            rf_lora_part *p = &pj->part[j];
            if (!(lo->cfg.targets & p->bit)) continue;
            p->a = (long)lo->ntensors;
            add_tensor(lo, p->module, "A", r, pj->in);
            p->b = (long)lo->ntensors;
            add_tensor(lo, p->module, "B", p->len, r);
            p->uoff = k++ * (size_t)r;
            if ((size_t)pj->in > lo->maxin) lo->maxin = (size_t)pj->in;
        }
    }
    lo->nu = k * (size_t)r;
    if (!lo->ntensors)
        return rf_fail(RF_ERR_INVALID, "lora: the targets select no module of this model");
    float *host = calloc(lo->nparams, sizeof(float)); /* initialised here, then to_device */
    if (!host || !(lo->params = lalloc(lo, lo->nparams))) {
        free(host);
        return rf_fail(RF_ERR_NOMEM, "lora: no memory for %zu adapter parameters", lo->nparams);
    }
    lo->npadded = lo->nmoments = lo->nparams;
    rf_rng rng;
    rf_rng_seed(&rng, seed);
    for (size_t t = 0; t < lo->ntensors; t += 2) {
        const rf_tensor_info *a = &lo->tensors[t];
        float bound = (float)(1.0 / sqrt((double)a->shape[1]));
        for (size_t i = 0; i < a->numel; i++)
            host[a->offset + i] = (float)((rf_rng_double(&rng) * 2 - 1) * bound);
    }
    int rc = lo->be->to_device(lo->be, lo->params, host, lo->nparams * sizeof(float));
    free(host);
    return rc;
}

static int alloc_set(const rf_lora_config *cfg, rf_lora_arch arch, int L, const rf_backend *be,
                     rf_lora **out) {
    *out = NULL;
    int rc = check_config(cfg);
    if (rc) return rc;
    rf_lora *lo = calloc(1, sizeof *lo);
    if (!lo || !(lo->proj = calloc((size_t)L * RF_NPROJ, sizeof *lo->proj))) {
        free(lo);
        return RF_ERR_NOMEM;
    }
    lo->cfg = *cfg, lo->arch = arch, lo->nlayers = L;
    lo->be = be ? be : rf_backend_cpu();
    lo->scale = cfg->alpha / (float)cfg->rank;
    *out = lo;
    return RF_OK;
}

int rf_lora_new_gpt2(const rf_gpt2 *m, const rf_lora_config *cfg, uint64_t init_seed,
                     rf_lora **out) {
    const rf_gpt2_config *c = &m->cfg;
    unsigned qkv = RF_LORA_Q | RF_LORA_K | RF_LORA_V;
    if (cfg->targets & RF_LORA_GATE)
        return rf_fail(RF_ERR_UNSUPPORTED, "lora: GPT-2 has no gate projection to target");
    if ((cfg->targets & qkv) && (cfg->targets & qkv) != qkv)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "lora: GPT-2's q, k and v are one module (attn.c_attn): target all three "
                       "or none");
    if (cfg->base == RF_QT_Q4_1)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "lora: a q4_1 base comes from a GGUF file (Llama); GPT-2 is loaded from "
                       "safetensors");
    rf_lora *lo;
    int rc = alloc_set(cfg, RF_LORA_GPT2, c->n_layer, m->be, &lo);
    if (rc) return rc;
    int C = c->n_embd, F = c->n_inner;
    for (int l = 0; l < c->n_layer; l++) {
        rf_lora_proj *pj = &lo->proj[l * RF_NPROJ];
        pj[RF_PROJ_QKV].in = C, pj[RF_PROJ_QKV].out = 3 * C;
        add_part(&pj[RF_PROJ_QKV], qkv, 0, 3 * C, "transformer.h.%d.attn.c_attn", l);
        pj[RF_PROJ_O].in = C, pj[RF_PROJ_O].out = C;
        add_part(&pj[RF_PROJ_O], RF_LORA_O, 0, C, "transformer.h.%d.attn.c_proj", l);
        pj[RF_PROJ_UP].in = C, pj[RF_PROJ_UP].out = F;
        add_part(&pj[RF_PROJ_UP], RF_LORA_UP, 0, F, "transformer.h.%d.mlp.c_fc", l);
        pj[RF_PROJ_DOWN].in = F, pj[RF_PROJ_DOWN].out = C;
        add_part(&pj[RF_PROJ_DOWN], RF_LORA_DOWN, 0, C, "transformer.h.%d.mlp.c_proj", l);
    }
    if ((rc = finish(lo, init_seed))) {
        rf_lora_free(lo);
        return rc;
    }
    *out = lo;
    return RF_OK;
}

int rf_lora_new_llama(const rf_llama *m, const rf_lora_config *cfg, uint64_t init_seed,
                      rf_lora **out) {
    const rf_llama_config *c = &m->cfg;
    rf_lora *lo;
    int rc = alloc_set(cfg, RF_LORA_LLAMA, c->num_hidden_layers, m->be, &lo);
    if (rc) return rc;
    int C = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
    int A = c->num_attention_heads * hd, KV = c->num_key_value_heads * hd;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        rf_lora_proj *pj = &lo->proj[l * RF_NPROJ];
        pj[RF_PROJ_QKV].in = C, pj[RF_PROJ_QKV].out = A + 2 * KV;
        add_part(&pj[RF_PROJ_QKV], RF_LORA_Q, 0, A, "model.layers.%d.self_attn.q_proj", l);
        add_part(&pj[RF_PROJ_QKV], RF_LORA_K, A, KV, "model.layers.%d.self_attn.k_proj", l);
        add_part(&pj[RF_PROJ_QKV], RF_LORA_V, A + KV, KV, "model.layers.%d.self_attn.v_proj", l);
        pj[RF_PROJ_O].in = A, pj[RF_PROJ_O].out = C;
        add_part(&pj[RF_PROJ_O], RF_LORA_O, 0, C, "model.layers.%d.self_attn.o_proj", l);
        pj[RF_PROJ_UP].in = C, pj[RF_PROJ_UP].out = 2 * F;
        add_part(&pj[RF_PROJ_UP], RF_LORA_GATE, 0, F, "model.layers.%d.mlp.gate_proj", l);
        add_part(&pj[RF_PROJ_UP], RF_LORA_UP, F, F, "model.layers.%d.mlp.up_proj", l);
        pj[RF_PROJ_DOWN].in = F, pj[RF_PROJ_DOWN].out = C;
        add_part(&pj[RF_PROJ_DOWN], RF_LORA_DOWN, 0, C, "model.layers.%d.mlp.down_proj", l);
    }
    if ((rc = finish(lo, init_seed))) {
        rf_lora_free(lo);
        return rc;
    }
    *out = lo;
    return RF_OK;
}

void rf_lora_free(rf_lora *lo) {
    if (!lo) return;
    for (int i = 0; lo->proj && i < lo->nlayers * RF_NPROJ; i++)
        for (int j = 0; j < lo->proj[i].nparts; j++) {
            rf_lora_part *p = &lo->proj[i].part[j];
            if (p->qdev) {
                lfree(lo, p->q.q), lfree(lo, p->q.scale), lfree(lo, p->q.qabsmax);
                memset(&p->q, 0, sizeof p->q);
            } else {
                rf_qweight_free(&p->q);
            }
        }
    free(lo->proj), free(lo->tensors);
    lfree(lo, lo->params), lfree(lo, lo->grads), lfree(lo, lo->m), lfree(lo, lo->v);
    lfree(lo, lo->ss), lfree(lo, lo->u), lfree(lo, lo->du), lfree(lo, lo->xd);
    free(lo);
}

const rf_tensor_info *rf_lora_find(const rf_lora *lo, const char *name) {
    for (size_t i = 0; i < lo->ntensors; i++)
        if (strcmp(lo->tensors[i].name, name) == 0) return &lo->tensors[i];
    return NULL;
}

/* ---- attaching: the quantized base ---- */

/* Gives the pages wholly inside x[0..n) back to the system (they read as zero
 * afterwards) and zeroes the partial pages at both ends: the model's fp32
 * copy of a weight that now lives quantized. */
static void release(float *x, size_t n) {
    uintptr_t a = (uintptr_t)x, e = a + n * sizeof(float);
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a1 = (a + pg - 1) / pg * pg, e1 = e / pg * pg;
    if (e1 <= a1) {
        memset(x, 0, n * sizeof(float));
        return;
    }
    memset(x, 0, a1 - a);
    memset((void *)e1, 0, e - e1);
    if (madvise((void *)a1, e1 - a1, MADV_DONTNEED) != 0) memset((void *)a1, 0, e1 - a1);
}

/* Quantizes part p of a projection whose fp32 weight (nn.Linear layout, or
 * Conv1D [in, out] when conv) starts at w. */
static int quantize_part(rf_lora *lo, const rf_lora_proj *pj, rf_lora_part *p, const float *w,
                         bool conv) {
    int rc = conv ? rf_qweight_quantize_t(&p->q, lo->cfg.base, w, pj->out, pj->in)
                  : rf_qweight_quantize(&p->q, lo->cfg.base, w + (size_t)p->off * pj->in, p->len,
                                        pj->in);
    if (rc) return rf_fail_ctx(rc, "lora: quantizing %s", p->module);
    lo->qbytes += rf_qweight_bytes(&p->q);
    return RF_OK;
}

int rf_lora_set_base(rf_lora *lo, int layer, int slot, int part, rf_qweight *q) {
    if (layer < 0 || layer >= lo->nlayers || slot < 0 || slot >= RF_NPROJ)
        return rf_fail(RF_ERR_RANGE, "lora: no projection %d in layer %d", slot, layer);
    rf_lora_proj *pj = &lo->proj[layer * RF_NPROJ + slot];
    if (part < 0 || part >= pj->nparts)
        return rf_fail(RF_ERR_RANGE, "lora: no part %d of projection %d", part, slot);
    rf_lora_part *p = &pj->part[part];
    if (p->qdev)
        return rf_fail(RF_ERR_INVALID, "lora: %s: the set is attached; set bases before",
                       p->module);
    if (q->type != lo->cfg.base || q->type == RF_QT_F32 || q->rows != p->len || q->cols != pj->in)
        return rf_fail(RF_ERR_INVALID,
                       "lora: base weight of %s: %s [%d, %d], the adapter set needs %s [%d, %d]",
                       p->module, rf_lora_base_name(q->type), q->rows, q->cols,
                       rf_lora_base_name(lo->cfg.base), p->len, pj->in);
    lo->qbytes -= rf_qweight_bytes(&p->q);
    rf_qweight_free(&p->q);
    p->q = *q;
    memset(q, 0, sizeof *q);
    lo->qbytes += rf_qweight_bytes(&p->q);
    return RF_OK;
}

/* Quantizes the parts of every projection not set yet from the model's fp32
 * weights w[layer * RF_NPROJ + slot] (Conv1D layout when conv), then
 * releases those fp32 weights. */
static int quantize_base(rf_lora *lo, float **w, bool conv) {
    if (lo->cfg.base == RF_QT_F32) return RF_OK;
    const rf_backend *be = lo->be;
    bool dev = !on_cpu(lo);
    float *host = NULL; /* a device weight's host copy */
    size_t cap = 0;
    int rc = RF_OK;
    for (int i = 0; !rc && i < lo->nlayers * RF_NPROJ; i++) {
        rf_lora_proj *pj = &lo->proj[i];
        size_t nw = (size_t)pj->in * pj->out;
        const float *src = w[i];
        bool todo = false;
        for (int j = 0; j < pj->nparts; j++)
            todo |= pj->part[j].q.type == RF_QT_F32; /* the others were set by rf_lora_set_base */
        if (!todo) continue;
        if (dev && nw > cap) {
            free(host);
            if (!(host = malloc(nw * sizeof(float)))) rc = RF_ERR_NOMEM;
            cap = rc ? 0 : nw;
        }
        if (!rc && dev) rc = be->to_host(be, host, w[i], nw * sizeof(float));
        if (dev) src = host;
        for (int j = 0; !rc && j < pj->nparts; j++)
            if (pj->part[j].q.type == RF_QT_F32)
                rc = quantize_part(lo, pj, &pj->part[j], src, conv);
    }
    free(host);
    if (rc) return rc;
    /* the model's fp32 copies: pages given back on the host, zeroed on a device */
    for (int i = 0; i < lo->nlayers * RF_NPROJ && !rc; i++) {
        size_t nw = (size_t)lo->proj[i].in * lo->proj[i].out;
        if (dev)
            rc = be->zero(be, w[i], nw * sizeof(float));
        else
            release(w[i], nw);
    }
    for (int i = 0; dev && i < lo->nlayers * RF_NPROJ && !rc; i++)
        for (int j = 0; j < lo->proj[i].nparts && !rc; j++)
            rc = upload_part(lo, &lo->proj[i].part[j]);
    return rc;
}

/* The backend must have the slots the adapter set runs on. */
static int check_slots(const rf_lora *lo, const char *arch) {
    const rf_backend *be = lo->be;
    const char *missing = !be->lora_fwd                                   ? "lora_fwd"
                          : !be->lora_bwd                                 ? "lora_bwd"
                          : lo->cfg.base != RF_QT_F32 && !be->qlinear_fwd ? "qlinear_fwd"
                          : lo->cfg.base != RF_QT_F32 && !be->qlinear_bwd ? "qlinear_bwd"
                                                                          : NULL;
    if (missing)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "%s: LoRA on backend %s: it has no '%s' kernel (use trainer.device: cpu)",
                       arch, be->name, missing);
    return RF_OK;
}

int rf_lora_attach_gpt2(rf_lora *lo, rf_gpt2 *m) {
    if (lo->arch != RF_LORA_GPT2 || lo->nlayers != m->cfg.n_layer || lo->be != m->be)
        return rf_fail(RF_ERR_INVALID, "lora: the adapter set was not made for this GPT-2");
    int rc = check_slots(lo, "gpt2");
    if (rc) return rc;
    float **w = malloc(sizeof(float *) * lo->nlayers * RF_NPROJ);
    if (!w) return RF_ERR_NOMEM;
    for (int l = 0; l < lo->nlayers; l++) {
        rf_gpt2_layer *y = &m->p.layers[l];
        float **v = w + l * RF_NPROJ;
        v[RF_PROJ_QKV] = y->attn_w, v[RF_PROJ_O] = y->proj_w;
        v[RF_PROJ_UP] = y->fc_w, v[RF_PROJ_DOWN] = y->fcp_w;
    }
    rc = quantize_base(lo, w, true);
    free(w);
    if (!rc) m->lora = lo;
    return rc;
}

int rf_lora_attach_llama(rf_lora *lo, rf_llama *m, bool allow_requant) {
    if (lo->arch != RF_LORA_LLAMA || lo->nlayers != m->cfg.num_hidden_layers || lo->be != m->be)
        return rf_fail(RF_ERR_INVALID, "lora: the adapter set was not made for this Llama");
    int rc = check_slots(lo, "llama");
    if (rc) return rc;
    for (int i = 0; lo->cfg.base == RF_QT_Q4_1 && !allow_requant && i < lo->nlayers * RF_NPROJ; i++)
        for (int j = 0; j < lo->proj[i].nparts; j++)
            if (lo->proj[i].part[j].q.type != RF_QT_Q4_1)
                return rf_fail(RF_ERR_UNSUPPORTED,
                               "lora: a q4_1 base is the GGUF file's blocks as loaded "
                               "(rf_lora_set_base), not requantized fp32 weights (%s)",
                               lo->proj[i].part[j].module);
    float **w = malloc(sizeof(float *) * lo->nlayers * RF_NPROJ);
    if (!w) return RF_ERR_NOMEM;
    for (int l = 0; l < lo->nlayers; l++) {
        rf_llama_layer *y = &m->p.layers[l];
        float **v = w + l * RF_NPROJ;
        v[RF_PROJ_QKV] = y->qkv_w, v[RF_PROJ_O] = y->o_w;
        v[RF_PROJ_UP] = y->gu_w, v[RF_PROJ_DOWN] = y->down_w;
    }
    rc = quantize_base(lo, w, false);
    free(w);
    if (!rc) m->lora = lo;
    return rc;
}

/* ---- training state ---- */

int rf_lora_enable_training(rf_lora *lo) {
    return rf_lora_enable_training_sharded(lo, lo->nparams, lo->nparams);
}

int rf_lora_enable_training_sharded(rf_lora *lo, size_t padded, size_t moments) {
    if (lo->grads) return RF_OK;
    if (padded < lo->nparams) padded = lo->nparams;
    if (padded > lo->npadded) { /* room for the collectives' padding: params move */
        float *p = lalloc(lo, padded);
        if (!p) return RF_ERR_NOMEM;
        int rc = lo->be->copy(lo->be, p, lo->params, lo->nparams * sizeof(float));
        if (rc) {
            lfree(lo, p);
            return rc;
        }
        lfree(lo, lo->params);
        lo->params = p;
        lo->npadded = padded;
    }
    lo->grads = lalloc(lo, padded);
    lo->m = lalloc(lo, moments ? moments : 1);
    lo->v = lalloc(lo, moments ? moments : 1);
    lo->ss = rf_backend_alloc(lo->be, sizeof *lo->ss);
    if (!lo->grads || !lo->m || !lo->v || !lo->ss) {
        lfree(lo, lo->grads), lfree(lo, lo->m), lfree(lo, lo->v), lfree(lo, lo->ss);
        lo->grads = lo->m = lo->v = NULL;
        lo->ss = NULL;
        return RF_ERR_NOMEM;
    }
    lo->nmoments = moments;
    return RF_OK;
}

int rf_lora_zero_grad(rf_lora *lo) {
    return lo->grads ? lo->be->zero(lo->be, lo->grads, lo->npadded * sizeof(float)) : RF_OK;
}

int rf_lora_reserve(rf_lora *lo, int N) {
    lo->last_train = lo->train, lo->last_seed = lo->seed;
    if (N <= lo->capN) return RF_OK;
    size_t n = (size_t)N;
    float *u = lalloc(lo, lo->nu * n + 1), *du = lalloc(lo, (size_t)lo->cfg.rank * n + 1),
          *xd = lo->cfg.dropout > 0 ? lalloc(lo, lo->maxin * n + 1) : NULL;
    if (!u || !du || (lo->cfg.dropout > 0 && !xd)) {
        lfree(lo, u), lfree(lo, du), lfree(lo, xd);
        return RF_ERR_NOMEM;
    }
    lfree(lo, lo->u), lfree(lo, lo->du), lfree(lo, lo->xd);
    lo->u = u, lo->du = du, lo->xd = xd, lo->capN = N;
    return RF_OK;
}

/* splitmix64 finaliser: the dropout seed of one adapter in one forward. */
static uint64_t site_seed(uint64_t seed, uint64_t site) {
    uint64_t x = seed + (site + 1) * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int check_call(const rf_lora *lo, int layer, int slot, int N, int IC, int OC) {
    if (layer < 0 || layer >= lo->nlayers || slot < 0 || slot >= RF_NPROJ || N > lo->capN ||
        lo->proj[layer * RF_NPROJ + slot].in != IC || lo->proj[layer * RF_NPROJ + slot].out != OC)
        return rf_fail(RF_ERR_INTERNAL, "lora: projection %d of layer %d called as [%d, %d -> %d]",
                       slot, layer, N, IC, OC);
    return RF_OK;
}

int rf_lora_fwd(rf_lora *lo, int layer, int slot, float *out, const float *inp, const float *w,
                const float *b, int N, int IC, int OC) {
    int rc = check_call(lo, layer, slot, N, IC, OC);
    if (rc) return rc;
    const rf_backend *be = lo->be;
    rf_lora_proj *pj = &lo->proj[layer * RF_NPROJ + slot];
    if (pj->part[0].q.type == RF_QT_F32) {
        rc = lo->arch == RF_LORA_GPT2 ? be->conv1d_fwd(be, out, inp, w, b, N, IC, OC)
                                      : be->linear_fwd(be, out, inp, w, b, N, IC, OC);
    } else {
        for (int j = 0; !rc && j < pj->nparts; j++) {
            const rf_lora_part *p = &pj->part[j];
            rc = be->qlinear_fwd(be, out + p->off, OC, inp, &p->q, b ? b + p->off : NULL, N);
        }
    }
    float pd = lo->last_train ? lo->cfg.dropout : 0.0f;
    for (int j = 0; !rc && j < pj->nparts; j++) {
        const rf_lora_part *p = &pj->part[j];
        if (p->a < 0) continue;
        rc = be->lora_fwd(be, out + p->off, OC, lo->u + p->uoff * N, lo->xd, inp,
                          lo->params + lo->tensors[p->a].offset,
                          lo->params + lo->tensors[p->b].offset, N, IC, p->len, lo->cfg.rank,
                          lo->scale, pd,
                          site_seed(lo->last_seed, (uint64_t)(layer * RF_NPROJ + slot) * 4 + j));
    }
    return rc;
}

int rf_lora_bwd(rf_lora *lo, int layer, int slot, float *dinp, float *dw, float *db,
                const float *dout, const float *inp, const float *w, int N, int IC, int OC) {
    int rc = check_call(lo, layer, slot, N, IC, OC);
    if (rc) return rc;
    if (!lo->grads) return rf_fail(RF_ERR_INVALID, "lora: training is not enabled");
    const rf_backend *be = lo->be;
    rf_lora_proj *pj = &lo->proj[layer * RF_NPROJ + slot];
    if (pj->part[0].q.type == RF_QT_F32) {
        rc = lo->arch == RF_LORA_GPT2 ? be->conv1d_bwd(be, dinp, dw, db, dout, inp, w, N, IC, OC)
                                      : be->linear_bwd(be, dinp, dw, db, dout, inp, w, N, IC, OC);
    } else {
        for (int j = 0; !rc && dinp && j < pj->nparts; j++) {
            const rf_lora_part *p = &pj->part[j];
            rc = be->qlinear_bwd(be, dinp, dout + p->off, OC, &p->q, N);
        }
    }
    float pd = lo->last_train ? lo->cfg.dropout : 0.0f;
    for (int j = 0; !rc && j < pj->nparts; j++) {
        const rf_lora_part *p = &pj->part[j];
        if (p->a < 0) continue;
        const rf_tensor_info *ta = &lo->tensors[p->a], *tb = &lo->tensors[p->b];
        rc = be->lora_bwd(be, dinp, lo->grads + ta->offset, lo->grads + tb->offset, lo->du, lo->xd,
                          dout + p->off, OC, inp, lo->u + p->uoff * N, lo->params + ta->offset,
                          lo->params + tb->offset, N, IC, p->len, lo->cfg.rank, lo->scale, pd,
                          site_seed(lo->last_seed, (uint64_t)(layer * RF_NPROJ + slot) * 4 + j));
    }
    return rc;
}

/* ---- optimizer ---- */

float rf_lora_adamw_step(rf_lora *lo, const rf_adamw *o, long step) {
    if (!lo->grads || lo->nmoments < lo->nparams) {
        rf_fail(RF_ERR_INVALID, "lora: training is not enabled with whole moments");
        return NAN;
    }
    /* the norm stays in backend memory for AdamW's clipping (rf_adamw_hp.sumsq),
     * and comes back once the update is queued */
    const rf_backend *be = lo->be;
    rf_param_span all = {0, lo->nparams, false};
    if (be->sumsq_into(be, lo->ss, lo->grads, &all, 1)) return NAN;
    rf_param_span *spans = malloc(lo->ntensors * sizeof *spans);
    if (!spans) return NAN;
    for (size_t i = 0; i < lo->ntensors; i++)
        spans[i] =
            (rf_param_span){lo->tensors[i].offset, lo->tensors[i].numel, lo->tensors[i].decay};
    rf_adamw_hp hp = {.lr = rf_adamw_lr(o, step),
                      .beta1 = o->beta1,
                      .beta2 = o->beta2,
                      .eps = o->eps,
                      .weight_decay = o->weight_decay,
                      .step = step,
                      .sumsq = o->clip_norm > 0 ? lo->ss : NULL,
                      .clip_norm = o->clip_norm};
    int rc = be->adamw(be, lo->params, lo->grads, lo->m, lo->v, 0, lo->nparams, spans, lo->ntensors,
                       &hp);
    free(spans);
    double ss;
    if (!rc) rc = be->to_host(be, &ss, lo->ss, sizeof ss);
    return rc ? NAN : (float)sqrt(ss);
}

/* ---- PEFT adapter files ---- */

#define PEFT_PREFIX "base_model.model."

/* peft's target_modules entries for the targeted modules (unambiguous
 * suffixes: GPT-2's attn.c_proj and mlp.c_proj are both "c_proj"). */
static int target_modules(const rf_lora *lo, const char **names, int max) {
    static const struct {
        unsigned bit;
        const char *gpt2, *llama;
    } mods[] = {
        {RF_LORA_Q, "attn.c_attn", "q_proj"}, {RF_LORA_K, NULL, "k_proj"},
        {RF_LORA_V, NULL, "v_proj"},          {RF_LORA_O, "attn.c_proj", "o_proj"},
        {RF_LORA_UP, "mlp.c_fc", "up_proj"},  {RF_LORA_DOWN, "mlp.c_proj", "down_proj"},
        {RF_LORA_GATE, NULL, "gate_proj"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof mods / sizeof *mods && n < max; i++) {
        const char *s = lo->arch == RF_LORA_GPT2 ? mods[i].gpt2 : mods[i].llama;
        if (s && (lo->cfg.targets & mods[i].bit)) names[n++] = s;
    }
    return n;
}

int rf_lora_save_peft(const rf_lora *lo, const char *dir, const char *base_name) {
    int rc = rf_mkdir_p(dir);
    if (rc) return rf_fail_ctx(rc, "lora: creating %s", dir);
    const char *mods[8];
    int nm = target_modules(lo, mods, 8);
    rf_buf b = {0};
    rc = rf_buf_puts(&b, "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n"
                         "  \"base_model_name_or_path\": ");
    if (!rc)
        rc = base_name ? rf_buf_append_json_str(&b, base_name, strlen(base_name))
                       : rf_buf_puts(&b, "null");
    if (!rc)
        rc = rf_buf_printf(&b,
                           ",\n  \"r\": %d,\n  \"lora_alpha\": %.9g,\n  \"lora_dropout\": %.9g,\n"
                           "  \"fan_in_fan_out\": %s,\n  \"bias\": \"none\",\n"
                           "  \"use_rslora\": false,\n  \"use_dora\": false,\n"
                           "  \"init_lora_weights\": true,\n  \"inference_mode\": true,\n"
                           "  \"modules_to_save\": null,\n  \"target_modules\": [",
                           lo->cfg.rank, lo->cfg.alpha, lo->cfg.dropout,
                           lo->arch == RF_LORA_GPT2 ? "true" : "false");
    for (int i = 0; !rc && i < nm; i++)
        rc = rf_buf_printf(&b, "%s\"%s\"", i ? ", " : "", mods[i]);
    if (!rc) rc = rf_buf_puts(&b, "]\n}\n");
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (!rc) rc = rf_write_file_atomic(path, b.data, b.len);
    rf_buf_free(&b);
    if (rc) return rf_fail_ctx(rc, "lora: writing %s", path);

    rf_st_out *t = calloc(lo->ntensors, sizeof *t);
    char(*names)[sizeof PEFT_PREFIX + 96] = calloc(lo->ntensors, sizeof *names);
    float *host = NULL; /* the block's host copy, off the CPU backend */
    const float *params = lo->params;
    if (!t || !names || (!on_cpu(lo) && !(host = malloc(lo->nparams * sizeof(float))))) {
        free(t), free(names), free(host);
        return RF_ERR_NOMEM;
    }
    if (host) {
        if ((rc = lo->be->to_host(lo->be, host, lo->params, lo->nparams * sizeof(float)))) {
            free(t), free(names), free(host);
            return rf_fail_ctx(rc, "lora: reading the adapter from %s", lo->be->name);
        }
        params = host;
    }
    for (size_t i = 0; i < lo->ntensors; i++) {
        const rf_tensor_info *ti = &lo->tensors[i];
        snprintf(names[i], sizeof names[i], PEFT_PREFIX "%s", ti->name);
        t[i] = (rf_st_out){names[i], 2, {ti->shape[0], ti->shape[1]}, params + ti->offset};
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    rc = rf_st_write(path, t, lo->ntensors);
    free(t), free(names), free(host);
    return rc ? rf_fail_ctx(rc, "lora: writing %s", path) : RF_OK;
}

/* target_modules entry -> RF_LORA_* bits for the architecture (0: unknown). */
static unsigned module_bits(rf_lora_arch arch, const char *s, size_t n) {
    const char *dot = memrchr(s, '.', n);
    const char *last = dot ? dot + 1 : s;
    size_t ln = n - (size_t)(last - s);
#define IS(str) (ln == strlen(str) && memcmp(last, str, ln) == 0)
    if (arch == RF_LORA_GPT2) {
        bool attn = dot && dot - s >= 4 && memcmp(dot - 4, "attn", 4) == 0,
             mlp = dot && dot - s >= 3 && memcmp(dot - 3, "mlp", 3) == 0;
        if (IS("c_attn")) return RF_LORA_Q | RF_LORA_K | RF_LORA_V;
        if (IS("c_fc")) return RF_LORA_UP;
        if (IS("c_proj")) return attn ? RF_LORA_O : mlp ? RF_LORA_DOWN : RF_LORA_O | RF_LORA_DOWN;
        return 0;
    }
    if (IS("q_proj")) return RF_LORA_Q;
    if (IS("k_proj")) return RF_LORA_K;
    if (IS("v_proj")) return RF_LORA_V;
    if (IS("o_proj")) return RF_LORA_O;
    if (IS("up_proj")) return RF_LORA_UP;
    if (IS("down_proj")) return RF_LORA_DOWN;
    if (IS("gate_proj")) return RF_LORA_GATE;
#undef IS
    return 0;
}

/* Reads a PEFT adapter_config.json's text into *c (rank, alpha, dropout and
 * targets for the architecture; base fp32), refusing what this code does not
 * compute. */
static int parse_config(rf_lora_arch arch, const char *path, const char *text, size_t len,
                        rf_lora_config *c) {
    int rc;
    rf_json_doc *doc = rf_json_doc_new();
    const rf_json *r, *v;
    if (!doc) return RF_ERR_NOMEM;
    *c = rf_lora_defaults();
    c->targets = 0;
    if ((rc = rf_json_parse(doc, text, len, &r)) || r->type != RF_JSON_OBJECT) {
        rc = rf_fail(RF_ERR_PARSE, "%s: not a JSON object", path);
        goto out;
    }
    if ((v = rf_json_get(r, "peft_type")) && (!rf_json_is_str(v) || strcmp(v->u.str, "LORA"))) {
        rc = rf_fail(RF_ERR_UNSUPPORTED, "%s: peft_type is not LORA", path);
        goto out;
    }
    int64_t rank;
    if (!(v = rf_json_get(r, "r")) || rf_json_int64(v, &rank) || rank < 1 || rank > 4096) {
        rc = rf_fail(RF_ERR_INVALID, "%s: r is not an integer in [1, 4096]", path);
        goto out;
    }
    c->rank = (int)rank;
    if (!(v = rf_json_get(r, "lora_alpha")) || v->type != RF_JSON_NUMBER || !(v->num > 0) ||
        !isfinite((float)v->num)) {
        rc = rf_fail(RF_ERR_INVALID, "%s: lora_alpha is not a positive number", path);
        goto out;
    }
    c->alpha = (float)v->num;
    if ((v = rf_json_get(r, "lora_dropout")) && v->type != RF_JSON_NULL) {
        if (v->type != RF_JSON_NUMBER || !(v->num >= 0 && v->num < 1)) {
            rc = rf_fail(RF_ERR_INVALID, "%s: lora_dropout is not in [0, 1)", path);
            goto out;
        }
        c->dropout = (float)v->num;
    }
    /* options that change what the adapter computes must be off (absent,
     * false, null, or empty) */
    const char *off[] = {"use_rslora",        "use_dora",
                         "lora_bias",         "rank_pattern",
                         "alpha_pattern",     "layers_to_transform",
                         "modules_to_save",   "exclude_modules",
                         "target_parameters", "trainable_token_indices",
                         "layer_replication", "use_qalora"};
    for (size_t i = 0; i < sizeof off / sizeof *off; i++) {
        v = rf_json_get(r, off[i]);
        if (v && v->type != RF_JSON_NULL && v->type != RF_JSON_FALSE &&
            !((v->type == RF_JSON_OBJECT || v->type == RF_JSON_ARRAY) && v->len == 0)) {
            rc = rf_fail(RF_ERR_UNSUPPORTED, "%s: %s is not supported", path, off[i]);
            goto out;
        }
    }
    if ((v = rf_json_get(r, "bias")) && (!rf_json_is_str(v) || strcmp(v->u.str, "none"))) {
        rc = rf_fail(RF_ERR_UNSUPPORTED, "%s: bias must be \"none\"", path);
        goto out;
    }
    if (!(v = rf_json_get(r, "target_modules")) || v->type != RF_JSON_ARRAY) {
        rc = rf_fail(RF_ERR_UNSUPPORTED, "%s: target_modules must be a list of module names", path);
        goto out;
    }
    for (size_t i = 0; i < v->len; i++) {
        const rf_json *e = &v->u.items[i];
        unsigned b = rf_json_is_str(e) ? module_bits(arch, e->u.str, e->len) : 0;
        if (!b) {
            rc = rf_fail(RF_ERR_UNSUPPORTED, "%s: unknown target module '%.*s' for %s", path,
                         rf_json_is_str(e) ? (int)e->len : 1, rf_json_is_str(e) ? e->u.str : "?",
                         arch == RF_LORA_GPT2 ? "GPT-2" : "Llama");
            goto out;
        }
        c->targets |= b;
    }
    if (!c->targets) rc = rf_fail(RF_ERR_INVALID, "%s: target_modules is empty", path);
out:
    rf_json_doc_free(doc);
    return rc;
}

static int read_config(rf_lora *lo, const char *path, const char *text, size_t len) {
    rf_lora_config c;
    int rc = parse_config(lo->arch, path, text, len, &c);
    if (rc) return rc;
    if (c.rank != lo->cfg.rank)
        return rf_fail(RF_ERR_INVALID, "%s: r is not %d", path, lo->cfg.rank);
    if (c.alpha != lo->cfg.alpha)
        return rf_fail(RF_ERR_INVALID, "%s: lora_alpha is not %g", path, lo->cfg.alpha);
    if (c.targets != lo->cfg.targets)
        return rf_fail(RF_ERR_INVALID,
                       "%s: target_modules select other modules than the adapter set's", path);
    return RF_OK;
}

/* Copies every adapter tensor of st into lo, all checked first (lo's
 * weights change only when every one is valid). */
static int read_weights(rf_lora *lo, const char *path, const rf_st_file *st) {
    int rc = RF_OK;
    char name[sizeof PEFT_PREFIX + 96];
    for (size_t i = 0; i < st->n && !rc; i++) {
        const char *n = st->tensors[i].name;
        if (strstr(n, "lora_") && (strncmp(n, PEFT_PREFIX, strlen(PEFT_PREFIX)) != 0 ||
                                   !rf_lora_find(lo, n + strlen(PEFT_PREFIX))))
            rc = rf_fail(RF_ERR_INVALID, "%s: tensor '%s' is not an adapter of this set", path, n);
    }
    for (size_t i = 0; i < lo->ntensors && !rc; i++) {
        const rf_tensor_info *t = &lo->tensors[i];
        snprintf(name, sizeof name, PEFT_PREFIX "%s", t->name);
        const rf_st_tensor *s = rf_st_find(st, name);
        if (!s)
            rc = rf_fail(RF_ERR_NOT_FOUND, "%s: tensor '%s' is missing", path, name);
        else if (s->ndim != 2 || s->shape[0] != t->shape[0] || s->shape[1] != t->shape[1])
            rc = rf_fail(RF_ERR_INVALID,
                         "%s: tensor '%s' is not [%d, %d] (an adapter for another model's "
                         "shape or rank?)",
                         path, name, t->shape[0], t->shape[1]);
        else if (s->dtype != RF_ST_F32 && s->dtype != RF_ST_F16 && s->dtype != RF_ST_BF16 &&
                 s->dtype != RF_ST_F64)
            rc = rf_fail(RF_ERR_UNSUPPORTED, "%s: tensor '%s' is %s, not a float type", path, name,
                         rf_st_dtype_name(s->dtype));
    }
    /* off the CPU backend: converted on the host, then to_device */
    float *host = !rc && !on_cpu(lo) ? malloc(lo->nparams * sizeof(float)) : NULL;
    float *dst = on_cpu(lo) ? lo->params : host;
    if (!rc && !dst) rc = RF_ERR_NOMEM;
    for (size_t i = 0; i < lo->ntensors && !rc; i++) {
        const rf_tensor_info *t = &lo->tensors[i];
        snprintf(name, sizeof name, PEFT_PREFIX "%s", t->name);
        if ((rc = rf_st_to_f32(rf_st_find(st, name), dst + t->offset)))
            rc = rf_fail_ctx(rc, "%s", path);
    }
    if (!rc && host) rc = lo->be->to_device(lo->be, lo->params, host, lo->nparams * sizeof(float));
    free(host);
    return rc;
}

int rf_lora_load_peft_mem(rf_lora *lo, const char *config, size_t config_len,
                          const uint8_t *weights, size_t weights_len) {
    int rc = read_config(lo, "adapter_config.json", config, config_len);
    if (rc) return rc;
    uint8_t *buf = malloc(weights_len ? weights_len : 1);
    if (!buf) return RF_ERR_NOMEM;
    memcpy(buf, weights, weights_len);
    rf_st_file *st;
    if ((rc = rf_st_parse(buf, weights_len, &st)))
        return rf_fail_ctx(rc, "lora: adapter_model.safetensors");
    rc = read_weights(lo, "adapter_model.safetensors", st);
    rf_st_free(st);
    return rc;
}

int rf_lora_load_peft(rf_lora *lo, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text;
    size_t len;
    int rc = rf_read_file(path, 1 << 20, &text, &len);
    if (rc) return rf_fail_ctx(rc, "lora: reading %s", path);
    rc = read_config(lo, path, text, len);
    free(text);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    rf_st_file *st;
    if ((rc = rf_st_open(path, &st))) return rf_fail_ctx(rc, "lora: %s", path);
    rc = read_weights(lo, path, st);
    rf_st_free(st);
    return rc;
}

int rf_lora_peft_config(const char *dir, rf_lora_arch arch, rf_lora_config *out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text;
    size_t len;
    int rc = rf_read_file(path, 1 << 20, &text, &len);
    if (rc) return rf_fail_ctx(rc, "lora: reading %s", path);
    rc = parse_config(arch, path, text, len, out);
    free(text);
    return rc;
}

/* ---- merging into the base ---- */

/* W += s B A for every adapter of lo; w[layer * RF_NPROJ + slot] is the
 * projection's fp32 weight (Conv1D [in, out] when conv, else [out, in]). */
static void merge(const rf_lora *lo, float **w, bool conv) {
    int r = lo->cfg.rank;
    for (int i = 0; i < lo->nlayers * RF_NPROJ; i++) {
        const rf_lora_proj *pj = &lo->proj[i];
        for (int j = 0; j < pj->nparts; j++) {
            const rf_lora_part *p = &pj->part[j];
            if (p->a < 0) continue;
            const float *A = lo->params + lo->tensors[p->a].offset; /* [r, in] */
            const float *B = lo->params + lo->tensors[p->b].offset; /* [len, r] */
            if (conv) /* W[:, off..off+len) += s A^T B^T */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, pj->in, p->len, r, lo->scale, A,
                            pj->in, B, r, 1.0f, w[i] + p->off, pj->out);
            else /* W[off..off+len, :) += s B A */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, p->len, pj->in, r, lo->scale,
                            B, r, A, pj->in, 1.0f, w[i] + (size_t)p->off * pj->in, pj->in);
        }
    }
}

static int check_merge(const rf_lora *lo, const void *attached) {
    if (lo->cfg.base != RF_QT_F32)
        return rf_fail(RF_ERR_UNSUPPORTED, "lora: merging needs an fp32 base, not %s",
                       rf_lora_base_name(lo->cfg.base));
    if (attached)
        return rf_fail(RF_ERR_INVALID, "lora: the model has an adapter set attached; merge into "
                                       "a model without one");
    return RF_OK;
}

int rf_lora_merge_gpt2(const rf_lora *lo, rf_gpt2 *m) {
    if (lo->arch != RF_LORA_GPT2 || lo->nlayers != m->cfg.n_layer)
        return rf_fail(RF_ERR_INVALID, "lora: the adapter set was not made for this GPT-2");
    if (m->be != rf_backend_cpu() || lo->be != rf_backend_cpu())
        return rf_fail(
            RF_ERR_UNSUPPORTED,
            "%s: LoRA merging runs on the CPU backend only (trainer.device: cpu), not %s", "gpt2",
            m->be != rf_backend_cpu() ? m->be->name : lo->be->name);
    int rc = check_merge(lo, m->lora);
    if (rc) return rc;
    float **w = malloc(sizeof(float *) * lo->nlayers * RF_NPROJ);
    if (!w) return RF_ERR_NOMEM;
    for (int l = 0; l < lo->nlayers; l++) {
        rf_gpt2_layer *y = &m->p.layers[l];
        float **v = w + l * RF_NPROJ;
        v[RF_PROJ_QKV] = y->attn_w, v[RF_PROJ_O] = y->proj_w;
        v[RF_PROJ_UP] = y->fc_w, v[RF_PROJ_DOWN] = y->fcp_w;
    }
    merge(lo, w, true);
    free(w);
    return RF_OK;
}

int rf_lora_merge_llama(const rf_lora *lo, rf_llama *m) {
    if (lo->arch != RF_LORA_LLAMA || lo->nlayers != m->cfg.num_hidden_layers)
        return rf_fail(RF_ERR_INVALID, "lora: the adapter set was not made for this Llama");
    if (m->be != rf_backend_cpu() || lo->be != rf_backend_cpu())
        return rf_fail(
            RF_ERR_UNSUPPORTED,
            "%s: LoRA merging runs on the CPU backend only (trainer.device: cpu), not %s", "llama",
            m->be != rf_backend_cpu() ? m->be->name : lo->be->name);
    int rc = check_merge(lo, m->lora);
    if (rc) return rc;
    float **w = malloc(sizeof(float *) * lo->nlayers * RF_NPROJ);
    if (!w) return RF_ERR_NOMEM;
    for (int l = 0; l < lo->nlayers; l++) {
        rf_llama_layer *y = &m->p.layers[l];
        float **v = w + l * RF_NPROJ;
        v[RF_PROJ_QKV] = y->qkv_w, v[RF_PROJ_O] = y->o_w;
        v[RF_PROJ_UP] = y->gu_w, v[RF_PROJ_DOWN] = y->down_w;
    }
    merge(lo, w, false);
    free(w);
    return RF_OK;
}

/* Reads dir's config for the architecture, makes the set for the model,
 * loads the weights and merges. */
int rf_lora_merge_peft(struct rf_gpt2 *gpt2, struct rf_llama *llama, const char *dir) {
    if (!gpt2 == !llama) return rf_fail(RF_ERR_INVALID, "lora: merge into one model");
    rf_lora_config c;
    int rc = rf_lora_peft_config(dir, gpt2 ? RF_LORA_GPT2 : RF_LORA_LLAMA, &c);
    if (rc) return rc;
    rf_lora *lo;
    rc = gpt2 ? rf_lora_new_gpt2(gpt2, &c, 0, &lo) : rf_lora_new_llama(llama, &c, 0, &lo);
    if (rc) return rf_fail_ctx(rc, "%s/adapter_config.json", dir);
    if (!(rc = rf_lora_load_peft(lo, dir)))
        rc = gpt2 ? rf_lora_merge_gpt2(lo, gpt2) : rf_lora_merge_llama(lo, llama);
    rf_lora_free(lo);
    return rc;
}
