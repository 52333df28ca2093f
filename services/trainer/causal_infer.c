/* Incremental forward with a key/value cache (see causal_infer.h). The
 * layer code mirrors rf_gpt2_forward / rf_llama_forward op for op. Two
 * paths:
 * - on the CPU backend the norms, activations and embeddings are the ops
 *   themselves, and three things differ from training, for speed, none for
 *   the result beyond round-off: projections and the LM head call sgemm
 *   directly, so OpenBLAS spreads even one row (a decode step) over its
 *   threads, where the ops cut rows into pieces of at least 128 for bitwise
 *   reproducibility across thread counts (which inference does not need);
 *   RoPE's cos/sin come from a table filled once per state with the op's own
 *   formula (rope_cs in ops_causal.c), not recomputed per token and layer;
 *   the attention is rf_op_kv_attention_fwd, called per block of QB new
 *   queries so that its scores take NH x QB x cap floats (per query head,
 *   one sgemm for the scores and one for the weighted values);
 * - on any other backend every step is one of its slots (backend.h: the
 *   training forward's, copy2d to append to the cache, kv_attention_fwd), on
 *   its memory: the cache, the activations and the scores live there, the
 *   ids and positions go to it and the hidden states and logits come back
 *   (to_host) as the host API gives them. */
#include "trainer/causal_infer.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "trainer/ops.h"
#include "trainer/ops_causal.h"

#define QB 64 /* the CPU's attention: new queries per rf_op_kv_attention_fwd call */

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

struct rf_infer {
    rf_causal_model m;
    rf_causal_dims d;
    const rf_backend *be; /* the model's */
    bool dev;             /* not the CPU: the slot path, buffers of be's memory */
    int cap, chunk, len;
    float *kc, *vc; /* [L][cap][NKV * hd] */
    float *x, *xn, *qkv, *atty, *tmp, *ff1, *ff2, *mean, *rstd;
    float *scores;              /* [NH][chunk][cap] (CPU: [NH][QB][cap]): the attention's */
    int32_t *pos;               /* host */
    float *rope_cos, *rope_sin; /* CPU, Llama: [cap][hd / 2] */
    /* dev only: the ids and positions of a chunk, the hidden states and the
     * LM head's input and output (hn rows of each) */
    int32_t *ids_d, *pos_d;
    float *hid, *hin, *logits;
    int hn;
};

/* A buffer of s's memory (the backend's on a device), or NULL. */
static void *buf(const rf_infer *s, size_t bytes) {
    return s->dev ? rf_backend_alloc(s->be, bytes) : malloc(bytes ? bytes : 1);
}

static void unbuf(const rf_infer *s, void *p) {
    if (s->dev)
        rf_backend_free(s->be, p);
    else
        free(p);
}

int rf_causal_dims_of(const rf_causal_model *m, rf_causal_dims *d) {
    memset(d, 0, sizeof *d);
    if (!!m->gpt2 == !!m->llama)
        return rf_fail(RF_ERR_INVALID, "causal model: exactly one of gpt2 and llama must be set");
    if (m->gpt2) {
        const rf_gpt2_config *c = &m->gpt2->cfg;
        *d =
            (rf_causal_dims){c->vocab_size,         c->n_embd,  c->n_layer,    c->n_head, c->n_head,
                             c->n_embd / c->n_head, c->n_inner, c->n_positions};
    } else {
        const rf_llama_config *c = &m->llama->cfg;
        *d = (rf_causal_dims){c->vocab_size,          c->hidden_size,
                              c->num_hidden_layers,   c->num_attention_heads,
                              c->num_key_value_heads, c->head_dim,
                              c->intermediate_size,   c->max_position_embeddings};
    }
    return RF_OK;
}

void rf_infer_free(rf_infer *s) {
    if (!s) return;
    void *f[] = {s->kc,   s->vc,   s->x,      s->xn,  s->qkv, s->atty,   s->tmp,   s->ff1,  s->ff2,
                 s->mean, s->rstd, s->scores, s->hid, s->hin, s->logits, s->ids_d, s->pos_d};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        unbuf(s, f[i]);
    free(s->pos), free(s->rope_cos), free(s->rope_sin);
    free(s);
}

