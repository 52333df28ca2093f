/* Generated-answer accuracy: see answers.h. */
#include "evaluator/answers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"
#include "evaluator/generate.h"
#include "tokenizer/shard.h"

#define TOP_ANSWERS 8
#define EXAMPLES    3

/* text trimmed of white space and with ASCII letters lowered, in place */
static void normalize(rf_buf *b) {
    if (!b->len) return; /* data may be NULL */
    size_t i = 0, n = b->len;
    while (i < n &&
           (b->data[i] == ' ' || b->data[i] == '\n' || b->data[i] == '\t' || b->data[i] == '\r'))
        i++;
    while (n > i && (b->data[n - 1] == ' ' || b->data[n - 1] == '\n' || b->data[n - 1] == '\t' ||
                     b->data[n - 1] == '\r'))
        n--;
    memmove(b->data, b->data + i, n - i);
    b->len = n - i;
    for (size_t k = 0; k < b->len; k++)
        if (b->data[k] >= 'A' && b->data[k] <= 'Z') b->data[k] = (char)(b->data[k] - 'A' + 'a');
}

typedef struct tally {
    char **text;
    size_t *count, n, cap;
} tally;

static int tally_add(tally *t, const char *s, size_t len) {
    for (size_t i = 0; i < t->n; i++)
        if (strlen(t->text[i]) == len && memcmp(t->text[i], s, len) == 0) return t->count[i]++, 0;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        char **tx = realloc(t->text, cap * sizeof *tx);
        if (tx) t->text = tx;
        size_t *c = realloc(t->count, cap * sizeof *c);
        if (c) t->count = c;
        if (!tx || !c) return RF_ERR_NOMEM;
        t->cap = cap;
    }
    if (!(t->text[t->n] = strndup(s, len))) return RF_ERR_NOMEM;
    t->count[t->n++] = 1;
    return 0;
}

static void tally_free(tally *t) {
    for (size_t i = 0; i < t->n; i++)
        free(t->text[i]);
    free(t->text);
    free(t->count);
}

static int decode(const rf_lm *lm, const int32_t *ids, int n, rf_buf *out) {
    rf_buf_reset(out);
    uint32_t *u = malloc((n ? (size_t)n : 1) * sizeof *u);
    if (!u) return RF_ERR_NOMEM;
    for (int i = 0; i < n; i++)
        u[i] = (uint32_t)ids[i];
    int rc = rf_tok_decode(lm->tok, u, (size_t)n, true, out);
    free(u);
    if (!rc) normalize(out);
    return rc;
}

