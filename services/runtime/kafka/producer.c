/* Idempotent producer with delivery accounting and bounded in-flight. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "runtime/kafka/conf.h"
#include "runtime/kafka/kafka.h"
#include "refinery.pb-c.h"

struct rf_kafka_producer {
    rd_kafka_t *rk;
    int max_in_flight;
    double delivery_timeout_s;
    atomic_llong delivered, failed;
    int64_t failed_at_flush; /* failed count when the last flush returned */
    char first_error[256];   /* first failure since the last flush */
};

/* Runs inside rd_kafka_poll/flush, on the thread that calls them. */
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    rf_kafka_producer *p = opaque;
    rf_kafka_tracker *t = m->_private;
    if (t) {
        if (m->err) {
            if (atomic_exchange(&t->have_error, 1) == 0)
                snprintf(t->first_error, sizeof t->first_error, "%s [%d]: %s",
                         rd_kafka_topic_name(m->rkt), (int)m->partition, rd_kafka_err2str(m->err));
            atomic_fetch_add(&t->failed, 1);
        } else {
            atomic_fetch_add(&t->delivered, 1);
        }
        atomic_fetch_sub(&t->pending, 1); /* last: a waiter then sees the outcome */
    }
    if (!m->err) {
        atomic_fetch_add(&p->delivered, 1);
        return;
    }
    if (atomic_fetch_add(&p->failed, 1) == p->failed_at_flush)
        snprintf(p->first_error, sizeof p->first_error, "%s [%d]: %s", rd_kafka_topic_name(m->rkt),
                 (int)m->partition, rd_kafka_err2str(m->err));
}

int rf_kafka_producer_new(const rf_kafka_opts *o, rf_kafka_producer **out) {
    *out = NULL;
    rf_kafka_producer *p = calloc(1, sizeof *p);
    if (!p) return RF_ERR_NOMEM;
    p->max_in_flight = o->max_in_flight > 0 ? o->max_in_flight : 10000;
    p->delivery_timeout_s = o->delivery_timeout_s > 0 ? o->delivery_timeout_s : 30;
    char max_msgs[32], timeout_ms[32];
    snprintf(max_msgs, sizeof max_msgs, "%d", p->max_in_flight);
    snprintf(timeout_ms, sizeof timeout_ms, "%.0f", p->delivery_timeout_s * 1000);
    const char *const defaults[] = {"linger.ms", "5", NULL};
    /* clang-format off */
    const char *const fixed[] = {
        "enable.idempotence", "true", /* acks=all, no duplicates on retry */
        "queue.buffering.max.messages", max_msgs,
        "message.timeout.ms", timeout_ms,
        NULL,
    };
    /* clang-format on */
    rd_kafka_conf_t *conf;
    int rc = kafka_conf(o, defaults, fixed, &conf);
    if (rc < 0) {
        free(p);
        return rc;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_conf_set_opaque(conf, p);
    char err[256];
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!p->rk) {
        rd_kafka_conf_destroy(conf);
        free(p);
        return rf_fail(RF_ERR_INVALID, "kafka producer: %s", err);
    }
    *out = p;
    return RF_OK;
}

void rf_kafka_producer_free(rf_kafka_producer *p) {
    if (!p) return;
    if (rf_kafka_flush(p, p->delivery_timeout_s) < 0)
        rf_warn("kafka", "producer closed with undelivered messages: %s", rf_errmsg());
    rd_kafka_destroy(p->rk);
    free(p);
}

int rf_kafka_producer_ping(rf_kafka_producer *p, double timeout_s) {
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t e = rd_kafka_metadata(p->rk, 0, NULL, &md, (int)(timeout_s * 1000));
    if (md) rd_kafka_metadata_destroy(md);
    return e ? rf_fail(RF_ERR_IO, "kafka: no broker answers: %s", rd_kafka_err2str(e)) : RF_OK;
}

static int fatal_error(rf_kafka_producer *p) {
    char why[256];
    rd_kafka_resp_err_t e = rd_kafka_fatal_error(p->rk, why, sizeof why);
    return e ? rf_fail(RF_ERR_IO, "kafka producer: fatal: %s", why) : RF_OK;
}

int rf_kafka_produce(rf_kafka_producer *p, const char *topic, const void *key, size_t key_len,
                     const void *value, size_t len) {
    return rf_kafka_produce_tracked(p, NULL, topic, key, key_len, value, len);
}

