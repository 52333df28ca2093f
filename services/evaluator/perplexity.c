/* Strided sliding-window perplexity (see perplexity.h). */
#include "evaluator/perplexity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"
#include "common/utf8.h"

int rf_ppl_windows(int64_t n, int max_len, int stride) {
    int w = 0;
    for (int64_t begin = 0; begin < n; begin += stride) {
        w++;
        if (begin + max_len >= n) break;
    }
    return w;
}

/* e^x for x <= 0 without a libm call, so the loop below vectorizes: the
 * approximation of ops.c's exp_fast (x = n ln2 + r, degree-6 polynomial,
 * 2^n by exponent bits; about 2 ulp). Below -87 it gives e^-87 (1.6e-38),
 * which no sum of a row that holds e^0 notices. */
static inline float exp_le0(float x) {
    float xc = x > -87.0f ? x : -87.0f;
    float n = xc * 1.44269504f + 12582912.0f; /* round to nearest */
    n -= 12582912.0f;
    float r = xc - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } two_n = {.i = ((int32_t)n + 127) << 23};
    return p * two_n.f;
}

/* log(sum_v e^z[v]): the largest logit subtracted, 256-term float partial
 * sums of the exponentials added in double. */
static double row_lse(const float *z, int V) {
    float mx = z[0];
    for (int v = 1; v < V; v++)
        mx = z[v] > mx ? z[v] : mx;
    double s = 0;
    for (int a = 0; a < V; a += 256) {
        int b = a + 256 < V ? a + 256 : V;
        float part = 0;
#pragma omp simd reduction(+ : part)
        for (int v = a; v < b; v++)
            part += exp_le0(z[v] - mx);
        s += part;
    }
    return log(s) + mx;
}

/* *out = the sum of -log p(ids[r + 1] | ids[..r]) over hidden rows r in
 * [r0, r1), head_rows rows of logits at a time; RF_OK or the LM head's
 * error. */
static int nll_rows(rf_infer *st, const float *hidden, const int32_t *ids, int r0, int r1,
                    float *logits, int head_rows, double *out) {
    const rf_causal_dims *d = rf_infer_dims(st);
    int V = d->vocab;
    double sum = 0;
    for (int a = r0; a < r1; a += head_rows) {
        int k = r1 - a < head_rows ? r1 - a : head_rows;
        int rc = rf_infer_logits(st, hidden + (size_t)a * d->C, k, logits);
        if (rc) return rc;
        double part = 0;
#pragma omp parallel for schedule(static) reduction(+ : part)
        for (int r = 0; r < k; r++) {
            const float *z = logits + (size_t)r * V;
            part += row_lse(z, V) - z[ids[a + r + 1]];
        }
        sum += part;
    }
    *out = sum;
    return RF_OK;
}

