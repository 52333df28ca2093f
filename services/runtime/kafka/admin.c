/* Topics a service needs: found, or created with the admin API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "runtime/kafka/conf.h"
#include "runtime/kafka/kafka.h"

/* Whether topic is in the cluster's metadata with partitions and no error. */
static bool topic_present(const struct rd_kafka_metadata *md, const char *topic) {
    for (int i = 0; i < md->topic_cnt; i++)
        if (!strcmp(md->topics[i].topic, topic))
            return !md->topics[i].err && md->topics[i].partition_cnt > 0;
    return false;
}

static bool seen_before(const char *const *topics, size_t i) {
    for (size_t k = 0; k < i; k++)
        if (topics[k] && !strcmp(topics[k], topics[i])) return true;
    return false;
}

/* The names of topics[0..n) missing from the cluster: *missing[0..*nm). */
static int find_missing(rd_kafka_t *rk, const char *const *topics, size_t n, int ms,
                        const char **missing, size_t *nm) {
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 1, NULL, &md, ms);
    if (e)
        return rf_fail(RF_ERR_IO, "kafka: no answer from the brokers within %.0f s (%s)",
                       ms / 1000.0, rd_kafka_err2str(e));
    *nm = 0;
    for (size_t i = 0; i < n; i++)
        if (topics[i] && !seen_before(topics, i) && !topic_present(md, topics[i]))
            missing[(*nm)++] = topics[i];
    rd_kafka_metadata_destroy(md);
    return RF_OK;
}

static int names(rf_buf *b, const char *const *t, size_t n) {
    int rc = RF_OK;
    for (size_t i = 0; i < n && rc == RF_OK; i++) {
        if (i) rc = rf_buf_puts(b, ", ");
        if (rc == RF_OK) rc = rf_buf_puts(b, t[i]);
    }
    return rc;
}

/* Brokers without the admin API (librdkafka's mock cluster) create a topic
 * when a client asks for its metadata, with their own partition count. */
static int auto_create(rd_kafka_t *rk, const char **missing, size_t nm, int partitions, int ms) {
    for (size_t i = 0; i < nm; i++) {
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, missing[i], NULL);
        if (!rkt) return rf_fail(RF_ERR_NOMEM, "kafka: topic %s", missing[i]);
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, ms);
        int got = !e && md->topic_cnt == 1 ? md->topics[0].partition_cnt : 0;
        if (md) rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(rkt);
        if (e)
            return rf_fail(RF_ERR_IO, "kafka: creating topic %s: %s", missing[i],
                           rd_kafka_err2str(e));
        if (got > 0 && got != partitions)
            rf_warn("kafka",
                    "topic %s: the brokers have no admin API; created by them with %d "
                    "partitions, not %d",
                    missing[i], got, partitions);
        else if (got > 0)
            rf_info("kafka", "created topic %s (%d partitions)", missing[i], got);
    }
    return RF_OK;
}

/* -1 when the controller is one of the cluster's brokers, else the id of a
 * broker to send admin requests to. */
static int32_t any_broker_if_no_controller(rd_kafka_t *rk, int ms) {
    int32_t controller = rd_kafka_controllerid(rk, ms);
    const struct rd_kafka_metadata *md = NULL;
    if (rd_kafka_metadata(rk, 0, NULL, &md, ms)) return -1;
    int32_t pick = md->broker_cnt > 0 ? md->brokers[0].id : -1;
    for (int i = 0; i < md->broker_cnt; i++)
        if (md->brokers[i].id == controller) pick = -1;
    rd_kafka_metadata_destroy(md);
    return pick;
}

/* One CreateTopics request for missing[0..nm); topics that exist by now
 * (another service made them) are fine. */