int rf_infer_new(const rf_causal_model *m, int cap, int chunk, rf_infer **out) {
    *out = NULL;
    rf_causal_dims d;
    int rc = rf_causal_dims_of(m, &d);
    if (rc) return rc;
    const rf_backend *be = m->gpt2 ? m->gpt2->be : m->llama->be;
    const rf_backend_slot need[] = {{"kv_attention_fwd", !be->kv_attention_fwd},
                                    {"copy2d", !be->copy2d}};
    if ((rc = rf_backend_check_slots(be, "inference", need, sizeof need / sizeof *need))) return rc;
    if (cap < 1 || cap > d.max_pos)
        return rf_fail(RF_ERR_RANGE, "inference: %d positions asked, the model has %d", cap,
                       d.max_pos);
    if (chunk < 1) return rf_fail(RF_ERR_INVALID, "inference: chunk %d", chunk);
    if (chunk > cap) chunk = cap;
    rf_infer *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->m = *m, s->d = d, s->cap = cap, s->chunk = chunk;
    s->be = be, s->dev = be != rf_backend_cpu();
    size_t M = (size_t)chunk, C = d.C, KW = (size_t)d.NKV * d.hd, A = (size_t)d.NH * d.hd,
           W = A + 2 * KW, F = d.F, kv = (size_t)d.L * cap * KW;
    s->kc = buf(s, kv * sizeof(float));
    s->vc = buf(s, kv * sizeof(float));
    s->x = buf(s, M * C * sizeof(float));
    s->xn = buf(s, M * C * sizeof(float));
    s->qkv = buf(s, M * W * sizeof(float));
    s->atty = buf(s, M * A * sizeof(float));
    s->tmp = buf(s, M * C * sizeof(float));
    s->ff1 = buf(s, M * 2 * F * sizeof(float));
    s->ff2 = buf(s, M * F * sizeof(float));
    s->mean = buf(s, M * sizeof(float));
    s->rstd = buf(s, M * sizeof(float));
    s->scores = buf(s, (size_t)d.NH * (s->dev || M < QB ? M : QB) * cap * sizeof(float));
    s->pos = malloc(M * sizeof(int32_t));
    bool ok = s->kc && s->vc && s->x && s->xn && s->qkv && s->atty && s->tmp && s->ff1 && s->ff2 &&
              s->mean && s->rstd && s->scores && s->pos;
    if (ok && s->dev)
        ok = (s->ids_d = buf(s, M * sizeof(int32_t))) && (s->pos_d = buf(s, M * sizeof(int32_t))) &&
             (s->hid = buf(s, M * C * sizeof(float)));
    if (!ok) {
        rf_infer_free(s);
        return RF_ERR_NOMEM;
    }
    if (m->llama && !s->dev) {
        int half = d.hd / 2;
        s->rope_cos = malloc((size_t)cap * half * sizeof(float));
        s->rope_sin = malloc((size_t)cap * half * sizeof(float));
        if (!s->rope_cos || !s->rope_sin) {
            rf_infer_free(s);
            return RF_ERR_NOMEM;
        }
        /* as ops_causal.c's rope_cs: f_i = 1 / theta^(2i/hs) in double, rounded
         * to float; the angle p * f_i in float; cos and sin of that angle */
        float theta = m->llama->cfg.rope_theta;
        for (int i = 0; i < half; i++) {
            float f = (float)(1.0 / pow((double)theta, (double)(2 * i) / d.hd));
            for (int p = 0; p < cap; p++) {
                float a = (float)p * f;
                s->rope_cos[(size_t)p * half + i] = (float)cos((double)a);
                s->rope_sin[(size_t)p * half + i] = (float)sin((double)a);
            }
        }
    }
    *out = s;
    return RF_OK;
}

void rf_infer_reset(rf_infer *s) {
    s->len = 0;
}
int rf_infer_len(const rf_infer *s) {
    return s->len;
}
int rf_infer_cap(const rf_infer *s) {
    return s->cap;
}
const rf_causal_dims *rf_infer_dims(const rf_infer *s) {
    return &s->d;
}

/* out[n, OC] = inp[n, IC] W + b: W is [OC, IC] (nn.Linear) or, with
 * conv1d, [IC, OC] (GPT-2's Conv1D); b may be NULL. */
