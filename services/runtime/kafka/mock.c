/* The mock cluster lives inside a dedicated rd_kafka_t handle. */
#include "runtime/kafka/mock.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdlib.h>

#include "common/error.h"

struct rf_kafka_mock {
    rd_kafka_t *host;
    rd_kafka_mock_cluster_t *cluster;
    int brokers;
};

int rf_kafka_mock_new(int brokers, rf_kafka_mock **out) {
    *out = NULL;
    if (brokers < 1 || brokers > 16)
        return rf_fail(RF_ERR_RANGE, "kafka mock: %d brokers (want 1..16)", brokers);
    rf_kafka_mock *m = calloc(1, sizeof *m);
    if (!m) return RF_ERR_NOMEM;
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    m->host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!m->host) {
        rd_kafka_conf_destroy(conf);
        free(m);
        return rf_fail(RF_ERR_INTERNAL, "kafka mock: %s", err);
    }
    m->cluster = rd_kafka_mock_cluster_new(m->host, brokers);
    if (!m->cluster) {
        rd_kafka_destroy(m->host);
        free(m);
        return rf_fail(RF_ERR_IO, "kafka mock: cannot create a %d-broker cluster", brokers);
    }
    m->brokers = brokers;
    *out = m;
    return RF_OK;
}

void rf_kafka_mock_free(rf_kafka_mock *m) {
    if (!m) return;
    rd_kafka_mock_cluster_destroy(m->cluster);
    rd_kafka_destroy(m->host);
    free(m);
}

const char *rf_kafka_mock_bootstrap(const rf_kafka_mock *m) {
    return rd_kafka_mock_cluster_bootstraps(m->cluster);
}

static int check(rf_kafka_mock *m, int broker, rd_kafka_resp_err_t e, const char *what) {
    if (broker < 1 || broker > m->brokers)
        return rf_fail(RF_ERR_RANGE, "kafka mock: no broker %d (1..%d)", broker, m->brokers);
    if (e) return rf_fail(RF_ERR_INVALID, "kafka mock: %s: %s", what, rd_kafka_err2str(e));
    return RF_OK;
}

int rf_kafka_mock_broker_down(rf_kafka_mock *m, int broker) {
    if (broker < 1 || broker > m->brokers) return check(m, broker, 0, "down");
    return check(m, broker, rd_kafka_mock_broker_set_down(m->cluster, broker), "down");
}

int rf_kafka_mock_broker_up(rf_kafka_mock *m, int broker) {
    if (broker < 1 || broker > m->brokers) return check(m, broker, 0, "up");
    return check(m, broker, rd_kafka_mock_broker_set_up(m->cluster, broker), "up");
}

int rf_kafka_mock_topic(rf_kafka_mock *m, const char *topic, int partitions) {
    if (partitions < 1 || partitions > 1024)
        return rf_fail(RF_ERR_RANGE, "kafka mock: %d partitions", partitions);
    int replicas = m->brokers < 3 ? m->brokers : 3;
    rd_kafka_resp_err_t e = rd_kafka_mock_topic_create(m->cluster, topic, partitions, replicas);
    if (e) return rf_fail(RF_ERR_INVALID, "kafka mock: topic %s: %s", topic, rd_kafka_err2str(e));
    return RF_OK;
}