int rf_perplexity_ids(const rf_lm *lm, const int32_t *ids, int64_t n, const rf_ppl_opts *o,
                      rf_ppl_result *r) {
    memset(r, 0, sizeof *r);
    const rf_causal_dims *d = &lm->dims;
    int max_len = o->max_len > 0 ? o->max_len : d->max_pos;
    if (max_len > d->max_pos)
        return rf_fail(RF_ERR_RANGE, "perplexity: max_len %d exceeds the model's %d positions",
                       max_len, d->max_pos);
    if (max_len < 2) return rf_fail(RF_ERR_RANGE, "perplexity: max_len %d (at least 2)", max_len);
    int stride = o->stride > 0 ? o->stride : (max_len / 2 > 0 ? max_len / 2 : 1);
    int chunk = o->chunk > 0 ? o->chunk : 512, head_rows = o->head_rows > 0 ? o->head_rows : 64;
    if (n < 2)
        return rf_fail(RF_ERR_INVALID, "perplexity: the text has %lld token(s); at least 2 needed",
                       (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= d->vocab)
            return rf_fail(RF_ERR_RANGE, "perplexity: token %lld has id %d (vocabulary %d)",
                           (long long)i, ids[i], d->vocab);
    rf_infer *st;
    int rc = rf_infer_new(&lm->model, max_len, chunk, &st);
    if (rc) return rc;
    float *hidden = malloc((size_t)max_len * d->C * sizeof(float)),
          *logits = malloc((size_t)head_rows * d->vocab * sizeof(float));
    if (!hidden || !logits) rc = RF_ERR_NOMEM;
    int windows = rf_ppl_windows(n, max_len, stride), w = 0;
    int64_t prev_end = 0;
    for (int64_t begin = 0; !rc && begin < n; begin += stride) {
        int64_t end = begin + max_len < n ? begin + max_len : n, trg = end - prev_end;
        int L = (int)(end - begin);
        /* labelled positions: the last trg of the window (all when trg >= L) */
        int first = trg >= L ? 0 : L - (int)trg, valid = L - first;
        /* the loss counts labels 1.. (position k predicted by row k - 1) */
        int r0 = first > 0 ? first - 1 : 0, counted = L - 1 - r0;
        rf_infer_reset(st);
        if ((rc = rf_infer_forward(st, ids + begin, L, hidden))) break;
        if (counted > 0) {
            double nll;
            if ((rc = nll_rows(st, hidden, ids + begin, r0, L - 1, logits, head_rows, &nll))) break;
            r->nll_sum += nll / counted * (valid - 1);
        }
        r->tokens += valid - 1;
        r->scored += counted;
        prev_end = end;
        w++;
        if (o->progress) o->progress(o->user, w, windows);
        if (end == n) break;
    }
    rf_infer_free(st);
    free(hidden);
    free(logits);
    if (rc) return rc;
    if (r->tokens <= 0)
        return rf_fail(RF_ERR_INVALID, "perplexity: no token counted (%lld tokens)", (long long)n);
    r->nll = r->nll_sum / (double)r->tokens;
    r->perplexity = exp(r->nll);
    r->seq_len = n, r->windows = w, r->max_len = max_len, r->stride = stride;
    return RF_OK;
}

int rf_perplexity_text(const rf_lm *lm, const char *text, size_t len, const rf_ppl_opts *o,
                       rf_ppl_result *r) {
    rf_tok_state *ts = rf_tok_state_new(lm->tok);
    if (!ts) return RF_ERR_NOMEM;
    rf_tok_encoding e = {0};
    int rc = rf_tok_encode(ts, text, len, true, &e);
    int32_t *ids = NULL;
    if (!rc && !(ids = malloc((e.len ? e.len : 1) * sizeof *ids))) rc = RF_ERR_NOMEM;
    for (size_t i = 0; !rc && i < e.len; i++)
        ids[i] = (int32_t)e.ids[i];
    if (!rc) rc = rf_perplexity_ids(lm, ids, (int64_t)e.len, o, r);
    free(ids);
    rf_tok_encoding_free(&e);
    rf_tok_state_free(ts);
    return rc;
}

/* The file's text with each CRLF turned into LF. */
static int read_text(const char *path, char **out, size_t *len) {
    char *t;
    size_t n;
    int rc = rf_read_file(path, (size_t)1 << 31, &t, &n);
    if (rc) return rc;
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if (!(t[i] == '\r' && i + 1 < n && t[i + 1] == '\n')) t[j++] = t[i];
    t[j] = 0;
    if (!rf_utf8_valid(t, j)) {
        size_t at = rf_utf8_first_invalid(t, j);
        free(t);
        return rf_fail(RF_ERR_INVALID, "%s: not UTF-8 text (first bad byte at %zu)", path, at);
    }
    *out = t, *len = j;
    return RF_OK;
}

int rf_perplexity_run(const char *model_path, const char *data_path, const rf_ppl_opts *o,
                      const char *report_path, rf_buf *json) {
    double t0 = rf_now();
    rf_lm *lm = NULL;
    char *text = NULL;
    size_t len = 0;
    rf_ppl_result r;
    int rc = read_text(data_path, &text, &len);
    if (!rc) rc = rf_lm_load_adapter(model_path, o ? o->adapter : NULL, &lm);
    if (!rc && (rc = rf_perplexity_text(lm, text, len, o, &r)))
        rc = rf_fail_ctx(rc, "%s on %s", model_path, data_path);
    free(text);
    rf_lm_free(lm);
    if (rc) return rc;
    rf_buf b = RF_BUF_INIT;
    rc = rf_buf_puts(&b, "{\"task\": \"lm\", \"model\": ");
    if (!rc) rc = rf_buf_append_json_str(&b, model_path, strlen(model_path));
    if (!rc && o && o->adapter) {
        rc = rf_buf_puts(&b, ", \"adapter\": ");
        if (!rc) rc = rf_buf_append_json_str(&b, o->adapter, strlen(o->adapter));
    }
    if (!rc) rc = rf_buf_puts(&b, ", \"data\": ");
    if (!rc) rc = rf_buf_append_json_str(&b, data_path, strlen(data_path));
    if (!rc)
        rc = rf_buf_printf(&b,
                           ", \"perplexity\": %.17g, \"nll\": %.17g, \"tokens\": %lld, "
                           "\"scored\": %lld, \"seq_len\": %lld, \"windows\": %d, \"max_len\": %d, "
                           "\"stride\": %d, \"nll_sum\": %.17g, \"seconds\": %.3f}\n",
                           r.perplexity, r.nll, (long long)r.tokens, (long long)r.scored,
                           (long long)r.seq_len, r.windows, r.max_len, r.stride, r.nll_sum,
                           rf_now() - t0);
    if (!rc && report_path && (rc = rf_write_file_atomic(report_path, b.data, b.len)))
        rc = rf_fail_ctx(rc, "eval: cannot write %s", report_path);
    if (!rc && json) rc = rf_buf_append(json, b.data, b.len);
    rf_buf_free(&b);
    return rc;
}