static int create(rd_kafka_t *rk, const char **missing, size_t nm, int partitions, int ms) {
    rd_kafka_NewTopic_t **nt = calloc(nm, sizeof *nt);
    if (!nt) return RF_ERR_NOMEM;
    char err[256];
    int rc = RF_OK;
    for (size_t i = 0; i < nm && rc == RF_OK; i++)
        if (!(nt[i] = rd_kafka_NewTopic_new(missing[i], partitions, -1, err, sizeof err)))
            rc = rf_fail(RF_ERR_INVALID, "kafka: topic %s: %s", missing[i], err);
    rd_kafka_queue_t *q = rc == RF_OK ? rd_kafka_queue_new(rk) : NULL;
    rd_kafka_AdminOptions_t *ao = NULL;
    if (q) {
        ao = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
        rd_kafka_AdminOptions_set_operation_timeout(ao, ms, err, sizeof err);
        rd_kafka_AdminOptions_set_request_timeout(ao, ms, err, sizeof err);
        /* The request goes to the controller, unless the cluster names one
         * that is not among its brokers: librdkafka's mock cluster says 0
         * while its brokers are 1..N, and serves the request on any. */
        int32_t broker = any_broker_if_no_controller(rk, ms);
        if (broker >= 0) rd_kafka_AdminOptions_set_broker(ao, broker, err, sizeof err);
        rd_kafka_CreateTopics(rk, nt, nm, ao, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, ms + 1000);
        const rd_kafka_CreateTopics_result_t *res =
            ev ? rd_kafka_event_CreateTopics_result(ev) : NULL;
        if (!ev) {
            rc = rf_fail(RF_ERR_IO, "kafka: creating topics: no answer in %d ms", ms);
        } else if (rd_kafka_event_error(ev) == RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE) {
            rc = auto_create(rk, missing, nm, partitions, ms);
        } else if (rd_kafka_event_error(ev)) {
            rc = rf_fail(RF_ERR_IO, "kafka: creating topics: %s", rd_kafka_event_error_string(ev));
        } else if (res) {
            size_t cnt;
            const rd_kafka_topic_result_t **tr = rd_kafka_CreateTopics_result_topics(res, &cnt);
            for (size_t i = 0; i < cnt && rc == RF_OK; i++) {
                rd_kafka_resp_err_t e = rd_kafka_topic_result_error(tr[i]);
                if (e && e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
                    rc = rf_fail(RF_ERR_IO, "kafka: creating topic %s: %s",
                                 rd_kafka_topic_result_name(tr[i]),
                                 rd_kafka_topic_result_error_string(tr[i])
                                     ? rd_kafka_topic_result_error_string(tr[i])
                                     : rd_kafka_err2str(e));
                else if (!e)
                    rf_info("kafka", "created topic %s (%d partitions)",
                            rd_kafka_topic_result_name(tr[i]), partitions);
            }
        }
        if (ev) rd_kafka_event_destroy(ev);
        rd_kafka_AdminOptions_destroy(ao);
        rd_kafka_queue_destroy(q);
    }
    for (size_t i = 0; i < nm; i++)
        if (nt[i]) rd_kafka_NewTopic_destroy(nt[i]);
    free(nt);
    return rc;
}

int rf_kafka_topics_ensure(const rf_kafka_opts *o, const char *const *topics, size_t n,
                           int partitions, bool create_missing, double timeout_s) {
    if (partitions < 1 || partitions > 10000)
        return rf_fail(RF_ERR_RANGE, "kafka: %d partitions per topic (want 1..10000)", partitions);
    int ms = (int)(timeout_s * 1000);
    if (ms < 1000) ms = 1000;
    /* The topics are created and checked here, not by whoever uses them
     * first: the brokers' automatic creation picks its own partition count,
     * and a consumer does not trigger it. Metadata requests for all topics
     * (find_missing) create nothing; auto_create relies on one for a named
     * topic doing so, only where the brokers lack the admin API. */
    const char *const fixed[] = {"allow.auto.create.topics", "true", NULL};
    rd_kafka_conf_t *conf;
    int rc = kafka_conf(o, NULL, fixed, &conf);
    if (rc < 0) return rc;
    char err[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        return rf_fail(RF_ERR_INVALID, "kafka admin: %s", err);
    }
    const char **missing = calloc(n ? n : 1, sizeof *missing);
    size_t nm = 0;
    rc = missing ? find_missing(rk, topics, n, ms, missing, &nm) : RF_ERR_NOMEM;
    if (rc == RF_OK && nm > 0) {
        rf_buf b = RF_BUF_INIT;
        if (names(&b, missing, nm) < 0) {
            rc = RF_ERR_NOMEM;
        } else if (!create_missing) {
            rc = rf_fail(RF_ERR_NOT_FOUND,
                         "kafka: missing topic(s): %s (create them, or let the service create "
                         "them: REFINERY_CREATE_TOPICS=1)",
                         b.data);
        } else {
            rc = create(rk, missing, nm, partitions, ms);
            /* Created topics show in the metadata once they have leaders. */
            double end = rf_now() + ms / 1000.0;
            while (rc == RF_OK && (rc = find_missing(rk, topics, n, ms, missing, &nm)) == RF_OK &&
                   nm > 0) {
                if (rf_now() > end) {
                    rf_buf_free(&b);
                    names(&b, missing, nm);
                    rc = rf_fail(RF_ERR_IO, "kafka: topic(s) %s not ready after creation",
                                 b.data ? b.data : "?");
                    break;
                }
                usleep(100000);
            }
        }
        rf_buf_free(&b);
    }
    free(missing);
    rd_kafka_destroy(rk);
    return rc;
}
