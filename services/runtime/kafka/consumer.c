/* Consumer-group member with manual, synchronous offset commits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "common/obs.h"
#include "runtime/kafka/conf.h"
#include "runtime/kafka/kafka.h"

struct rf_kafka_consumer {
    rd_kafka_t *rk;
    char **topics;
    size_t n_topics;
    char *partitioner;  /* the `partitioner` property among the extra ones, or NULL */
    rf_kafka_gap *gaps; /* found since the last poll_batch handed them out */
    size_t n_gaps, cap_gaps;
};

static void add_gap(rf_kafka_consumer *c, const char *topic, int32_t partition, int64_t from,
                    int64_t to) {
    rf_error("kafka",
             "consumer: %s [%d]: offsets %lld..%lld were deleted before this group consumed "
             "them (probable retention); resuming at offset %lld, the runs they belonged to "
             "lose those batches",
             topic, (int)partition, (long long)from, (long long)to - 1, (long long)to);
    if (c->n_gaps == c->cap_gaps) {
        size_t cap = c->cap_gaps ? 2 * c->cap_gaps : 4;
        rf_kafka_gap *g = realloc(c->gaps, cap * sizeof *g);
        if (!g) return; /* logged above; the run check still finds the missing batches */
        c->gaps = g;
        c->cap_gaps = cap;
    }
    rf_kafka_gap *g = &c->gaps[c->n_gaps++];
    snprintf(g->topic, sizeof g->topic, "%s", topic);
    g->partition = partition;
    g->from = from;
    g->to = to;
}

/* Restarts a partition that librdkafka stopped at `start`. A seek is refused
 * on a stopped partition, so it is assigned again: alone with the
 * cooperative protocol, else the whole assignment with every other
 * partition at its position (the committed offset where nothing was read
 * since the assignment). */
static int restart_at(rf_kafka_consumer *c, const char *topic, int32_t part, int64_t start) {
    rd_kafka_topic_partition_list_t *a = NULL;
    rd_kafka_error_t *err = NULL;
    rd_kafka_resp_err_t e;
    if (!strcmp(rd_kafka_rebalance_protocol(c->rk), "COOPERATIVE")) {
        a = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(a, topic, part)->offset = start;
        err = rd_kafka_incremental_unassign(c->rk, a);
        if (!err) err = rd_kafka_incremental_assign(c->rk, a);
        e = err ? rd_kafka_error_code(err) : RD_KAFKA_RESP_ERR_NO_ERROR;
    } else if (!(e = rd_kafka_assignment(c->rk, &a))) {
        rd_kafka_position(c->rk, a);
        rd_kafka_topic_partition_t *p = rd_kafka_topic_partition_list_find(a, topic, part);
        if (!p) p = rd_kafka_topic_partition_list_add(a, topic, part);
        p->offset = start;
        e = rd_kafka_assign(c->rk, NULL);
        if (!e) e = rd_kafka_assign(c->rk, a);
    }
    int rc =
        e ? rf_fail(RF_ERR_IO, "kafka consumer: %s [%d]: restart at %lld: %s", topic, (int)part,
                    (long long)start, err ? rd_kafka_error_string(err) : rd_kafka_err2str(e))
          : RF_OK;
    if (err) rd_kafka_error_destroy(err);
    if (a) rd_kafka_topic_partition_list_destroy(a);
    return rc;
}

/* With auto.offset.reset=error librdkafka stops a partition whose position
 * is not in the log and says so in a poll: the committed offset is below
 * the log's start (records deleted before this group read them: retention,
 * a truncated log), or the committed offsets could not be read at
 * assignment (a fresh cluster whose group coordinator was not ready) and
 * the partition has none. The consumer resumes at the log's start and
 * reports the skipped range as a gap; a committed offset beyond the log's
 * end (the topic was deleted and created again) is an error. */
