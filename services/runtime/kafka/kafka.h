/* Kafka via librdkafka, for at-least-once stages with exact accounting:
 *
 *   consume a batch -> process -> produce outputs -> rf_kafka_flush == OK
 *                   -> rf_kafka_commit_batch
 *
 * The producer is idempotent (enable.idempotence: acks=all, retries without
 * duplicates or reordering per partition), so an output is either durably in
 * the log or reported failed by the flush. Input offsets are committed only
 * after that, never automatically: a crash between produce and commit
 * replays the batch, which downstream recognises by its (run, stage, seq).
 *
 * Backpressure: at most max_in_flight produced messages wait for their
 * delivery; rf_kafka_produce blocks (serving delivery reports) beyond that.
 *
 * Configuration: bootstrap is KAFKA_BOOTSTRAP (a mock cluster's or a real
 * Kafka's "host:port,..."); `extra` passes any further librdkafka property,
 * e.g. {"security.protocol", "ssl", "ssl.ca.location", "/etc/ca.pem", NULL}. */
#ifndef RF_KAFKA_H
#define RF_KAFKA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rf_kafka_opts {
    const char *bootstrap;
    const char *client_id;     /* NULL: "refinery" */
    int max_in_flight;         /* producer; 0 means 10000 */
    double delivery_timeout_s; /* producer: give up a message after this; 0 means 30 */
    const char *const *extra;  /* NULL-terminated name, value pairs; may be NULL */
} rf_kafka_opts;

/* --- producer --- */

typedef struct rf_kafka_producer rf_kafka_producer;

int rf_kafka_producer_new(const rf_kafka_opts *o, rf_kafka_producer **out);
/* Flushes (up to delivery_timeout_s) and frees. */
void rf_kafka_producer_free(rf_kafka_producer *p);
/* Whether a broker answers: a metadata request within timeout_s. RF_OK, or
 * RF_ERR_IO with librdkafka's reason. Thread-safe (readiness probes). */
int rf_kafka_producer_ping(rf_kafka_producer *p, double timeout_s);
/* Delivery accounting of one unit of work (a batch, a gRPC stream) among
 * several that share a producer from different threads, where a
 * producer-wide flush cannot tell whose message failed. Zero-initialize it;
 * it must outlive its messages' delivery (rf_kafka_wait). */
typedef struct rf_kafka_tracker {
    atomic_llong pending, delivered, failed;
    atomic_int have_error;
    char first_error[256];
} rf_kafka_tracker;

/* Queues one message (copied). Blocks while max_in_flight are undelivered. */
int rf_kafka_produce(rf_kafka_producer *p, const char *topic, const void *key, size_t key_len,
                     const void *value, size_t len);
/* The same, accounted in t (may be NULL). */
int rf_kafka_produce_tracked(rf_kafka_producer *p, rf_kafka_tracker *t, const char *topic,
                             const void *key, size_t key_len, const void *value, size_t len);
/* A rejected record: where it came from, why, and its first bytes. */
typedef struct rf_kafka_reject {
    const char *run_id; /* NULL or "": not pushed into a run */
    const char *doc_id; /* may be NULL */
    const char *source;
    uint64_t line, offset;
    const char *reason;
    const void *excerpt;
    size_t excerpt_len;
} rf_kafka_reject;

/* r as a refinery.v1.Reject protobuf to a rejects topic, keyed by its run id
 * (so that a run's rejects share a partition) or, without one, by the
 * reason; accounted in t (may be NULL). */
int rf_kafka_produce_reject(rf_kafka_producer *p, rf_kafka_tracker *t, const char *topic,
                            const rf_kafka_reject *r);
/* Waits until every message of t is delivered or failed: RF_OK when all were
 * delivered, RF_ERR_IO (first failure in rf_errmsg) otherwise or on timeout. */
int rf_kafka_wait(rf_kafka_producer *p, rf_kafka_tracker *t, double timeout_s);
/* Waits until every queued message is delivered or failed. RF_OK only when
 * all messages produced since the previous flush were delivered; RF_ERR_IO
 * (first failure in rf_errmsg) otherwise, and then the inputs of those
 * messages must not be committed. */
int rf_kafka_flush(rf_kafka_producer *p, double timeout_s);
/* Messages queued and not yet delivered or failed. */
int rf_kafka_in_flight(rf_kafka_producer *p);
int64_t rf_kafka_delivered(const rf_kafka_producer *p);
int64_t rf_kafka_failed(const rf_kafka_producer *p);

