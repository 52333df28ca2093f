/* Consumer-group member with manual, synchronous offset commits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/obs.h"
#include "runtime/kafka/conf.h"
#include "runtime/kafka/kafka.h"

struct rf_kafka_consumer {
    rd_kafka_t *rk;
};

/* With auto.offset.reset=error librdkafka stops a partition whose position
 * is not in the log and says so in a poll. Partitions the group never
 * committed on are given their start explicitly (rebalance), so this means
 * that the committed offset is gone: records were deleted before this group
 * read them (retention, a truncated log). That input is lost, and the
 * consumer fails rather than skip ahead. */
static int offset_reset(rf_kafka_consumer *c, const rd_kafka_message_t *m) {
    if (!m->rkt) return rf_fail(RF_ERR_IO, "kafka consumer: %s", rd_kafka_message_errstr(m));
    const char *topic = rd_kafka_topic_name(m->rkt);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, m->partition);
    rd_kafka_resp_err_t e = rd_kafka_committed(c->rk, l, 10000);
    long long committed = e ? -1 : (long long)l->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(l);
    if (committed < 0)
        return rf_fail(RF_ERR_IO,
                       "kafka consumer: %s [%d]: no start position (the committed offsets "
                       "could not be read at assignment); a restart retries",
                       topic, (int)m->partition);
    return rf_fail(RF_ERR_IO,
                   "kafka consumer: %s [%d]: the position is out of the log, committed offset "
                   "%lld (records deleted before this group consumed them): input lost",
                   topic, (int)m->partition, committed);
}

/* Assignments start at the committed offset, or at the beginning of a
 * partition the group never committed on (what auto.offset.reset=earliest
 * did, without its silent jump when a committed offset is out of range). */
static void rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *parts, void *opaque) {
    int cooperative = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        if (rd_kafka_committed(rk, parts, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR)
            for (int i = 0; i < parts->cnt; i++)
                if (parts->elems[i].offset == RD_KAFKA_OFFSET_INVALID)
                    parts->elems[i].offset = RD_KAFKA_OFFSET_BEGINNING;
        /* else: librdkafka reads the committed offsets itself; a partition
         * without one then fails in offset_reset, and a restart retries. */
        if (cooperative) {
            rd_kafka_error_t *e = rd_kafka_incremental_assign(rk, parts);
            if (e) {
                rf_warn("kafka", "consumer: assign: %s", rd_kafka_error_string(e));
                rd_kafka_error_destroy(e);
            }
        } else {
            rd_kafka_assign(rk, parts);
        }
    } else if (cooperative) {
        rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, parts);
        if (e) rd_kafka_error_destroy(e);
    } else {
        rd_kafka_assign(rk, NULL);
    }
}