static void project(float *out, const float *inp, const float *w, const float *b, int n, int IC,
                    int OC, bool conv1d) {
    for (int r = 0; b && r < n; r++)
        memcpy(out + (size_t)r * OC, b, sizeof(float) * OC);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, conv1d ? CblasNoTrans : CblasTrans, n, OC, IC, 1.0f,
                inp, IC, w, conv1d ? OC : IC, b ? 1.0f : 0.0f, out, OC);
}

/* RoPE in place on nh heads of hd channels at column 0 of rows `stride`
 * apart, positions pos[0..n): rf_op_rope_fwd with the table's cos/sin. */
static void rope(const rf_infer *s, float *x, int n, int nh, int hd, int stride) {
    int half = hd / 2;
#pragma omp parallel for schedule(static) if ((size_t)n * nh * hd > 4096)
    for (int r = 0; r < n; r++) {
        const float *cs = s->rope_cos + (size_t)s->pos[r] * half,
                    *sn = s->rope_sin + (size_t)s->pos[r] * half;
        for (int h = 0; h < nh; h++) {
            float *v = x + (size_t)r * stride + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * sn[i];
                v[i + half] = b * cs[i] + a * sn[i];
            }
        }
    }
}

static void add_into(float *x, const float *y, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        x[i] = y[i] + x[i];
}

/* One chunk of n <= s->chunk tokens on the CPU. */
static void chunk_forward(rf_infer *s, const int32_t *ids, int n, float *hidden) {
    const rf_causal_dims *d = &s->d;
    int C = d->C, F = d->F, hd = d->hd, KW = d->NKV * hd, A = d->NH * hd, W = A + 2 * KW;
    for (int t = 0; t < n; t++)
        s->pos[t] = s->len + t;
    rf_gpt2 *g = s->m.gpt2;
    rf_llama *m = s->m.llama;
    rf_op_tokpos_fwd(s->x, ids, s->pos, g ? g->p.wte : m->p.wte, g ? g->p.wpe : NULL, 1, n, C);
    for (int l = 0; l < d->L; l++) {
        if (g) {
            const rf_gpt2_layer *w = &g->p.layers[l];
            float eps = g->cfg.layer_norm_epsilon;
            rf_op_layernorm_fwd(s->xn, s->mean, s->rstd, s->x, w->ln1_w, w->ln1_b, n, C, eps);
            project(s->qkv, s->xn, w->attn_w, w->attn_b, n, C, W, true);
        } else {
            const rf_llama_layer *w = &m->p.layers[l];
            rf_op_rmsnorm_fwd(s->xn, s->rstd, s->x, w->ln1_w, n, C, m->cfg.rms_norm_eps);
            project(s->qkv, s->xn, w->qkv_w, NULL, n, C, W, false);
            rope(s, s->qkv, n, d->NH, hd, W);
            rope(s, s->qkv + A, n, d->NKV, hd, W);
        }
        float *kc = s->kc + ((size_t)l * s->cap + s->len) * KW,
              *vc = s->vc + ((size_t)l * s->cap + s->len) * KW;
        for (int t = 0; t < n; t++) {
            memcpy(kc + (size_t)t * KW, s->qkv + (size_t)t * W + A, sizeof(float) * KW);
            memcpy(vc + (size_t)t * KW, s->qkv + (size_t)t * W + A + KW, sizeof(float) * KW);
        }
        for (int t0 = 0; t0 < n; t0 += QB) /* blocks of queries: QB rows of scores */
            rf_op_kv_attention_fwd(s->atty + (size_t)t0 * A, s->scores, s->qkv + (size_t)t0 * W,
                                   s->kc + (size_t)l * s->cap * KW, s->vc + (size_t)l * s->cap * KW,
                                   n - t0 < QB ? n - t0 : QB, s->len + t0, d->NH, d->NKV, hd);
        if (g) {
            const rf_gpt2_layer *w = &g->p.layers[l];
            float eps = g->cfg.layer_norm_epsilon;
            project(s->tmp, s->atty, w->proj_w, w->proj_b, n, C, C, true);
            add_into(s->x, s->tmp, (size_t)n * C);
            rf_op_layernorm_fwd(s->xn, s->mean, s->rstd, s->x, w->ln2_w, w->ln2_b, n, C, eps);
            project(s->ff1, s->xn, w->fc_w, w->fc_b, n, C, F, true);
            rf_op_gelu_tanh_fwd(s->ff2, s->ff1, (size_t)n * F);
            project(s->tmp, s->ff2, w->fcp_w, w->fcp_b, n, F, C, true);
        } else {
            const rf_llama_layer *w = &m->p.layers[l];
            project(s->tmp, s->atty, w->o_w, NULL, n, A, C, false);
            add_into(s->x, s->tmp, (size_t)n * C);
            rf_op_rmsnorm_fwd(s->xn, s->rstd, s->x, w->ln2_w, n, C, m->cfg.rms_norm_eps);
            project(s->ff1, s->xn, w->gu_w, NULL, n, C, 2 * F, false);
            rf_op_swiglu_fwd(s->ff2, s->ff1, n, F);
            project(s->tmp, s->ff2, w->down_w, NULL, n, F, C, false);
        }
        add_into(s->x, s->tmp, (size_t)n * C);
    }
    if (hidden) {
        if (g)
            rf_op_layernorm_fwd(hidden, s->mean, s->rstd, s->x, g->p.lnf_w, g->p.lnf_b, n, C,
                                g->cfg.layer_norm_epsilon);
        else
            rf_op_rmsnorm_fwd(hidden, s->rstd, s->x, m->p.norm_w, n, C, m->cfg.rms_norm_eps);
    }
    s->len += n;
}