static int offset_reset(rf_kafka_consumer *c, const rd_kafka_message_t *m) {
    if (!m->rkt) return rf_fail(RF_ERR_IO, "kafka consumer: %s", rd_kafka_message_errstr(m));
    const char *topic = rd_kafka_topic_name(m->rkt);
    int32_t part = m->partition;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, part);
    /* A fresh cluster's coordinator may need a moment: a few tries. */
    rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR_NO_ERROR;
    int64_t committed = -1, low = 0, high = 0;
    for (int attempt = 0; attempt < 5; attempt++) {
        if (attempt) usleep(500000);
        l->elems[0].offset = RD_KAFKA_OFFSET_INVALID;
        e = rd_kafka_committed(c->rk, l, 5000);
        committed = l->elems[0].offset;
        if (!e) e = rd_kafka_query_watermark_offsets(c->rk, topic, part, &low, &high, 5000);
        if (!e) break;
    }
    if (e) {
        rd_kafka_topic_partition_list_destroy(l);
        return rf_fail(RF_ERR_IO,
                       "kafka consumer: %s [%d]: no start position (committed offset or log "
                       "bounds unreadable: %s); a restart retries",
                       topic, (int)part, rd_kafka_err2str(e));
    }
    if (committed > high) {
        rd_kafka_topic_partition_list_destroy(l);
        return rf_fail(RF_ERR_IO,
                       "kafka consumer: %s [%d]: committed offset %lld is beyond the log's end "
                       "%lld (was the topic deleted and created again?): input unknown",
                       topic, (int)part, (long long)committed, (long long)high);
    }
    int64_t start = committed < 0 ? 0 : committed;
    if (start < low) {
        add_gap(c, topic, part, start, low);
        start = low;
    }
    rd_kafka_topic_partition_list_destroy(l);
    return restart_at(c, topic, part, start);
}

/* Assignments start at the committed offset, or at the beginning of a
 * partition the group never committed on (what auto.offset.reset=earliest
 * did, without its silent jump when a committed offset is out of range);
 * a beginning that is no longer offset 0 is reported as a gap. */