int rf_kafka_consumer_new(const rf_kafka_opts *o, const char *group, const char *const *topics,
                          size_t n, rf_kafka_consumer **out) {
    *out = NULL;
    if (!group || !*group || n == 0)
        return rf_fail(RF_ERR_INVALID, "kafka consumer: needs a group and topics");
    /* clang-format off */
    const char *const fixed[] = {
        "group.id", group,
        "enable.auto.commit", "false", /* offsets move only in commit_batch */
        "enable.auto.offset.store", "false",
        "auto.offset.reset", "error", /* see rebalance() and offset_reset() */
        "enable.partition.eof", "false",
        NULL,
    };
    /* clang-format on */
    /* A member that died loses its partitions after the session timeout:
     * 10 s rather than librdkafka's 45 s, so that a restarted stage resumes soon. */
    const char *const defaults[] = {"session.timeout.ms", "10000", "heartbeat.interval.ms", "1000",
                                    NULL};
    rd_kafka_conf_t *conf;
    int rc = kafka_conf(o, defaults, fixed, &conf);
    if (rc < 0) return rc;
    rd_kafka_conf_set_rebalance_cb(conf, rebalance);
    rf_kafka_consumer *c = calloc(1, sizeof *c);
    if (!c) {
        rd_kafka_conf_destroy(conf);
        return RF_ERR_NOMEM;
    }
    char err[256];
    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!c->rk) {
        rd_kafka_conf_destroy(conf);
        free(c);
        return rf_fail(RF_ERR_INVALID, "kafka consumer: %s", err);
    }
    rd_kafka_poll_set_consumer(c->rk);
    rd_kafka_topic_partition_list_t *subs = rd_kafka_topic_partition_list_new((int)n);
    for (size_t i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(subs, topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(c->rk, subs);
    rd_kafka_topic_partition_list_destroy(subs);
    if (e) {
        rf_kafka_consumer_free(c);
        return rf_fail(RF_ERR_INVALID, "kafka subscribe: %s", rd_kafka_err2str(e));
    }
    *out = c;
    return RF_OK;
}

void rf_kafka_consumer_free(rf_kafka_consumer *c) {
    if (!c) return;
    rd_kafka_consumer_close(c->rk);
    rd_kafka_destroy(c->rk);
    free(c);
}

void rf_kafka_batch_release(rf_kafka_batch *b) {
    for (size_t i = 0; i < b->n; i++)
        rd_kafka_message_destroy(b->raw[i]);
    free(b->raw);
    free(b->msgs);
    memset(b, 0, sizeof *b);
}

int rf_kafka_poll_batch(rf_kafka_consumer *c, size_t max, double timeout_s, rf_kafka_batch *b) {
    memset(b, 0, sizeof *b);
    if (max == 0) return RF_OK;
    b->raw = calloc(max, sizeof *b->raw);
    b->msgs = calloc(max, sizeof *b->msgs);
    if (!b->raw || !b->msgs) {
        rf_kafka_batch_release(b);
        return RF_ERR_NOMEM;
    }
    int wait_ms = (int)(timeout_s * 1000);
    while (b->n < max) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, b->n ? 0 : wait_ms);
        if (!m) break;
        if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET) {
            int rc = offset_reset(c, m);
            rd_kafka_message_destroy(m);
            if (rc < 0) {
                rf_kafka_batch_release(b);
                return rc;
            }
            if (b->n) break;
            continue;
        }
        if (m->err) {
            /* Broker and transport trouble is retried by librdkafka: report
             * and go on; anything fatal ends the batch with an error. */
            int fatal = m->err == RD_KAFKA_RESP_ERR__FATAL;
            rf_warn("kafka", "consumer: %s", rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            if (fatal) {
                rf_kafka_batch_release(b);
                return rf_fail(RF_ERR_IO, "kafka consumer: fatal error");
            }
            if (b->n) break;
            continue;
        }
        b->raw[b->n] = m;
        b->msgs[b->n] = (rf_kafka_msg){
            .topic = rd_kafka_topic_name(m->rkt),
            .partition = m->partition,
            .offset = m->offset,
            .key = m->key,
            .key_len = m->key_len,
            .value = m->payload,
            .len = m->len,
        };
        b->n++;
    }
    return RF_OK;
}

int rf_kafka_commit_batch(rf_kafka_consumer *c, const rf_kafka_batch *b) {
    if (b->n == 0) return RF_OK;
    rd_kafka_topic_partition_list_t *offs = rd_kafka_topic_partition_list_new((int)b->n);
    for (size_t i = 0; i < b->n; i++) {
        const rf_kafka_msg *m = &b->msgs[i];
        rd_kafka_topic_partition_t *tp =
            rd_kafka_topic_partition_list_find(offs, m->topic, m->partition);
        if (!tp) tp = rd_kafka_topic_partition_list_add(offs, m->topic, m->partition);
        /* The committed offset is the next one to read. */
        if (m->offset + 1 > tp->offset) tp->offset = m->offset + 1;
    }
    rd_kafka_resp_err_t e = rd_kafka_commit(c->rk, offs, 0);
    int rc = RF_OK;
    if (e) rc = rf_fail(RF_ERR_IO, "kafka commit: %s", rd_kafka_err2str(e));
    for (int i = 0; rc == RF_OK && i < offs->cnt; i++)
        if (offs->elems[i].err)
            rc = rf_fail(RF_ERR_IO, "kafka commit %s [%d]: %s", offs->elems[i].topic,
                         (int)offs->elems[i].partition, rd_kafka_err2str(offs->elems[i].err));
    rd_kafka_topic_partition_list_destroy(offs);
    return rc;
}

void rf_kafka_consumer_observe_lag(rf_kafka_consumer *c, const char *consumer,
                                   const rf_kafka_batch *b) {
    for (size_t i = 0; i < b->n; i++) {
        const rf_kafka_msg *m = &b->msgs[i];
        int last = 1; /* only the partition's last message of the batch */
        for (size_t k = i + 1; k < b->n && last; k++)
            last = !(b->msgs[k].partition == m->partition && !strcmp(b->msgs[k].topic, m->topic));
        int64_t lo, hi;
        if (!last ||
            rd_kafka_get_watermark_offsets(c->rk, m->topic, m->partition, &lo, &hi) !=
                RD_KAFKA_RESP_ERR_NO_ERROR ||
            hi < 0)
            continue;
        rf_obs_kafka_lag(consumer, m->topic, m->partition, hi > m->offset ? hi - m->offset - 1 : 0);
    }
}
