/* librdkafka's built-in mock Kafka cluster (rdkafka_mock.h), which speaks the
 * real Kafka protocol on localhost listeners: used by the
 * refinery-kafka-mock helper process and by in-process tests. */
#ifndef RF_KAFKA_MOCK_H
#define RF_KAFKA_MOCK_H

typedef struct rf_kafka_mock rf_kafka_mock;

int rf_kafka_mock_new(int brokers, rf_kafka_mock **out);
void rf_kafka_mock_free(rf_kafka_mock *m);
/* "127.0.0.1:port,..." owned by m. */
const char *rf_kafka_mock_bootstrap(const rf_kafka_mock *m);
/* Broker ids are 1..brokers. */
int rf_kafka_mock_broker_down(rf_kafka_mock *m, int broker);
int rf_kafka_mock_broker_up(rf_kafka_mock *m, int broker);
int rf_kafka_mock_topic(rf_kafka_mock *m, const char *topic, int partitions);

#endif
