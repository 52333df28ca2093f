/* Generation: sampler, ChatML rendering, the decode loop (see generate.h). */
#include "evaluator/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* ---- sampling ---- */

int rf_sampling_check(const rf_sampling *s) {
    if (isnan(s->temperature) || isinf(s->temperature) || s->temperature < 0)
        return rf_fail(RF_ERR_INVALID, "temperature %g: expected a finite number >= 0",
                       s->temperature);
    if (isnan(s->top_p) || s->top_p < 0 || s->top_p > 1)
        return rf_fail(RF_ERR_INVALID, "top_p %g: expected a number in [0, 1]", s->top_p);
    if (s->top_k < 0) return rf_fail(RF_ERR_INVALID, "top_k %d: expected >= 0", s->top_k);
    return RF_OK;
}

int rf_sampler_init(rf_sampler *sm, const rf_sampling *s, int V) {
    memset(sm, 0, sizeof *sm);
    int rc = rf_sampling_check(s);
    if (rc) return rc;
    if (V < 1) return rf_fail(RF_ERR_INVALID, "sampler: vocabulary of %d", V);
    sm->s = *s, sm->V = V;
    rf_rng_seed(&sm->rng, s->seed);
    sm->p = malloc((size_t)V * sizeof *sm->p);
    sm->idx = malloc((size_t)V * sizeof *sm->idx);
    if (!sm->p || !sm->idx) {
        rf_sampler_free(sm);
        return RF_ERR_NOMEM;
    }
    return RF_OK;
}

void rf_sampler_free(rf_sampler *sm) {
    free(sm->p);
    free(sm->idx);
    sm->p = NULL, sm->idx = NULL;
}

/* Decreasing value, then increasing id (a fixed order for equal values). */
static int by_value_desc(const void *a, const void *b, void *arg) {
    const float *p = arg;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (p[i] != p[j]) return p[i] > p[j] ? -1 : 1;
    return (i > j) - (i < j);
}

int32_t rf_sampler_next(rf_sampler *sm, const float *z) {
    int V = sm->V;
    if (!(sm->s.temperature > 0)) {
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (z[v] > z[best]) best = v;
        return best;
    }
    float *p = sm->p;
    int32_t *idx = sm->idx;
    for (int v = 0; v < V; v++) {
        p[v] = z[v] / sm->s.temperature;
        idx[v] = v;
    }
    qsort_r(idx, (size_t)V, sizeof *idx, by_value_desc, p);
    int kept = V;
    if (sm->s.top_k > 0 && sm->s.top_k < V) {
        float thr = p[idx[sm->s.top_k - 1]];
        kept = sm->s.top_k;
        while (kept < V && p[idx[kept]] >= thr)
            kept++;
    }
    /* softmax over the kept tokens, in double; p becomes exp(x - max) */
    float mx = p[idx[0]];
    double sum = 0;
    for (int j = 0; j < kept; j++) {
        p[idx[j]] = (float)exp((double)p[idx[j]] - mx);
        sum += p[idx[j]];
    }
    if (sm->s.top_p > 0 && sm->s.top_p < 1) {
        double cum = 0;
        int j = 0;
        for (; j < kept; j++) {
            if (cum / sum >= sm->s.top_p) break;
            cum += p[idx[j]];
        }
        kept = j;
        sum = cum;
    }
    double u = rf_rng_double(&sm->rng) * sum, acc = 0;
    for (int j = 0; j < kept; j++) {
        acc += p[idx[j]];
        if (u < acc) return idx[j];
    }
    return idx[kept - 1]; /* u rounded up to the total */
}

/* ---- generation ---- */

void rf_gen_result_free(rf_gen_result *r) {
    if (!r) return;
    free(r->prompt_ids);
    free(r->ids);
    memset(r, 0, sizeof *r);
}

int rf_gen_prompt_ids(const rf_lm *lm, const char *prompt, bool chat, int32_t **ids, int *n) {
    *ids = NULL, *n = 0;
    rf_buf text = RF_BUF_INIT;
    int rc = RF_OK;
    if (chat) {
        rf_chat_msg m = {"user", prompt};
        rc = rf_chat_render(lm->chat_template, &m, 1, true, &text);
    }
    rf_tok_state *ts = rc ? NULL : rf_tok_state_new(lm->tok);
    if (!rc && !ts) rc = RF_ERR_NOMEM;
    rf_tok_encoding e = {0};
    if (!rc)
        rc = chat ? rf_tok_encode(ts, text.data, text.len, false, &e)
                  : rf_tok_encode(ts, prompt, strlen(prompt), true, &e);
    if (!rc && !(*ids = malloc((e.len ? e.len : 1) * sizeof **ids))) rc = RF_ERR_NOMEM;
    for (size_t i = 0; !rc && i < e.len; i++)
        (*ids)[i] = (int32_t)e.ids[i];
    if (!rc) *n = (int)e.len;
    rf_tok_encoding_free(&e);
    rf_tok_state_free(ts);
    rf_buf_free(&text);
    return rc;
}

