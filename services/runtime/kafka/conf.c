/* librdkafka configuration shared by the producer and the consumer. */
#include "runtime/kafka/conf.h"

#include "common/error.h"
#include "common/log.h"

int kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value) {
    char err[256];
    if (rd_kafka_conf_set(conf, name, value, err, sizeof err) != RD_KAFKA_CONF_OK)
        return rf_fail(RF_ERR_INVALID, "kafka: %s=%s: %s", name, value, err);
    return RF_OK;
}

/* librdkafka's own log lines go through ours. */
static void log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    rf_log_level l = level <= 3 ? RF_LOG_ERROR : level <= 5 ? RF_LOG_WARN : RF_LOG_DEBUG;
    rf_log(l, "kafka", "%s: %s", fac, buf);
}

int kafka_conf(const rf_kafka_opts *o, const char *const *defaults, const char *const *fixed,
               rd_kafka_conf_t **out) {
    *out = NULL;
    if (!o->bootstrap || !*o->bootstrap)
        return rf_fail(RF_ERR_INVALID, "kafka: no bootstrap servers (set KAFKA_BOOTSTRAP)");
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set_log_cb(conf, log_cb);
    int rc = kafka_conf_set(conf, "bootstrap.servers", o->bootstrap);
    if (rc == RF_OK)
        rc = kafka_conf_set(conf, "client.id", o->client_id ? o->client_id : "refinery");
    for (const char *const *kv = defaults; rc == RF_OK && kv && kv[0]; kv += 2)
        rc = kafka_conf_set(conf, kv[0], kv[1]);
    for (const char *const *kv = o->extra; rc == RF_OK && kv && kv[0]; kv += 2) {
        if (!kv[1]) {
            rc = rf_fail(RF_ERR_INVALID, "kafka: property %s has no value", kv[0]);
            break;
        }
        rc = kafka_conf_set(conf, kv[0], kv[1]);
    }
    for (const char *const *kv = fixed; rc == RF_OK && kv && kv[0]; kv += 2)
        rc = kafka_conf_set(conf, kv[0], kv[1]);
    if (rc < 0) {
        rd_kafka_conf_destroy(conf);
        return rc;
    }
    *out = conf;
    return RF_OK;
}
