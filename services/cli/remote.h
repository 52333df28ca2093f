/* What the commands that talk to the services share (submit, status, watch,
 * cancel, classify): server addresses and TLS from flags or the environment,
 * Control calls, and printing a RunStatus.
 *
 *   --server HOST:PORT      REFINERY_SERVER     refinery-ingest (Ingest + Control),
 *                                               default 127.0.0.1:7101
 *   --evaluator HOST:PORT   REFINERY_EVALUATOR  refinery-evaluator, default 127.0.0.1:7105
 *   --tls-ca PEM            verify the server with this CA (enables TLS)
 *   --tls-cert/--tls-key    present a client certificate (mutual TLS)
 *   --tls-server-name NAME  name to verify instead of the host
 *   --timeout SECONDS       deadline of each unary call, default 30 */
#ifndef RF_CLI_REMOTE_H
#define RF_CLI_REMOTE_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#include "refinery.pb-c.h"
#include "runtime/rpc/client.h"

typedef struct rf_remote {
    const char *server;
    const char *evaluator;
    rf_rpc_tls tls;
    double timeout_s;
} rf_remote;

enum {
    RF_REMOTE_OPT_SERVER = 0x1000,
    RF_REMOTE_OPT_EVALUATOR,
    RF_REMOTE_OPT_TLS_CA,
    RF_REMOTE_OPT_TLS_CERT,
    RF_REMOTE_OPT_TLS_KEY,
    RF_REMOTE_OPT_TLS_NAME,
    RF_REMOTE_OPT_TIMEOUT,
};

/* getopt_long entries of the shared options, to put in a command's table. */
#define RF_REMOTE_LONGOPTS                                                                         \
    {"server", required_argument, NULL, RF_REMOTE_OPT_SERVER},                                     \
        {"evaluator", required_argument, NULL, RF_REMOTE_OPT_EVALUATOR},                           \
        {"tls-ca", required_argument, NULL, RF_REMOTE_OPT_TLS_CA},                                 \
        {"tls-cert", required_argument, NULL, RF_REMOTE_OPT_TLS_CERT},                             \
        {"tls-key", required_argument, NULL, RF_REMOTE_OPT_TLS_KEY},                               \
        {"tls-server-name", required_argument, NULL, RF_REMOTE_OPT_TLS_NAME}, {                    \
        "timeout", required_argument, NULL, RF_REMOTE_OPT_TIMEOUT                                  \
    }

/* Help text of the shared options. */
extern const char rf_remote_usage[];

/* Defaults, then REFINERY_SERVER / REFINERY_EVALUATOR. */
void rf_remote_init(rf_remote *r);
/* Applies option c: 1 when it was a shared option, 0 when not, -1 (message
 * printed) for a bad value. */
int rf_remote_option(rf_remote *r, int c, const char *arg);
/* A client for target (r->server or r->evaluator); prints why on failure. */
int rf_remote_connect(const rf_remote *r, const char *target, const char *cmd, rf_rpc_client **out);

/* Control/<method>(RunRef run_id): *out is the RunStatus (free with
 * protobuf_c_message_free_unpacked), or NULL with *st saying why. */
int rf_remote_run_call(rf_rpc_client *c, const rf_remote *r, const char *method, const char *run_id,
                       Refinery__V1__RunStatus **out, rf_rpc_status *st);
/* Prints "refinery CMD: CODE: message" to stderr; returns the exit status
 * (2 for INVALID_ARGUMENT, else 1). */
int rf_remote_report(const char *cmd, const rf_rpc_status *st);

/* The status as one JSON line. */
void rf_remote_print_json(FILE *out, const Refinery__V1__RunStatus *s);
/* The status as one human-readable progress line. */
void rf_remote_print_line(FILE *out, const Refinery__V1__RunStatus *s);

/* How `watch` and `submit --watch` follow a run, and when they give up. */
typedef struct rf_watch_opts {
    bool json;            /* JSON lines instead of progress lines */
    double stall_s;       /* give up after this long without progress; 0 = never */
    double unreachable_s; /* give up after the server gave no status this long */
} rf_watch_opts;

/* Exit statuses of a watch (2 stays a usage error or INVALID_ARGUMENT). */
enum {
    RF_WATCH_SUCCEEDED = 0,
    RF_WATCH_ENDED_BADLY = 1, /* the run failed or was cancelled, or the watch broke */
    RF_WATCH_STALLED = 3,     /* no progress for stall_s */
    RF_WATCH_UNREACHABLE = 4, /* no status from the server for unreachable_s */
};

enum {
    RF_WATCH_OPT_STALL = 0x1100,
    RF_WATCH_OPT_UNREACHABLE,
};

#define RF_WATCH_LONGOPTS                                                                          \
    {"stall-timeout", required_argument, NULL, RF_WATCH_OPT_STALL}, {                              \
        "unreachable-timeout", required_argument, NULL, RF_WATCH_OPT_UNREACHABLE                   \
    }

/* Help text of the watch options and the exit statuses. */
extern const char rf_watch_usage[];

/* Defaults (stall 900 s, unreachable 30 s), then REFINERY_STALL_TIMEOUT and
 * REFINERY_UNREACHABLE_TIMEOUT; -1 (message printed) for a bad value. */
int rf_watch_opts_init(rf_watch_opts *w);
/* Applies option c as rf_remote_option does (1, 0 or -1). */
int rf_watch_option(rf_watch_opts *w, int c, const char *arg);

/* Follows run_id on r->server, on a channel of its own (a caller's channel
 * to the same server is best freed first: see reconnect in remote.c), until
 * it ends, printing a line (or JSON) per change. Uses
 * Control.Watch, or polls Control.Get once a second when the server has no
 * room for another watch. Progress is a change of the run's state, sealing,
 * error, any stage's counts, its checkpoint or its evaluation; without any
 * for w->stall_s it gives up, naming the stages that have not moved. When
 * the server gives no status (unreachable, or UNAVAILABLE: restarting, its
 * store down) it retries with a growing pause, and gives up after
 * w->unreachable_s naming the address and the last error; while it waits it
 * asks on a new channel each time, so that a server back is seen at once
 * (gRPC's own reconnection waits up to 2 minutes). Returns one of
 * the RF_WATCH_* statuses (2 for INVALID_ARGUMENT). */
int rf_remote_watch(const rf_remote *r, const char *cmd, const char *run_id,
                    const rf_watch_opts *w);

#endif