/* The text of the generated ids[0..n) not handed out yet: decodes them all
 * and returns the part after `emitted`; held back while it ends in U+FFFD (a
 * character the next token may complete) unless final. */
static int next_piece(const rf_lm *lm, const int32_t *ids, int n, bool final, rf_buf *dec,
                      rf_buf *emitted, const char **piece, size_t *len) {
    rf_buf_reset(dec);
    int rc = rf_tok_decode(lm->tok, (const uint32_t *)ids, (size_t)n, true, dec);
    if (rc) return rc;
    *piece = "", *len = 0;
    if (dec->len < emitted->len ||
        (emitted->len && memcmp(dec->data, emitted->data, emitted->len) != 0)) {
        /* the decoder rewrote earlier text: hand out this token's own text */
        rf_buf_reset(dec);
        if ((rc = rf_tok_decode(lm->tok, (const uint32_t *)ids + n - 1, 1, true, dec))) return rc;
        if (!dec->len) return RF_OK;
        *piece = dec->data, *len = dec->len;
        return rf_buf_append(emitted, dec->data, dec->len);
    }
    size_t add = dec->len - emitted->len;
    if (!add) return RF_OK;
    if (!final && add >= 3 && !memcmp(dec->data + dec->len - 3, "\xef\xbf\xbd", 3)) return RF_OK;
    *piece = dec->data + emitted->len, *len = add;
    return rf_buf_append(emitted, *piece, add);
}

int rf_generate_ids(const rf_lm *lm, const int32_t *ids, int n, const rf_gen_opts *o,
                    rf_gen_token_fn cb, void *user, rf_gen_result *res) {
    const rf_causal_dims *d = &lm->dims;
    int max_new = o->max_new_tokens > 0 ? o->max_new_tokens : 64;
    if (res) memset(res, 0, sizeof *res);
    if (n < 1) return rf_fail(RF_ERR_INVALID, "generate: the prompt has no token");
    if (n >= d->max_pos)
        return rf_fail(RF_ERR_RANGE, "generate: the prompt has %d tokens, the model %d positions",
                       n, d->max_pos);
    int cap = (int64_t)n + max_new < d->max_pos ? n + max_new : d->max_pos;
    rf_infer *st = NULL;
    rf_sampler sm = {0};
    rf_buf dec = RF_BUF_INIT, emitted = RF_BUF_INIT;
    float *hidden = malloc((size_t)n * d->C * sizeof(float)),
          *logits = malloc((size_t)d->vocab * sizeof(float));
    int32_t *out = malloc((size_t)max_new * sizeof *out);
    int rc = hidden && logits && out ? RF_OK : RF_ERR_NOMEM, got = 0;
    const char *finish = "length";
    if (!rc) rc = rf_sampler_init(&sm, &o->sampling, d->vocab);
    if (!rc) rc = rf_infer_new(&lm->model, cap, 512, &st);
    if (!rc) rc = rf_infer_forward(st, ids, n, hidden);
    const float *last = hidden + (size_t)(n - 1) * d->C;
    while (!rc) {
        if ((rc = rf_infer_logits(st, last, 1, logits))) break;
        int32_t next = rf_sampler_next(&sm, logits);
        out[got++] = next;
        bool eos = rf_lm_is_eos(lm, next), full = got == max_new || rf_infer_len(st) == cap;
        const char *piece;
        size_t plen;
        if ((rc = next_piece(lm, out, got, eos || full, &dec, &emitted, &piece, &plen))) break;
        if (cb && (rc = cb(user, next, piece, plen, eos ? "eos" : full ? "length" : NULL))) {
            finish = "stopped";
            break;
        }
        if (eos) finish = "eos";
        if (eos || full) break;
        if ((rc = rf_infer_forward(st, &next, 1, hidden))) break;
        last = hidden;
    }
    if (res && (rc == RF_OK || !strcmp(finish, "stopped"))) {
        res->prompt_ids = malloc((size_t)n * sizeof *ids);
        if (res->prompt_ids) memcpy(res->prompt_ids, ids, (size_t)n * sizeof *ids);
        res->n_prompt = n;
        res->ids = out, res->n = got, res->finish = finish;
        out = NULL;
        if (!res->prompt_ids && rc == RF_OK) rc = RF_ERR_NOMEM;
    }
    free(out);
    free(hidden);
    free(logits);
    rf_buf_free(&dec);
    rf_buf_free(&emitted);
    rf_sampler_free(&sm);
    rf_infer_free(st);
    return rc;
}

int rf_generate(const rf_lm *lm, const char *prompt, const rf_gen_opts *o, rf_gen_token_fn cb,
                void *user, rf_gen_result *res) {
    int32_t *ids;
    int n;
    if (res) memset(res, 0, sizeof *res);
    int rc = rf_gen_prompt_ids(lm, prompt, o->chat, &ids, &n);
    if (!rc) rc = rf_generate_ids(lm, ids, n, o, cb, user, res);
    free(ids);
    return rc;
}
