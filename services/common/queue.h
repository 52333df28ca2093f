/* A bounded blocking FIFO of pointers between threads: push blocks while full,
 * pop blocks while empty. Closing wakes everyone; pop drains what is left. */
#ifndef RF_QUEUE_H
#define RF_QUEUE_H

#include <stddef.h>

typedef struct rf_queue rf_queue;

rf_queue *rf_queue_new(size_t capacity);
void rf_queue_free(rf_queue *q); /* the queue must be empty or items leaked */
/* 0 on success, RF_ERR_CANCELED if the queue was closed (item not taken). */
int rf_queue_push(rf_queue *q, void *item);
/* 1 with *item, 0 when closed and drained. */
int rf_queue_pop(rf_queue *q, void **item);
void rf_queue_close(rf_queue *q);
size_t rf_queue_depth(rf_queue *q);

#endif