int rf_lm_answers(const rf_lm *lm, const char *prefix, int max_n, rf_buf *json, rf_answers *out) {
    memset(out, 0, sizeof *out);
    double t0 = rf_now();
    char path[4200];
    snprintf(path, sizeof path, "%s.mask", prefix);
    rf_shard *sh = NULL;
    char *mask = NULL;
    size_t mlen = 0;
    int rc = rf_read_file(path, (size_t)1 << 40, &mask, &mlen);
    if (rc) return rf_fail(RF_ERR_NOT_FOUND, "answers: %s: no loss mask (not SFT data?)", path);
    if ((rc = rf_shard_open(prefix, &sh))) {
        free(mask);
        return rc;
    }
    const rf_shard_info *info = rf_shard_get_info(sh);
    if (mlen != info->n_tokens)
        rc = rf_fail(RF_ERR_CORRUPT, "answers: %s holds %zu bytes for %llu tokens", path, mlen,
                     (unsigned long long)info->n_tokens);
    uint64_t start = 0;
    int32_t *ids = NULL;
    size_t cap = 0;
    rf_buf ref = RF_BUF_INIT, ans = RF_BUF_INIT, ex = RF_BUF_INIT;
    tally ta = {0};
    int examples = 0;
    for (uint64_t i = 0; !rc && i < info->n_seqs && (max_n <= 0 || out->n < (size_t)max_n); i++) {
        rf_shard_seq q;
        if ((rc = rf_shard_get(sh, i, &q))) break;
        const uint8_t *m = (const uint8_t *)mask + start;
        start += q.len;
        uint32_t p = 0, e;
        while (p < q.len && !m[p])
            p++;
        for (e = p; e < q.len && m[e] && !rf_lm_is_eos(lm, (int32_t)q.ids[e]); e++)
            ;
        if (p == 0 || e == p) {
            out->skipped++;
            continue;
        }
        if (q.len > cap) {
            int32_t *b = realloc(ids, q.len * sizeof *b);
            if (!b) {
                rc = RF_ERR_NOMEM;
                break;
            }
            ids = b, cap = q.len;
        }
        for (uint32_t k = 0; k < q.len; k++)
            ids[k] = (int32_t)q.ids[k];
        rf_gen_opts go = {.max_new_tokens = (int)(e - p) + 4};
        rf_gen_result res = {0};
        if ((rc = rf_generate_ids(lm, ids, (int)p, &go, NULL, NULL, &res))) break;
        int n = res.n;
        while (n > 0 && rf_lm_is_eos(lm, res.ids[n - 1]))
            n--;
        rc = decode(lm, ids + p, (int)(e - p), &ref);
        if (!rc) rc = decode(lm, res.ids, n, &ans);
        rf_gen_result_free(&res);
        if (rc) break;
        out->n++;
        bool ok = ref.len == ans.len && (!ref.len || memcmp(ref.data, ans.data, ref.len) == 0);
        out->correct += ok;
        rc = tally_add(&ta, ans.data ? ans.data : "", ans.len);
        if (!rc && examples < EXAMPLES) {
            rc = rf_buf_puts(&ex, examples++ ? ",{\"reference\":" : "{\"reference\":");
            if (!rc) rc = rf_buf_append_json_str(&ex, ref.data ? ref.data : "", ref.len);
            if (!rc) rc = rf_buf_puts(&ex, ",\"answer\":");
            if (!rc) rc = rf_buf_append_json_str(&ex, ans.data ? ans.data : "", ans.len);
            if (!rc) rc = rf_buf_printf(&ex, ",\"correct\":%s}", ok ? "true" : "false");
        }
    }
    if (!rc && out->n == 0)
        rc = rf_fail(RF_ERR_INVALID,
                     "answers: %s holds no conversation with a prompt and an answer", prefix);
    out->accuracy = out->n ? (double)out->correct / (double)out->n : 0;
    out->seconds = rf_now() - t0;
    if (!rc)
        rc = rf_buf_printf(json,
                           "{\"accuracy\":%.6f,\"n\":%zu,\"correct\":%zu,\"skipped\":%zu,"
                           "\"seconds\":%.3f,\"answers\":{",
                           out->accuracy, out->n, out->correct, out->skipped, out->seconds);
    for (int k = 0; !rc && k < TOP_ANSWERS; k++) { /* the most frequent, in order */
        size_t best = ta.n;
        for (size_t j = 0; j < ta.n; j++)
            if (ta.count[j] && (best == ta.n || ta.count[j] > ta.count[best])) best = j;
        if (best == ta.n) break;
        if (k) rc = rf_buf_putc(json, ',');
        if (!rc) rc = rf_buf_append_json_str(json, ta.text[best], strlen(ta.text[best]));
        if (!rc) rc = rf_buf_printf(json, ":%zu", ta.count[best]);
        ta.count[best] = 0;
    }
    if (!rc) rc = rf_buf_puts(json, "},\"examples\":[");
    if (!rc && ex.len) rc = rf_buf_append(json, ex.data, ex.len);
    if (!rc) rc = rf_buf_puts(json, "]}");
    tally_free(&ta);
    rf_buf_free(&ref);
    rf_buf_free(&ans);
    rf_buf_free(&ex);
    free(ids);
    free(mask);
    rf_shard_close(sh);
    return rc;
}