int rf_kafka_produce_tracked(rf_kafka_producer *p, rf_kafka_tracker *t, const char *topic,
                             const void *key, size_t key_len, const void *value, size_t len) {
    for (;;) {
        /* Serve delivery reports first, so that in_flight counts real work. */
        rd_kafka_poll(p->rk, 0);
        if (rd_kafka_outq_len(p->rk) >= p->max_in_flight) {
            int rc = fatal_error(p);
            if (rc < 0) return rc;
            rd_kafka_poll(p->rk, 50);
            continue;
        }
        if (t) atomic_fetch_add(&t->pending, 1); /* before: delivery may come at once */
        rd_kafka_resp_err_t e = rd_kafka_producev(
            p->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
            RD_KAFKA_V_KEY((void *)key, key_len), RD_KAFKA_V_VALUE((void *)value, len),
            RD_KAFKA_V_OPAQUE(t), RD_KAFKA_V_END);
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR) return RF_OK;
        if (t) atomic_fetch_sub(&t->pending, 1);
        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
            return rf_fail(RF_ERR_IO, "kafka produce to %s: %s", topic, rd_kafka_err2str(e));
        rd_kafka_poll(p->rk, 50);
    }
}

int rf_kafka_produce_reject(rf_kafka_producer *p, rf_kafka_tracker *t, const char *topic,
                            const rf_kafka_reject *r) {
    Refinery__V1__Reject m = REFINERY__V1__REJECT__INIT;
    m.run_id = (char *)(r->run_id ? r->run_id : "");
    m.doc_id = (char *)(r->doc_id ? r->doc_id : "");
    m.source = (char *)(r->source ? r->source : "");
    m.line = r->line;
    m.offset = r->offset;
    m.reason = (char *)r->reason;
    m.excerpt.data = (uint8_t *)r->excerpt;
    m.excerpt.len = r->excerpt ? r->excerpt_len : 0;
    size_t n = refinery__v1__reject__get_packed_size(&m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return RF_ERR_NOMEM;
    refinery__v1__reject__pack(&m, buf);
    const char *key = m.run_id[0] ? m.run_id : r->reason;
    int rc = rf_kafka_produce_tracked(p, t, topic, key, strlen(key), buf, n);
    free(buf);
    return rc;
}

int rf_kafka_flush(rf_kafka_producer *p, double timeout_s) {
    rd_kafka_resp_err_t e = rd_kafka_flush(p->rk, (int)(timeout_s * 1000));
    int64_t failed = atomic_load(&p->failed);
    int rc = RF_OK;
    if (failed > p->failed_at_flush)
        rc = rf_fail(RF_ERR_IO, "kafka: %lld message(s) not delivered, first: %s",
                     (long long)(failed - p->failed_at_flush), p->first_error);
    else if (e == RD_KAFKA_RESP_ERR__TIMED_OUT)
        rc = rf_fail(RF_ERR_IO, "kafka: %d message(s) still undelivered after %.1fs",
                     rd_kafka_outq_len(p->rk), timeout_s);
    else if (fatal_error(p) < 0)
        rc = RF_ERR_IO;
    p->failed_at_flush = failed;
    return rc;
}

int rf_kafka_wait(rf_kafka_producer *p, rf_kafka_tracker *t, double timeout_s) {
    double end = rf_now() + timeout_s;
    while (atomic_load(&t->pending) > 0) {
        if (rf_now() > end)
            return rf_fail(RF_ERR_IO, "kafka: %lld message(s) still undelivered after %.1fs",
                           (long long)atomic_load(&t->pending), timeout_s);
        if (fatal_error(p) < 0) return RF_ERR_IO;
        rd_kafka_poll(p->rk, 20);
    }
    long long failed = atomic_load(&t->failed);
    if (failed)
        return rf_fail(RF_ERR_IO, "kafka: %lld message(s) not delivered, first: %s", failed,
                       t->first_error);
    return RF_OK;
}

int rf_kafka_in_flight(rf_kafka_producer *p) {
    return rd_kafka_outq_len(p->rk);
}
int64_t rf_kafka_delivered(const rf_kafka_producer *p) {
    return atomic_load(&p->delivered);
}
int64_t rf_kafka_failed(const rf_kafka_producer *p) {
    return atomic_load(&p->failed);
}
