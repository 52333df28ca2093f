/* Inference on a checkpoint folder, and the cache of loaded folders. */
#include "evaluator/classifier.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "evaluator/predict.h"
#include "tokenizer/tokenizer.h"
#include "trainer/model.h"

struct rf_classifier {
    rf_bert *model;
    rf_tokenizer *tok;
    pthread_mutex_t lock; /* forward passes take turns on model's buffers */
    char *dir;
    int refs;      /* cache: holders, plus one while cached */
    uint64_t used; /* cache: last use, for eviction */
};

int rf_classifier_load(const char *dir, int max_len, rf_classifier **out) {
    rf_classifier *c = calloc(1, sizeof *c);
    if (!c) return RF_ERR_NOMEM;
    pthread_mutex_init(&c->lock, NULL);
    int rc = (c->dir = strdup(dir)) ? RF_OK : RF_ERR_NOMEM;
    const rf_backend *be = NULL;
    if (!rc) rc = rf_backend_for(NULL, &be); /* Classify serves from the CPU */
    if (!rc) rc = rf_bert_load(dir, 0, 0, be, &c->model);
    if (!rc && (rc = rf_tokenizer_load(dir, &c->tok))) rc = rf_fail_ctx(rc, "tokenizer of %s", dir);
    if (rc) {
        rf_classifier_free(c);
        return rc;
    }
    int cap = c->model->cfg.max_position;
    if (max_len <= 0 || max_len > cap) max_len = cap;
    rf_tokenizer_set_truncation(c->tok, (size_t)max_len, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
    rf_tokenizer_set_padding(c->tok, false, 0, 0, 0, 0, RF_SIDE_RIGHT);
    *out = c;
    return RF_OK;
}

void rf_classifier_free(rf_classifier *c) {
    if (!c) return;
    rf_bert_free(c->model);
    rf_tokenizer_free(c->tok);
    pthread_mutex_destroy(&c->lock);
    free(c->dir);
    free(c);
}

int rf_classifier_num_labels(const rf_classifier *c) {
    return c->model->cfg.num_labels;
}

/* Sequences idx[0..B) of d through the model (forward passes on one
 * classifier take turns); each one's label and probabilities go to its own
 * index in labels and probs. */
static int forward(rf_classifier *c, const rf_dataset *d, const size_t *idx, int B,
                   rf_batch_buf *bb, int32_t *pred, float *p, int32_t *labels, float *probs) {
    int K = c->model->cfg.num_labels;
    pthread_mutex_lock(&c->lock);
    int rc = rf_predict_batch(c->model, d, idx, B, bb, pred, p, NULL);
    pthread_mutex_unlock(&c->lock);
    for (int b = 0; b < B && !rc; b++) {
        labels[idx[b]] = pred[b];
        memcpy(probs + idx[b] * K, p + (size_t)b * K, (size_t)K * sizeof *probs);
    }
    return rc;
}

typedef struct by_len {
    size_t len, i;
} by_len;

static int cmp_len(const void *a, const void *b) {
    const by_len *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

int rf_classifier_run(rf_classifier *c, const char *const *texts, size_t n, int batch_size,
                      int32_t *labels, float *probs) {
    if (batch_size < 1) batch_size = 32;
    int K = c->model->cfg.num_labels;
    rf_tok_state *st = rf_tok_state_new(c->tok);
    rf_tok_encoding enc = {0};
    rf_dataset d = {0};
    rf_batch_buf bb = {0};
    by_len *order = calloc(n + 1, sizeof *order);
    size_t *idx = calloc(n + 1, sizeof *idx);
    int32_t *pred = calloc((size_t)batch_size, sizeof *pred);
    float *p = calloc((size_t)batch_size * K, sizeof *p);
    int rc = st && order && idx && pred && p ? RF_OK : RF_ERR_NOMEM;
    for (size_t i = 0; i < n && !rc; i++) {
        if ((rc = rf_tok_encode(st, texts[i], strlen(texts[i]), true, &enc)))
            rc = rf_fail_ctx(rc, "text %zu", i);
        else /* sequence i of d, without a label */
            rc = rf_dataset_add(&d, enc.ids, enc.len, -1);
        order[i] = (by_len){enc.len, i};
    }
    /* Batches of similar lengths: little of each is padding. */
    if (!rc) qsort(order, n, sizeof *order, cmp_len);
    for (size_t i = 0; i < n; i++)
        idx[i] = order[i].i;
    for (size_t i = 0; i < n && !rc; i += (size_t)batch_size) {
        int B = n - i < (size_t)batch_size ? (int)(n - i) : batch_size;
        rc = forward(c, &d, idx + i, B, &bb, pred, p, labels, probs);
    }
    rf_tok_encoding_free(&enc);
    rf_dataset_free(&d);
    rf_batch_buf_free(&bb);
    free(order);
    free(idx);
    free(pred);
    free(p);
    rf_tok_state_free(st);
    return rc;
}

/* ---- cache ---- */

struct rf_classifier_cache {
    pthread_mutex_t lock;
    int cap, max_len;
    rf_classifier **slots; /* [cap], NULL when free */
    uint64_t tick;
    int64_t loads;
};

int rf_classifier_cache_new(int cap, int max_len, rf_classifier_cache **out) {
    if (cap < 1) return rf_fail(RF_ERR_INVALID, "classifier cache: capacity %d", cap);
    rf_classifier_cache *cc = calloc(1, sizeof *cc);
    if (!cc || !(cc->slots = calloc((size_t)cap, sizeof *cc->slots))) {
        free(cc);
        return RF_ERR_NOMEM;
    }
    pthread_mutex_init(&cc->lock, NULL);
    cc->cap = cap;
    cc->max_len = max_len;
    *out = cc;
    return RF_OK;
}

static void unref(rf_classifier *c) {
    if (--c->refs == 0) rf_classifier_free(c);
}

void rf_classifier_cache_free(rf_classifier_cache *cc) {
    if (!cc) return;
    for (int i = 0; i < cc->cap; i++)
        if (cc->slots[i]) unref(cc->slots[i]);
    pthread_mutex_destroy(&cc->lock);
    free(cc->slots);
    free(cc);
}

int rf_classifier_cache_get(rf_classifier_cache *cc, const char *dir, rf_classifier **out) {
    pthread_mutex_lock(&cc->lock);
    int rc = RF_OK, slot = 0;
    rf_classifier *c = NULL;
    for (int i = 0; i < cc->cap && !c; i++)
        if (cc->slots[i] && !strcmp(cc->slots[i]->dir, dir)) c = cc->slots[i];
    if (!c) {
        /* Loaded under the lock: concurrent misses on one folder load it once. */
        if (!(rc = rf_classifier_load(dir, cc->max_len, &c))) {
            cc->loads++;
            for (int i = 0; i < cc->cap; i++) {
                if (!cc->slots[i]) {
                    slot = i;
                    break;
                }
                if (cc->slots[i]->used < cc->slots[slot]->used) slot = i;
            }
            if (cc->slots[slot]) unref(cc->slots[slot]);
            cc->slots[slot] = c;
            c->refs = 1;
        }
    }
    if (c) {
        c->refs++;
        c->used = ++cc->tick;
        *out = c;
    }
    pthread_mutex_unlock(&cc->lock);
    return rc;
}

void rf_classifier_cache_release(rf_classifier_cache *cc, rf_classifier *c) {
    if (!c) return;
    pthread_mutex_lock(&cc->lock);
    unref(c);
    pthread_mutex_unlock(&cc->lock);
}

int64_t rf_classifier_cache_loads(rf_classifier_cache *cc) {
    pthread_mutex_lock(&cc->lock);
    int64_t n = cc->loads;
    pthread_mutex_unlock(&cc->lock);
    return n;
}
