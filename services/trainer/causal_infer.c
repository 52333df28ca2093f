/* Incremental forward with a key/value cache (see causal_infer.h). The
 * layer code mirrors rf_gpt2_forward / rf_llama_forward op for op (the
 * norms, activations and embeddings are the ops themselves). Three things
 * differ, for speed, none for the result beyond round-off:
 * - projections and the LM head call sgemm directly, so OpenBLAS spreads
 *   even one row (a decode step) over its threads, where the ops cut rows
 *   into pieces of at least 128 for bitwise reproducibility across thread
 *   counts (which inference does not need);
 * - RoPE's cos/sin come from a table filled once per state with the op's
 *   own formula (rope_cs in ops_causal.c), not recomputed per token and layer;
 * - the attention runs per (query head, block of new queries): one sgemm for
 *   the scores against every cached key and one for the weighted values,
 *   issued single-threaded from inside the parallel loop as ops.c does. */
#include "trainer/causal_infer.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "trainer/ops.h"
#include "trainer/ops_causal.h"

#define QB 64 /* new queries per attention task */

struct rf_infer {
    rf_causal_model m;
    rf_causal_dims d;
    int cap, chunk, len;
    float *kc, *vc; /* [L][cap][NKV * hd] */
    float *x, *xn, *qkv, *atty, *tmp, *ff1, *ff2, *mean, *rstd;
    int32_t *pos;
    float *scores; /* [threads][QB * cap] */
    int threads;
    float *rope_cos, *rope_sin; /* Llama: [cap][hd / 2] */
};

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
    free(s->kc), free(s->vc), free(s->x), free(s->xn), free(s->qkv), free(s->atty);
    free(s->tmp), free(s->ff1), free(s->ff2), free(s->mean), free(s->rstd), free(s->pos);
    free(s->scores);
    free(s->rope_cos), free(s->rope_sin);
    free(s);
}

int rf_infer_new(const rf_causal_model *m, int cap, int chunk, rf_infer **out) {
    *out = NULL;
    rf_causal_dims d;
    int rc = rf_causal_dims_of(m, &d);
    if (rc) return rc;
    const rf_backend *be = m->gpt2 ? m->gpt2->be : m->llama->be;
    if (be != rf_backend_cpu()) /* it reads the parameters as host memory */
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "inference: generation and perplexity run on the CPU backend only "
                       "(the model is on %s)",
                       be->name);
    if (cap < 1 || cap > d.max_pos)
        return rf_fail(RF_ERR_RANGE, "inference: %d positions asked, the model has %d", cap,
                       d.max_pos);
    if (chunk < 1) return rf_fail(RF_ERR_INVALID, "inference: chunk %d", chunk);
    if (chunk > cap) chunk = cap;
    rf_infer *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->m = *m, s->d = d, s->cap = cap, s->chunk = chunk;
    size_t M = (size_t)chunk, C = d.C, KW = (size_t)d.NKV * d.hd, A = (size_t)d.NH * d.hd,
           W = A + 2 * KW, F = d.F, kv = (size_t)d.L * cap * KW;
    s->kc = malloc(kv * sizeof(float));
    s->vc = malloc(kv * sizeof(float));
    s->x = malloc(M * C * sizeof(float));
    s->xn = malloc(M * C * sizeof(float));
    s->qkv = malloc(M * W * sizeof(float));
    s->atty = malloc(M * A * sizeof(float));
    s->tmp = malloc(M * C * sizeof(float));
    s->ff1 = malloc(M * 2 * F * sizeof(float));
    s->ff2 = malloc(M * F * sizeof(float));
    s->mean = malloc(M * sizeof(float));
    s->rstd = malloc(M * sizeof(float));
    s->pos = malloc(M * sizeof(int32_t));
    if (!s->kc || !s->vc || !s->x || !s->xn || !s->qkv || !s->atty || !s->tmp || !s->ff1 ||
        !s->ff2 || !s->mean || !s->rstd || !s->pos) {
        rf_infer_free(s);
        return RF_ERR_NOMEM;
    }
    if (m->llama) {
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

static int ensure_scores(rf_infer *s) {
    int t = omp_get_max_threads();
    if (t <= s->threads) return RF_OK;
    float *p = realloc(s->scores, (size_t)t * QB * s->cap * sizeof(float));
    if (!p) return RF_ERR_NOMEM;
    s->scores = p, s->threads = t;
    return RF_OK;
}

/* atty[n, NH*hd] for the n new queries of qkv (positions len..len+n-1)
 * against the cached keys and values of layer l (which already hold them). */
static void attend(rf_infer *s, int l, int n) {
    const rf_causal_dims *d = &s->d;
    int hd = d->hd, NH = d->NH, grp = d->NH / d->NKV, KW = d->NKV * hd, A = NH * hd, W = A + 2 * KW,
        len = s->len, nqb = (n + QB - 1) / QB;
    const float *kc = s->kc + (size_t)l * s->cap * KW, *vc = s->vc + (size_t)l * s->cap * KW;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < NH * nqb; task++) {
        int h = task / nqb, t0 = task % nqb * QB, t1 = t0 + QB < n ? t0 + QB : n, g = h / grp;
        int nq = t1 - t0, nk = len + t1;
        float *S = s->scores + (size_t)omp_get_thread_num() * QB * s->cap;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hd, scale,
                    s->qkv + (size_t)t0 * W + (size_t)h * hd, W, kc + (size_t)g * hd, KW, 0.0f, S,
                    nk);
        for (int r = 0; r < nq; r++) {
            float *a = S + (size_t)r * nk;
            int p = len + t0 + r; /* keys 0..p are visible */
            float mx = a[0];
            for (int j = 1; j <= p; j++)
                mx = a[j] > mx ? a[j] : mx;
            double sum = 0;
            for (int j = 0; j <= p; j++) {
                a[j] = expf(a[j] - mx);
                sum += a[j];
            }
            float inv = (float)(1.0 / sum);
            for (int j = 0; j <= p; j++)
                a[j] *= inv;
            for (int j = p + 1; j < nk; j++)
                a[j] = 0;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, S, nk,
                    vc + (size_t)g * hd, KW, 0.0f, s->atty + (size_t)t0 * A + (size_t)h * hd, A);
    }
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

/* One chunk of n <= s->chunk tokens. */
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
        attend(s, l, n);
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

int rf_infer_forward(rf_infer *s, const int32_t *ids, int n, float *hidden) {
    if (n < 0 || n > s->cap - s->len)
        return rf_fail(RF_ERR_RANGE, "inference: %d tokens after %d exceed the %d positions", n,
                       s->len, s->cap);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->d.vocab)
            return rf_fail(RF_ERR_RANGE, "inference: token id %d outside the vocabulary (%d)",
                           ids[i], s->d.vocab);
    int rc = ensure_scores(s);
    if (rc) return rc;
    for (int i = 0; i < n; i += s->chunk) {
        int k = n - i < s->chunk ? n - i : s->chunk;
        chunk_forward(s, ids + i, k, hidden ? hidden + (size_t)i * s->d.C : NULL);
    }
    return RF_OK;
}

void rf_infer_logits(const rf_infer *s, const float *h, int n, float *logits) {
    const float *w = s->m.gpt2 ? s->m.gpt2->p.wte : s->m.llama->p.head_w;
    project(logits, h, w, NULL, n, s->d.C, s->d.vocab, false); /* rf_op_lm_head_fwd's product */
}