/* --- consumer (a member of a consumer group) --- */

typedef struct rf_kafka_consumer rf_kafka_consumer;

typedef struct rf_kafka_msg {
    const char *topic;
    int32_t partition;
    int64_t offset;
    const void *key;
    size_t key_len;
    const void *value;
    size_t len;
} rf_kafka_msg;

/* Records of a partition that were deleted before the group consumed them:
 * offsets [from, to), `to` being the log's start when the consumer found
 * its position (the committed offset, or 0 for a partition the group never
 * committed on) below it. Retention is the usual cause. */
typedef struct rf_kafka_gap {
    char topic[256];
    int32_t partition;
    int64_t from, to;
} rf_kafka_gap;

/* Messages of one poll; valid until rf_kafka_batch_release. */
typedef struct rf_kafka_batch {
    rf_kafka_msg *msgs;
    size_t n;
    void **raw; /* librdkafka messages, owned */
    /* Gaps found since the previous poll (at assignment or at a position out
     * of the log): the consumer resumed at the log's start, so these records
     * are lost to this group, and whoever owns the runs they belonged to must
     * be told before the batch's offsets are committed. */
    rf_kafka_gap *gaps;
    size_t n_gaps;
} rf_kafka_batch;

/* Joins group and subscribes to topics[0..n). A new group starts at the
 * earliest offset. */
int rf_kafka_consumer_new(const rf_kafka_opts *o, const char *group, const char *const *topics,
                          size_t n, rf_kafka_consumer **out);
/* Leaves the group; what was not committed is delivered again to whoever
 * takes the partitions. */
void rf_kafka_consumer_free(rf_kafka_consumer *c);
/* Up to max messages: waits at most timeout_s for the first, then takes what
 * has already arrived. 0 messages on timeout. A partition the group never
 * committed on is read from its start. When the group's committed offset is
 * no longer in the log (records deleted unread), or a partition never
 * committed on no longer starts at 0, reading resumes at the log's start and
 * the skipped range is reported in b->gaps (also logged as an error): never
 * skipped silently. RF_ERR_IO when the committed offset is beyond the log's
 * end (a topic deleted and created again) or the offsets cannot be read. */
int rf_kafka_poll_batch(rf_kafka_consumer *c, size_t max, double timeout_s, rf_kafka_batch *b);
/* Synchronously commits the offsets following the batch's messages. */
int rf_kafka_commit_batch(rf_kafka_consumer *c, const rf_kafka_batch *b);
void rf_kafka_batch_release(rf_kafka_batch *b);
/* Sets refinery_kafka_consumer_lag_messages{consumer,topic,partition}
 * (common/obs.h) for the partitions in b: the high watermark librdkafka last
 * saw in a fetch (no broker round trip) minus the offset after b's last
 * message there. */
void rf_kafka_consumer_observe_lag(rf_kafka_consumer *c, const char *consumer,
                                   const rf_kafka_batch *b);

/* --- loss detection and topics (consumer.c, admin.c) --- */

/* The topics the consumer subscribed to; *topics is owned by c. */
size_t rf_kafka_consumer_topics(const rf_kafka_consumer *c, const char *const **topics);

/* Where a consumer stands on one partition. */
typedef struct rf_kafka_standing {
    int32_t partition;
    bool assigned;     /* to this member of the group */
    int64_t position;  /* the next offset it hands out; -1 when not known */
    int64_t low, high; /* the log's first offset and its end */
} rf_kafka_standing;

/* The standing of c on the partition of topic that messages keyed by key
 * go to, by the producers' partitioner (librdkafka's consistent_random, or
 * the `partitioner` property among the consumer's extra properties): every
 * stage keys its batches by run id, so a run's batches on a topic share
 * that partition. The position is the one after the last message polled,
 * else the committed offset. Queries the brokers (up to timeout_s). */
int rf_kafka_consumer_standing(rf_kafka_consumer *c, const char *topic, const void *key,
                               size_t key_len, double timeout_s, rf_kafka_standing *out);

/* Makes sure topics[0..n) exist (NULL and repeated names are ignored):
 * missing ones are created with `partitions` partitions and the brokers'
 * default replication when create is true (a topic another process created
 * meanwhile is fine); otherwise RF_ERR_NOT_FOUND names the missing ones.
 * Waits up to timeout_s for the brokers. */
int rf_kafka_topics_ensure(const rf_kafka_opts *o, const char *const *topics, size_t n,
                           int partitions, bool create, double timeout_s);

#endif
