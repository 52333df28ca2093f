/* The Kafka options the services share (svc.h); apart from grpc_opts.c so that
 * a service without gRPC does not link the gRPC library. */
#include <stdlib.h>

#include "common/error.h"
#include "runtime/svc.h"

int rf_svc_kafka_opts(rf_svc_kafka *k, const char *client_id, rf_kafka_opts *ko) {
    if (k->delivery_timeout_s <= 0)
        return rf_fail(RF_ERR_INVALID, "--delivery-timeout must be positive");
    if (!k->props_split) {
        int rc = rf_svc_split_props(k->props, &k->props_storage, &k->props_split);
        if (rc < 0) return rc;
    }
    *ko = (rf_kafka_opts){.bootstrap = k->bootstrap,
                          .client_id = client_id,
                          .delivery_timeout_s = k->delivery_timeout_s,
                          .extra = k->props_split};
    return RF_OK;
}

void rf_svc_kafka_free(rf_svc_kafka *k) {
    free(k->props_split);
    free(k->props_storage);
    k->props_split = NULL;
    k->props_storage = NULL;
}

int rf_svc_kafka_topics(const rf_svc_kafka *k, const rf_kafka_opts *ko, const char *const *topics,
                        size_t n) {
    if (k->topic_partitions < 1 || k->topic_partitions > 10000)
        return rf_fail(RF_ERR_INVALID, "--topic-partitions must be 1..10000");
    double timeout = k->delivery_timeout_s > 0 ? k->delivery_timeout_s : 30;
    return rf_kafka_topics_ensure(ko, topics, n, (int)k->topic_partitions, k->create_topics,
                                  timeout);
}
