/* Internal to services/runtime/rpc: the server and call structures shared by
 * server.c (lifecycle, workers, dispatch), call.c (handler-side operations)
 * and health.c (grpc.health.v1). */
#ifndef RF_RPC_INTERNAL_H
#define RF_RPC_INTERNAL_H

#include <pthread.h>

#include "runtime/rpc/rpc.h"

typedef struct rpc_worker {
    rf_rpc_server *server;
    pthread_t thread;
    grpc_completion_queue *notify_cq; /* registered with the server: new calls */
    grpc_completion_queue *call_cq;   /* pluck queue for the current call's ops */
} rpc_worker;

typedef struct rpc_health {
    char *service;
    int serving;
} rpc_health;

struct rf_rpc_server {
    grpc_server *grpc;
    char *listen;
    int nworkers;
    size_t max_message;
    rf_rpc_tls tls;         /* strings owned */
    rf_rpc_method *methods; /* paths owned */
    size_t nmethods;
    rpc_worker *workers; /* nworkers of them, nthreads running */
    int nthreads;
    int port;
    int started, stopped;
    rf_stats *stats;
    pthread_mutex_t health_mu;
    pthread_cond_t health_cv; /* broadcast on every health change and at stop */
    rpc_health *health;
    size_t nhealth;
    int health_closed; /* stopping: Watch calls end (under health_mu) */
    int nwatches;      /* Watch calls running (under health_mu) */
};

struct rf_rpc_call {
    grpc_call *grpc;
    grpc_completion_queue *cq;
    const rf_rpc_method *method;
    const grpc_metadata_array *metadata; /* the client's initial metadata */
    gpr_timespec deadline;
    size_t max_message;
    int initial_md_sent;
    grpc_byte_buffer *reply; /* UNARY / CLIENT_STREAM: sent with the status */
    int close_tag;           /* address tags the outstanding RECV_CLOSE_ON_SERVER */
    int close_started, closed, cancelled;
    grpc_status_code code;
    char detail[256];
};

/* Runs one batch of ops on the call and waits for it: 1 when it succeeded. */
int rpc_call_batch(rf_rpc_call *call, const grpc_op *ops, size_t n);

/* Registers /grpc.health.v1.Health/Check and /Watch on s. */
int rpc_health_register(rf_rpc_server *s);
/* Ends the Watch calls (each sends its last status and finishes OK). */
void rpc_health_close(rf_rpc_server *s);
void rpc_health_free(rf_rpc_server *s);

#endif