static void rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *parts, void *opaque) {
    rf_kafka_consumer *c = opaque;
    int cooperative = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR_NO_ERROR;
        /* The coordinator of a fresh cluster may not answer at once. */
        for (int attempt = 0; attempt < 3; attempt++) {
            e = rd_kafka_committed(rk, parts, 5000);
            if (!e) break;
            rf_warn("kafka", "consumer: committed offsets at assignment: %s; retrying",
                    rd_kafka_err2str(e));
        }
        for (int i = 0; !e && i < parts->cnt; i++) {
            rd_kafka_topic_partition_t *p = &parts->elems[i];
            if (p->offset != RD_KAFKA_OFFSET_INVALID) continue;
            int64_t low = 0, high = 0;
            if (!rd_kafka_query_watermark_offsets(rk, p->topic, p->partition, &low, &high, 10000) &&
                low > 0)
                add_gap(c, p->topic, p->partition, 0, low);
            p->offset = RD_KAFKA_OFFSET_BEGINNING;
        }
        /* else: librdkafka reads the committed offsets itself; a partition
         * without one then stops with an offset error, which offset_reset
         * turns into a start at the log's beginning. */
        if (cooperative) {
            rd_kafka_error_t *ae = rd_kafka_incremental_assign(rk, parts);
            if (ae) {
                rf_warn("kafka", "consumer: assign: %s", rd_kafka_error_string(ae));
                rd_kafka_error_destroy(ae);
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
    rf_kafka_consumer *c = calloc(1, sizeof *c);
    if (!c || !(c->topics = calloc(n, sizeof *c->topics))) {
        free(c);
        return RF_ERR_NOMEM;
    }
    for (const char *const *kv = o->extra; kv && kv[0] && kv[1]; kv += 2)
        if (!strcmp(kv[0], "partitioner")) c->partitioner = strdup(kv[1]);
    for (size_t i = 0; i < n; i++, c->n_topics++)
        if (!(c->topics[i] = strdup(topics[i]))) {
            rf_kafka_consumer_free(c);
            return RF_ERR_NOMEM;
        }
    rd_kafka_conf_t *conf;
    int rc = kafka_conf(o, defaults, fixed, &conf);
    if (rc < 0) {
        rf_kafka_consumer_free(c);
        return rc;
    }
    rd_kafka_conf_set_rebalance_cb(conf, rebalance);
    rd_kafka_conf_set_opaque(conf, c);
    char err[256];
    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!c->rk) {
        rd_kafka_conf_destroy(conf);
        rf_kafka_consumer_free(c);
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
    if (c->rk) {
        rd_kafka_consumer_close(c->rk);
        rd_kafka_destroy(c->rk);
    }
    for (size_t i = 0; i < c->n_topics; i++)
        free(c->topics[i]);
    free(c->topics);
    free(c->partitioner);
    free(c->gaps);
    free(c);
}

size_t rf_kafka_consumer_topics(const rf_kafka_consumer *c, const char *const **topics) {
    *topics = (const char *const *)c->topics;
    return c->n_topics;
}

void rf_kafka_batch_release(rf_kafka_batch *b) {
    for (size_t i = 0; i < b->n; i++)
        rd_kafka_message_destroy(b->raw[i]);
    free(b->raw);
    free(b->msgs);
    free(b->gaps);
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
            if (b->n || c->n_gaps) break;
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
    /* Gaps go out with the batch whose offsets would commit past them. */
    if (c->n_gaps) {
        b->gaps = c->gaps;
        b->n_gaps = c->n_gaps;
        c->gaps = NULL;
        c->n_gaps = c->cap_gaps = 0;
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

typedef int32_t (*partitioner_fn)(const rd_kafka_topic_t *, const void *, size_t, int32_t, void *,
                                  void *);

/* librdkafka's partitioners by their property names. */
static partitioner_fn partitioner_named(const char *name) {
    static const struct {
        const char *name;
        partitioner_fn fn;
    } table[] = {
        {"consistent_random", rd_kafka_msg_partitioner_consistent_random},
        {"consistent", rd_kafka_msg_partitioner_consistent},
        {"murmur2", rd_kafka_msg_partitioner_murmur2},
        {"murmur2_random", rd_kafka_msg_partitioner_murmur2_random},
        {"fnv1a", rd_kafka_msg_partitioner_fnv1a},
        {"fnv1a_random", rd_kafka_msg_partitioner_fnv1a_random},
    };
    if (!name) return rd_kafka_msg_partitioner_consistent_random;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(table[i].name, name)) return table[i].fn;
    return NULL;
}

int rf_kafka_consumer_standing(rf_kafka_consumer *c, const char *topic, const void *key,
                               size_t key_len, double timeout_s, rf_kafka_standing *out) {
    memset(out, 0, sizeof *out);
    out->position = -1;
    int ms = (int)(timeout_s * 1000);
    partitioner_fn fn = partitioner_named(c->partitioner);
    if (!fn)
        return rf_fail(RF_ERR_INVALID, "kafka: partitioner '%s' is not one of librdkafka's",
                       c->partitioner);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(c->rk, topic, NULL);
    if (!rkt)
        return rf_fail(RF_ERR_IO, "kafka: topic %s: %s", topic,
                       rd_kafka_err2str(rd_kafka_last_error()));
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t e = rd_kafka_metadata(c->rk, 0, rkt, &md, ms);
    int32_t count = 0;
    if (!e && md->topic_cnt == 1 && !md->topics[0].err) count = md->topics[0].partition_cnt;
    if (md) rd_kafka_metadata_destroy(md);
    if (!e && count > 0) out->partition = fn(rkt, key, key_len, count, NULL, NULL);
    rd_kafka_topic_destroy(rkt);
    if (e) return rf_fail(RF_ERR_IO, "kafka: metadata of %s: %s", topic, rd_kafka_err2str(e));
    if (count <= 0) return rf_fail(RF_ERR_IO, "kafka: topic %s has no partitions", topic);

    rd_kafka_topic_partition_list_t *a = NULL;
    e = rd_kafka_assignment(c->rk, &a);
    if (e) return rf_fail(RF_ERR_IO, "kafka: assignment: %s", rd_kafka_err2str(e));
    out->assigned = rd_kafka_topic_partition_list_find(a, topic, out->partition) != NULL;
    rd_kafka_topic_partition_list_destroy(a);
    if (!out->assigned) return RF_OK;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, out->partition);
    e = rd_kafka_position(c->rk, l);
    if (!e && l->elems[0].offset < 0) e = rd_kafka_committed(c->rk, l, ms);
    if (!e) out->position = l->elems[0].offset >= 0 ? l->elems[0].offset : -1;
    rd_kafka_topic_partition_list_destroy(l);
    if (!e)
        e = rd_kafka_query_watermark_offsets(c->rk, topic, out->partition, &out->low, &out->high,
                                             ms);
    if (e)
        return rf_fail(RF_ERR_IO, "kafka: %s [%d]: position: %s", topic, (int)out->partition,
                       rd_kafka_err2str(e));
    return RF_OK;
}