/* The same through the backend's slots, on its memory. */
static int chunk_forward_dev(rf_infer *s, const int32_t *ids, int n, float *hidden) {
    const rf_causal_dims *d = &s->d;
    const rf_backend *be = s->be;
    int C = d->C, F = d->F, hd = d->hd, KW = d->NKV * hd, A = d->NH * hd, W = A + 2 * KW;
    size_t nc = (size_t)n * C;
    for (int t = 0; t < n; t++)
        s->pos[t] = s->len + t;
    rf_gpt2 *g = s->m.gpt2;
    rf_llama *m = s->m.llama;
    TRY(be->to_device(be, s->ids_d, ids, sizeof(int32_t) * (size_t)n));
    TRY(be->to_device(be, s->pos_d, s->pos, sizeof(int32_t) * (size_t)n));
    TRY(be->tokpos_fwd(be, s->x, s->ids_d, s->pos_d, g ? g->p.wte : m->p.wte, g ? g->p.wpe : NULL,
                       1, n, C));
    for (int l = 0; l < d->L; l++) {
        float *kc = s->kc + (size_t)l * s->cap * KW, *vc = s->vc + (size_t)l * s->cap * KW;
        if (g) {
            const rf_gpt2_layer *w = &g->p.layers[l];
            float eps = g->cfg.layer_norm_epsilon;
            TRY(be->layernorm_fwd(be, s->xn, s->mean, s->rstd, s->x, w->ln1_w, w->ln1_b, n, C,
                                  eps));
            TRY(be->conv1d_fwd(be, s->qkv, s->xn, w->attn_w, w->attn_b, n, C, W));
        } else {
            const rf_llama_layer *w = &m->p.layers[l];
            float theta = m->cfg.rope_theta;
            TRY(be->rmsnorm_fwd(be, s->xn, s->rstd, s->x, w->ln1_w, n, C, m->cfg.rms_norm_eps));
            TRY(be->linear_fwd(be, s->qkv, s->xn, w->qkv_w, NULL, n, C, W));
            TRY(be->rope_fwd(be, s->qkv, s->qkv, s->pos_d, n, n, d->NH, hd, W, theta));
            TRY(be->rope_fwd(be, s->qkv + A, s->qkv + A, s->pos_d, n, n, d->NKV, hd, W, theta));
        }
        /* the new keys and values into the cache, rows len.. */
        size_t kb = (size_t)KW * sizeof(float), wb = (size_t)W * sizeof(float);
        TRY(be->copy2d(be, kc + (size_t)s->len * KW, kb, s->qkv + A, wb, kb, (size_t)n));
        TRY(be->copy2d(be, vc + (size_t)s->len * KW, kb, s->qkv + A + KW, wb, kb, (size_t)n));
        TRY(be->kv_attention_fwd(be, s->atty, s->scores, s->qkv, kc, vc, n, s->len, d->NH, d->NKV,
                                 hd));
        if (g) {
            const rf_gpt2_layer *w = &g->p.layers[l];
            float eps = g->cfg.layer_norm_epsilon;
            TRY(be->conv1d_fwd(be, s->tmp, s->atty, w->proj_w, w->proj_b, n, C, C));
            TRY(be->residual_fwd(be, s->x, s->tmp, s->x, nc, 0.0f, 0)); /* x = tmp + x */
            TRY(be->layernorm_fwd(be, s->xn, s->mean, s->rstd, s->x, w->ln2_w, w->ln2_b, n, C,
                                  eps));
            TRY(be->conv1d_fwd(be, s->ff1, s->xn, w->fc_w, w->fc_b, n, C, F));
            TRY(be->gelu_tanh_fwd(be, s->ff2, s->ff1, (size_t)n * F));
            TRY(be->conv1d_fwd(be, s->tmp, s->ff2, w->fcp_w, w->fcp_b, n, F, C));
        } else {
            const rf_llama_layer *w = &m->p.layers[l];
            TRY(be->linear_fwd(be, s->tmp, s->atty, w->o_w, NULL, n, A, C));
            TRY(be->residual_fwd(be, s->x, s->tmp, s->x, nc, 0.0f, 0));
            TRY(be->rmsnorm_fwd(be, s->xn, s->rstd, s->x, w->ln2_w, n, C, m->cfg.rms_norm_eps));
            TRY(be->linear_fwd(be, s->ff1, s->xn, w->gu_w, NULL, n, C, 2 * F));
            TRY(be->swiglu_fwd(be, s->ff2, s->ff1, n, F));
            TRY(be->linear_fwd(be, s->tmp, s->ff2, w->down_w, NULL, n, F, C));
        }
        TRY(be->residual_fwd(be, s->x, s->tmp, s->x, nc, 0.0f, 0));
    }
    if (hidden) {
        if (g)
            TRY(be->layernorm_fwd(be, s->hid, s->mean, s->rstd, s->x, g->p.lnf_w, g->p.lnf_b, n, C,
                                  g->cfg.layer_norm_epsilon));
        else
            TRY(be->rmsnorm_fwd(be, s->hid, s->rstd, s->x, m->p.norm_w, n, C, m->cfg.rms_norm_eps));
        TRY(be->to_host(be, hidden, s->hid, nc * sizeof(float)));
    }
    s->len += n;
    return RF_OK;
}

