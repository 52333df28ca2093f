/* Inference on a checkpoint folder, and the cache of loaded folders. */
#include "evaluator/classifier.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/lru.h"
#include "evaluator/predict.h"
#include "tokenizer/tokenizer.h"
#include "trainer/model.h"

struct rf_classifier {
    rf_bert *model;
    rf_tokenizer *tok;
    pthread_mutex_t lock; /* forward passes take turns on model's buffers */
    char *dir;
    rf_lru_entry lru; /* the cache's bookkeeping */
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
    rf_lru *lru;
    int max_len;
};

static rf_classifier *of(rf_lru_entry *e) {
    return (rf_classifier *)((char *)e - offsetof(rf_classifier, lru));
}

static void free_entry(rf_lru_entry *e) {
    rf_classifier_free(of(e));
}

struct load_arg {
    const char *dir;
    int max_len;
};

static int load_entry(void *arg, rf_lru_entry **out) {
    const struct load_arg *a = arg;
    rf_classifier *c;
    int rc = rf_classifier_load(a->dir, a->max_len, &c);
    if (!rc) *out = &c->lru;
    return rc;
}

int rf_classifier_cache_new(int cap, int max_len, rf_classifier_cache **out) {
    rf_classifier_cache *cc = calloc(1, sizeof *cc);
    if (!cc) return RF_ERR_NOMEM;
    int rc = rf_lru_new(cap, free_entry, &cc->lru);
    if (rc) {
        free(cc);
        return rc == RF_ERR_INVALID ? rf_fail(rc, "classifier cache: capacity %d", cap) : rc;
    }
    cc->max_len = max_len;
    *out = cc;
    return RF_OK;
}

void rf_classifier_cache_free(rf_classifier_cache *cc) {
    if (!cc) return;
    rf_lru_free(cc->lru);
    free(cc);
}

int rf_classifier_cache_get(rf_classifier_cache *cc, const char *dir, rf_classifier **out) {
    struct load_arg a = {dir, cc->max_len};
    rf_lru_entry *e;
    int rc = rf_lru_get(cc->lru, dir, load_entry, &a, &e);
    *out = rc ? NULL : of(e);
    return rc;
}

void rf_classifier_cache_release(rf_classifier_cache *cc, rf_classifier *c) {
    if (c) rf_lru_release(cc->lru, &c->lru);
}

int64_t rf_classifier_cache_loads(rf_classifier_cache *cc) {
    return rf_lru_loads(cc->lru);
}
