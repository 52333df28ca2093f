/* The tokenizer's job on a batch: see split_batch.h. */
#include "tokenizer/split_batch.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/obs.h"
#include "common/hash.h"
#include "tokenizer/batch.h"
#include "tokenizer/chat.h"

struct rf_tok_splitter {
    rf_tok_split_opts o;
    rf_tok_state **states; /* one per thread */
    rf_tok_result *res;    /* reused from batch to batch */
    size_t cap;
};

int rf_tok_splitter_new(const rf_tokenizer *tok, const rf_tok_split_opts *o,
                        rf_tok_splitter **out) {
    *out = NULL;
    if (o->threads < 1) return rf_fail(RF_ERR_INVALID, "tokenizer: threads must be >= 1");
    rf_tok_splitter *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->o = *o;
    if (!(s->states = calloc((size_t)o->threads, sizeof *s->states))) {
        free(s);
        return RF_ERR_NOMEM;
    }
    for (int t = 0; t < o->threads; t++)
        if (!(s->states[t] = rf_tok_state_new(tok))) {
            rf_tok_splitter_free(s);
            return RF_ERR_NOMEM;
        }
    *out = s;
    return RF_OK;
}

void rf_tok_splitter_free(rf_tok_splitter *s) {
    if (!s) return;
    for (size_t i = 0; i < s->cap; i++) {
        rf_tok_encoding_free(&s->res[i].enc);
        free(s->res[i].mask);
    }
    free(s->res);
    for (int t = 0; t < s->o.threads; t++)
        rf_tok_state_free(s->states[t]);
    free(s->states);
    free(s);
}

uint64_t rf_tok_splitter_repaired(const rf_tok_splitter *s) {
    uint64_t n = 0;
    for (int t = 0; t < s->o.threads; t++)
        n += rf_tok_state_repaired(s->states[t]);
    return n;
}

static int reserve(rf_tok_splitter *s, size_t n) {
    if (n <= s->cap) return RF_OK;
    rf_tok_result *r = realloc(s->res, n * sizeof *r);
    if (!r) return RF_ERR_NOMEM;
    memset(r + s->cap, 0, (n - s->cap) * sizeof *r);
    s->res = r;
    s->cap = n;
    return RF_OK;
}

/* One document on the calling thread's state; 0 or RF_ERR_NOMEM. */
static int one(rf_tok_splitter *s, rf_tok_state *st, const rf_tok_doc *d, rf_tok_result *r) {
    r->reject = NULL;
    r->detail[0] = '\0';
    r->split = RF_SPLIT_TRAIN;
    r->cluster = 0;
    r->enc.len = 0;
    free(r->mask);
    r->mask = NULL;
    r->chat_merged = false;
    if (!d->text || d->text_len == 0) {
        r->reject = RF_TOK_REJECT_NO_TEXT;
        return RF_OK;
    }
    int rc;
    if (d->messages) {
        rf_chat_msg *msgs;
        size_t nm;
        char *store;
        rc = rf_chat_msgs_parse(d->messages, d->messages_len, &msgs, &nm, &store);
        if (!rc)
            rc = rf_chat_encode(st, s->o.chat_template, msgs, nm, &r->enc, &r->mask,
                                &r->chat_merged);
        free(msgs);
        free(store);
        if (rc == RF_ERR_NOMEM) return rc;
        if (rc) {
            r->enc.len = 0;
            r->reject = RF_TOK_REJECT_CHAT;
            snprintf(r->detail, sizeof r->detail, "%s", rf_errmsg());
            return RF_OK;
        }
        if (s->o.max_length && r->enc.len > s->o.max_length) {
            snprintf(r->detail, sizeof r->detail, "%zu tokens, max_length %zu", r->enc.len,
                     s->o.max_length);
            r->enc.len = 0;
            r->reject = RF_TOK_REJECT_LONG;
            return RF_OK;
        }
    } else {
        rc = rf_tok_encode(st, d->text, d->text_len, s->o.add_special, &r->enc);
        if (rc == RF_ERR_NOMEM) return rc;
        if (rc) {
            r->enc.len = 0;
            r->reject = RF_TOK_REJECT_ENCODE;
            snprintf(r->detail, sizeof r->detail, "%s", rf_errmsg());
            return RF_OK;
        }
    }
    const char *id = d->id ? d->id : "";
    size_t id_len = strlen(id);
    r->cluster = d->cluster ? d->cluster : rf_hash64(id, id_len, 0);
    r->split = rf_split_is_eval(d->cluster, id, id_len, s->o.eval_fraction, s->o.seed)
                   ? RF_SPLIT_EVAL
                   : RF_SPLIT_TRAIN;
    return RF_OK;
}

int rf_tok_split_batch(rf_tok_splitter *s, const rf_tok_doc *docs, size_t n,
                       const rf_tok_result **out) {
    int rc = reserve(s, n);
    if (rc) return rc;
    int failed = 0;
    if (s->o.threads == 1) {
        for (size_t i = 0; i < n && !failed; i++)
            failed = one(s, s->states[0], &docs[i], &s->res[i]);
    } else {
#pragma omp parallel for num_threads(s->o.threads) schedule(dynamic, 16)
        for (size_t i = 0; i < n; i++) {
            int r = one(s, s->states[omp_get_thread_num()], &docs[i], &s->res[i]);
            if (r) {
#pragma omp atomic write
                failed = r;
            }
        }
    }
    if (failed) return failed;
    *out = s->res;
    return RF_OK;
}

void rf_tok_result_count(const rf_tok_result *r, rf_stats *stats) {
    if (!r->reject || !stats) return;
    char name[64];
    snprintf(name, sizeof name, "tokenizer.rejected.%s", r->reject);
    rf_stats_add(stats, name, 1);
    rf_obs_docs_rejected("tokenizer", r->reject, 1);
}
