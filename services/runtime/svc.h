/* Service process plumbing: options from flags and environment, and signals.
 *
 * One option table serves the command line, the environment and --help:
 * a value comes from --flag=VALUE (or --flag VALUE), else from the option's
 * environment variable, else from its default; later sources never override
 * earlier ones. Strings point into argv, environ or the table (not copied).
 *
 * Signals: rf_svc_signals_init() blocks SIGTERM, SIGINT and SIGHUP in the
 * calling thread before any other thread starts, so every thread inherits the
 * mask and only rf_svc_wait_signal() sees them: a service's main thread waits
 * there, then drains its work (graceful stop) and exits 0. */
#ifndef RF_SVC_H
#define RF_SVC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/stats.h"
#include "runtime/kafka/kafka.h"
#include "runtime/rpc/rpc.h"

typedef enum rf_opt_type { RF_OPT_STR, RF_OPT_INT, RF_OPT_REAL, RF_OPT_BOOL } rf_opt_type;

typedef struct rf_opt {
    const char *flag; /* "listen" for --listen */
    const char *env;  /* "REFINERY_LISTEN", or NULL */
    rf_opt_type type;
    void *dest;      /* const char **, int64_t *, double *, bool * */
    const char *def; /* default as text; NULL leaves a string NULL (unset) */
    const char *help;
} rf_opt;

/* Fills every dest. 0 on success; 1 after printing usage for --help (the
 * caller exits 0); RF_ERR_INVALID naming the flag or variable otherwise. */
int rf_svc_parse(const char *prog, const char *summary, const rf_opt *opts, size_t n, int argc,
                 char **argv);

/* Splits "name=value;name=value" (librdkafka properties from --kafka-props /
 * KAFKA_PROPERTIES) into a NULL-terminated name, value array for
 * rf_kafka_opts.extra. *out points into *storage; the caller frees both.
 * RF_ERR_INVALID names an entry without '='. NULL or "" gives an empty list. */
int rf_svc_split_props(const char *spec, char **storage, const char ***out);

/* The options every gRPC-serving service has: put RF_SVC_GRPC_OPTS(&g, "host:port")
 * in the option table, check with rf_svc_grpc_check after parsing. */
typedef struct rf_svc_grpc {
    const char *listen, *port_file, *tls_cert, *tls_key, *tls_ca;
    int64_t workers, max_message;
    double grace_s;
} rf_svc_grpc;

#define RF_SVC_GRPC_OPTS(g, listen_default)                                                        \
    {"listen",     "REFINERY_LISTEN", RF_OPT_STR,                                                  \
     &(g)->listen, (listen_default),  "gRPC address (port 0 picks a free one)"},                   \
        {"workers", "REFINERY_WORKERS", RF_OPT_INT, &(g)->workers, "4", "concurrent gRPC calls"},  \
        {"max-message", "REFINERY_MAX_MESSAGE",         RF_OPT_INT, &(g)->max_message,             \
         "4194304",     "largest gRPC message in bytes"},                                          \
        {"grace",     "REFINERY_GRACE",                                                            \
         RF_OPT_REAL, &(g)->grace_s,                                                               \
         "30",        "seconds running calls get to finish after SIGTERM"},                        \
        {"tls-cert", "REFINERY_TLS_CERT",                                                          \
         RF_OPT_STR, &(g)->tls_cert,                                                               \
         NULL,       "server certificate (PEM); enables TLS"},                                     \
        {"tls-key", "REFINERY_TLS_KEY",        RF_OPT_STR, &(g)->tls_key,                          \
         NULL,      "server private key (PEM)"},                                                   \
        {"tls-ca",   "REFINERY_TLS_CA",                                                            \
         RF_OPT_STR, &(g)->tls_ca,                                                                 \
         NULL,       "CA (PEM) that client certificates must chain to: mutual TLS"},               \
    {                                                                                              \
        "port-file", "REFINERY_PORT_FILE", RF_OPT_STR, &(g)->port_file, NULL,                      \
            "write the bound port here once serving"                                               \
    }

/* RF_ERR_INVALID naming the option that is out of range. */
int rf_svc_grpc_check(const rf_svc_grpc *g);
rf_rpc_server_opts rf_svc_grpc_server_opts(const rf_svc_grpc *g);
/* Writes the started server's port to g->port_file (nothing when unset). */
int rf_svc_grpc_write_port(const rf_svc_grpc *g, const rf_rpc_server *s);

/* The Kafka options: RF_SVC_KAFKA_OPTS(&k, "help of --kafka") in the table. */
typedef struct rf_svc_kafka {
    const char *bootstrap, *props;
    double delivery_timeout_s;
    int64_t topic_partitions; /* of the topics a service creates (rf_svc_kafka_topics) */
    bool create_topics;       /* false: a missing topic is an error at start */
    char *props_storage;      /* filled by rf_svc_kafka_opts, freed by rf_svc_kafka_free */
    const char **props_split; /* idem */
} rf_svc_kafka;

#define RF_SVC_KAFKA_OPTS(k, bootstrap_help)                                                         \
    {"kafka", "KAFKA_BOOTSTRAP", RF_OPT_STR, &(k)->bootstrap, NULL, (bootstrap_help)},               \
        {"kafka-props", "KAFKA_PROPERTIES",                                                          \
         RF_OPT_STR,    &(k)->props,                                                                 \
         NULL,          "more librdkafka properties: name=value;name=value (SASL, TLS to brokers)"}, \
        {"delivery-timeout",                                                                         \
         "REFINERY_KAFKA_DELIVERY_TIMEOUT",                                                          \
         RF_OPT_REAL,                                                                                \
         &(k)->delivery_timeout_s,                                                                   \
         "30",                                                                                       \
         "seconds a message may take to reach Kafka"},                                               \
        {"topic-partitions",                                                                         \
         "REFINERY_TOPIC_PARTITIONS",                                                                \
         RF_OPT_INT,                                                                                 \
         &(k)->topic_partitions,                                                                     \
         "4",                                                                                        \
         "partitions of the topics the service creates at start"},                                   \
    {                                                                                                \
        "create-topics", "REFINERY_CREATE_TOPICS", RF_OPT_BOOL, &(k)->create_topics, "true",         \
            "create missing topics at start (false: refuse to start, naming them)"                   \
    }

/* Fills *ko (bootstrap, client id, delivery timeout, the split --kafka-props)
 * for rf_kafka_producer_new / rf_kafka_consumer_new; ko borrows from k. */
int rf_svc_kafka_opts(rf_svc_kafka *k, const char *client_id, rf_kafka_opts *ko);
void rf_svc_kafka_free(rf_svc_kafka *k);
/* Makes sure the service's topics[0..n) exist (NULL entries ignored): creates
 * the missing ones with --topic-partitions partitions, or with
 * --create-topics=false fails naming them (rf_kafka_topics_ensure). */
int rf_svc_kafka_topics(const rf_svc_kafka *k, const rf_kafka_opts *ko, const char *const *topics,
                        size_t n);

int rf_svc_signals_init(void);
/* The signal received, or 0 when timeout_s passed (timeout_s < 0: wait forever). */
int rf_svc_wait_signal(double timeout_s);

/* A process-wide stop flag for loops; rf_svc_stopping() also takes a pending
 * termination signal (they are blocked after rf_svc_signals_init). */
void rf_svc_request_stop(void);
/* Logs "stopped: <stats as JSON>" for component comp, as services do on exit. */
void rf_svc_log_stats(const char *comp, const rf_stats *stats);
bool rf_svc_stopping(void);

#endif
