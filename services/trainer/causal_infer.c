/* Incremental forward with a key/value cache (see causal_infer.h). The
 * layer code mirrors rf_gpt2_forward / rf_llama_forward op for op; only the
 * attention differs: per (query head, block of new queries) one sgemm for the
 * scores against every cached key and one for the weighted values, issued
 * single-threaded from inside the parallel loop as ops.c does. */
#include "trainer/causal_infer.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
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
    free(s);
}

int rf_infer_new(const rf_causal_model *m, int cap, int chunk, rf_infer **out) {
    *out = NULL;
    rf_causal_dims d;
    int rc = rf_causal_dims_of(m, &d);
    if (rc) return rc;
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
            rf_op_conv1d_fwd(s->qkv, s->xn, w->attn_w, w->attn_b, n, C, W);
        } else {
            const rf_llama_layer *w = &m->p.layers[l];
            float theta = m->cfg.rope_theta;
            rf_op_rmsnorm_fwd(s->xn, s->rstd, s->x, w->ln1_w, n, C, m->cfg.rms_norm_eps);
            rf_op_linear_fwd(s->qkv, s->xn, w->qkv_w, NULL, n, C, W);
            rf_op_rope_fwd(s->qkv, s->qkv, s->pos, n, n, d->NH, hd, W, theta);
            rf_op_rope_fwd(s->qkv + A, s->qkv + A, s->pos, n, n, d->NKV, hd, W, theta);
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
            rf_op_conv1d_fwd(s->tmp, s->atty, w->proj_w, w->proj_b, n, C, C);
            add_into(s->x, s->tmp, (size_t)n * C);
            rf_op_layernorm_fwd(s->xn, s->mean, s->rstd, s->x, w->ln2_w, w->ln2_b, n, C, eps);
            rf_op_conv1d_fwd(s->ff1, s->xn, w->fc_w, w->fc_b, n, C, F);
            rf_op_gelu_tanh_fwd(s->ff2, s->ff1, (size_t)n * F);
            rf_op_conv1d_fwd(s->tmp, s->ff2, w->fcp_w, w->fcp_b, n, F, C);
        } else {
            const rf_llama_layer *w = &m->p.layers[l];
            rf_op_linear_fwd(s->tmp, s->atty, w->o_w, NULL, n, A, C);
            add_into(s->x, s->tmp, (size_t)n * C);
            rf_op_rmsnorm_fwd(s->xn, s->rstd, s->x, w->ln2_w, n, C, m->cfg.rms_norm_eps);
            rf_op_linear_fwd(s->ff1, s->xn, w->gu_w, NULL, n, C, 2 * F);
            rf_op_swiglu_fwd(s->ff2, s->ff1, n, F);
            rf_op_linear_fwd(s->tmp, s->ff2, w->down_w, NULL, n, F, C);
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
    rf_op_lm_head_fwd(logits, h, w, n, s->d.C, s->d.vocab);
}
