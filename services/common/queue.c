#include "common/queue.h"

#include <pthread.h>
#include <stdlib.h>

#include "common/error.h"

struct rf_queue {
    pthread_mutex_t lock;
    pthread_cond_t not_full, not_empty;
    void **items;
    size_t cap, head, count;
    int closed;
};

rf_queue *rf_queue_new(size_t capacity) {
    rf_queue *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->cap = capacity ? capacity : 1;
    q->items = calloc(q->cap, sizeof *q->items);
    if (!q->items) {
        free(q);
        return NULL;
    }
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->not_full, NULL);
    pthread_cond_init(&q->not_empty, NULL);
    return q;
}

void rf_queue_free(rf_queue *q) {
    if (!q) return;
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->not_full);
    pthread_cond_destroy(&q->not_empty);
    free(q->items);
    free(q);
}

int rf_queue_push(rf_queue *q, void *item) {
    pthread_mutex_lock(&q->lock);
    while (q->count == q->cap && !q->closed)
        pthread_cond_wait(&q->not_full, &q->lock);
    if (q->closed) {
        pthread_mutex_unlock(&q->lock);
        return RF_ERR_CANCELED;
    }
    q->items[(q->head + q->count) % q->cap] = item;
    q->count++;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
    return RF_OK;
}

int rf_queue_pop(rf_queue *q, void **item) {
    pthread_mutex_lock(&q->lock);
    while (q->count == 0 && !q->closed)
        pthread_cond_wait(&q->not_empty, &q->lock);
    if (q->count == 0) {
        pthread_mutex_unlock(&q->lock);
        *item = NULL;
        return 0;
    }
    *item = q->items[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    pthread_cond_signal(&q->not_full);
    pthread_mutex_unlock(&q->lock);
    return 1;
}

void rf_queue_close(rf_queue *q) {
    pthread_mutex_lock(&q->lock);
    q->closed = 1;
    pthread_cond_broadcast(&q->not_full);
    pthread_cond_broadcast(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
}

size_t rf_queue_depth(rf_queue *q) {
    pthread_mutex_lock(&q->lock);
    size_t n = q->count;
    pthread_mutex_unlock(&q->lock);
    return n;
}