int rf_infer_forward(rf_infer *s, const int32_t *ids, int n, float *hidden) {
    if (n < 0 || n > s->cap - s->len)
        return rf_fail(RF_ERR_RANGE, "inference: %d tokens after %d exceed the %d positions", n,
                       s->len, s->cap);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->d.vocab)
            return rf_fail(RF_ERR_RANGE, "inference: token id %d outside the vocabulary (%d)",
                           ids[i], s->d.vocab);
    for (int i = 0; i < n; i += s->chunk) {
        int k = n - i < s->chunk ? n - i : s->chunk;
        float *h = hidden ? hidden + (size_t)i * s->d.C : NULL;
        if (s->dev)
            TRY(chunk_forward_dev(s, ids + i, k, h));
        else
            chunk_forward(s, ids + i, k, h);
    }
    return RF_OK;
}

int rf_infer_logits(rf_infer *s, const float *h, int n, float *logits) {
    const float *w = s->m.gpt2 ? s->m.gpt2->p.wte : s->m.llama->p.head_w;
    int C = s->d.C, V = s->d.vocab;
    if (!s->dev) {
        project(logits, h, w, NULL, n, C, V, false); /* rf_op_lm_head_fwd's product */
        return RF_OK;
    }
    const rf_backend *be = s->be;
    if (n > s->hn) { /* the head's input and output on the device, grown to n rows */
        unbuf(s, s->hin), unbuf(s, s->logits);
        s->hin = s->logits = NULL, s->hn = 0;
        if (!(s->hin = buf(s, (size_t)n * C * sizeof(float))) ||
            !(s->logits = buf(s, (size_t)n * V * sizeof(float))))
            return rf_fail(RF_ERR_NOMEM, "inference: no %s memory for %d rows of logits", be->name,
                           n);
        s->hn = n;
    }
    TRY(be->to_device(be, s->hin, h, (size_t)n * C * sizeof(float)));
    TRY(be->lm_head_fwd(be, s->logits, s->hin, w, n, C, V));
    return be->to_host(be, logits, s->logits, (size_t)n * V * sizeof(float));
}
