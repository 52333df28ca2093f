/* Internal to services/runtime/kafka: librdkafka configuration from rf_kafka_opts. */
#ifndef RF_KAFKA_CONF_H
#define RF_KAFKA_CONF_H

#include <librdkafka/rdkafka.h>

#include "runtime/kafka/kafka.h"

/* A configuration with bootstrap and client id, then the NULL-terminated
 * pairs of `defaults`, then the caller's extra pairs (which may override
 * defaults), then the pairs of `fixed` (which the design relies on). */
int kafka_conf(const rf_kafka_opts *o, const char *const *defaults, const char *const *fixed,
               rd_kafka_conf_t **out);
/* Sets one property, failing with a message naming it. */
int kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value);

#endif
