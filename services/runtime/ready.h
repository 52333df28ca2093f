/* Readiness: a thread that probes a service's dependencies (PostgreSQL,
 * Kafka) every interval and keeps the service's grpc.health.v1 name SERVING
 * while all answer, NOT_SERVING while one does not (the server as a whole,
 * "", stays SERVING: the process is alive). Each change is logged once, with
 * the dependency and the reason.
 *
 *   rf_ready *r;
 *   rf_ready_new(server, "refinery.v1.Dedup", 3.0, &r);
 *   rf_ready_add_pg(r, conninfo);
 *   rf_ready_add_kafka(r, producer);
 *   rf_ready_heartbeat(r, "dedup");  // optional: a heartbeat row after each probe
 *   rf_ready_start(r);          // probes at once, then every 3 s
 *   ...
 *   rf_ready_free(r);           // stops the thread (before freeing what it probes)
 */
#ifndef RF_RUNTIME_READY_H
#define RF_RUNTIME_READY_H

#include "runtime/kafka/kafka.h"
#include "runtime/rpc/rpc.h"

typedef struct rf_ready rf_ready;

/* server and health are borrowed (health copied); interval_s > 0. */
int rf_ready_new(rf_rpc_server *server, const char *health, double interval_s, rf_ready **out);
/* PostgreSQL answers PQping (each probe bounded to 2 s) on conninfo (copied). */
int rf_ready_add_pg(rf_ready *r, const char *conninfo);
/* A Kafka broker answers a metadata request of p (borrowed) within 2 s. */
int rf_ready_add_kafka(rf_ready *r, rf_kafka_producer *p);
/* Liveness: after each probe the thread also writes service's heartbeat to
 * the PostgreSQL of rf_ready_add_pg (store.h: rf_store_heartbeat, instance
 * host:pid, whether the probe passed and why not), on a connection of its
 * own, opened when PostgreSQL answers (one attempt: a failure waits for the
 * next probe). Call after rf_ready_add_pg, before rf_ready_start; service is
 * copied. */
int rf_ready_heartbeat(rf_ready *r, const char *service);
int rf_ready_start(rf_ready *r);
/* 1 while every dependency answered at the last probe. */
int rf_ready_ok(rf_ready *r);
/* Stops the thread (waits for a probe in progress) and frees; NULL is a no-op. */
void rf_ready_free(rf_ready *r);

#endif
