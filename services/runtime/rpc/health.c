/* grpc.health.v1.Health/Check: "" is the server as a whole (SERVING while it
 * runs); other names are set by the service with rf_rpc_server_set_health.
 * Health/Watch (server streaming) sends the current status, then each change,
 * until the client cancels or the server stops (then the last status, and
 * the call ends OK). A name not known yet is SERVICE_UNKNOWN, as the
 * standard says, and is watched until it appears. A Watch holds one of the
 * server's workers while it runs, so at most workers - 1 run at once; more
 * are RESOURCE_EXHAUSTED, so that Check and the service's methods always
 * have a worker. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "health.pb-c.h"
#include "runtime/rpc/internal.h"

int rf_rpc_server_set_health(rf_rpc_server *s, const char *service, int serving) {
    int rc = RF_OK;
    pthread_mutex_lock(&s->health_mu);
    size_t i = 0;
    while (i < s->nhealth && strcmp(s->health[i].service, service) != 0)
        i++;
    if (i == s->nhealth) {
        rpc_health *grown = realloc(s->health, (s->nhealth + 1) * sizeof *grown);
        char *name = strdup(service);
        if (grown) s->health = grown;
        if (!grown || !name) {
            free(name);
            rc = RF_ERR_NOMEM;
            goto out;
        }
        s->health[s->nhealth++] = (rpc_health){name, serving};
    }
    s->health[i].serving = serving;
    pthread_cond_broadcast(&s->health_cv);
out:
    pthread_mutex_unlock(&s->health_mu);
    return rc;
}

static grpc_status_code health_check(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    rf_rpc_server *s = user;
    const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
    int found = 0, serving = 0;
    pthread_mutex_lock(&s->health_mu);
    for (size_t i = 0; i < s->nhealth; i++)
        if (strcmp(s->health[i].service, r->service) == 0) {
            found = 1;
            serving = s->health[i].serving;
        }
    pthread_mutex_unlock(&s->health_mu);
    if (!found) return rf_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "unknown service '%s'", r->service);
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = serving ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                          : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    return rf_rpc_send(call, &resp.base) < 0 ? rf_rpc_call_status(call) : GRPC_STATUS_OK;
}

void rpc_health_close(rf_rpc_server *s) {
    pthread_mutex_lock(&s->health_mu);
    s->health_closed = 1;
    pthread_cond_broadcast(&s->health_cv);
    pthread_mutex_unlock(&s->health_mu);
}

/* The status of `service` (under health_mu). */
static Grpc__Health__V1__HealthCheckResponse__ServingStatus status_of(rf_rpc_server *s,
                                                                      const char *service) {
    for (size_t i = 0; i < s->nhealth; i++)
        if (strcmp(s->health[i].service, service) == 0)
            return s->health[i].serving
                       ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                       : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
}

static grpc_status_code health_watch(rf_rpc_call *call, const ProtobufCMessage *req, void *user) {
    rf_rpc_server *s = user;
    const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
    pthread_mutex_lock(&s->health_mu);
    if (s->nwatches >= s->nworkers - 1) {
        int n = s->nwatches;
        pthread_mutex_unlock(&s->health_mu);
        return rf_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "too many Health/Watch calls (%d running; workers %d)", n, s->nworkers);
    }
    s->nwatches++;
    int sent = -1; /* nothing sent yet */
    grpc_status_code code = GRPC_STATUS_OK;
    for (;;) {
        int now = (int)status_of(s, r->service);
        int closed = s->health_closed;
        if (now != sent) {
            pthread_mutex_unlock(&s->health_mu);
            Grpc__Health__V1__HealthCheckResponse resp =
                GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
            resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)now;
            int rc = rf_rpc_send(call, &resp.base);
            pthread_mutex_lock(&s->health_mu);
            if (rc < 0) {
                code = rf_rpc_call_status(call);
                break;
            }
            sent = now;
            continue; /* it may have changed meanwhile */
        }
        if (closed) break;
        pthread_mutex_unlock(&s->health_mu);
        int done = rf_rpc_call_done(call); /* cancelled, or past its deadline */
        pthread_mutex_lock(&s->health_mu);
        if (done) {
            code = GRPC_STATUS_CANCELLED;
            break;
        }
        /* Changes wake this at once; the timeout is for a cancelled call. */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (s->health_closed || (int)status_of(s, r->service) != sent) continue;
        int w = pthread_cond_timedwait(&s->health_cv, &s->health_mu, &until);
        (void)w;
    }
    s->nwatches--;
    pthread_mutex_unlock(&s->health_mu);
    return code;
}

int rpc_health_register(rf_rpc_server *s) {
    rf_rpc_method check = {
        .path = "/grpc.health.v1.Health/Check",
        .kind = RF_RPC_UNARY,
        .request = &grpc__health__v1__health_check_request__descriptor,
        .handler = health_check,
        .user = s,
    };
    rf_rpc_method watch = {
        .path = "/grpc.health.v1.Health/Watch",
        .kind = RF_RPC_SERVER_STREAM,
        .request = &grpc__health__v1__health_check_request__descriptor,
        .handler = health_watch,
        .user = s,
    };
    int rc = rf_rpc_server_add(s, &check);
    if (rc == RF_OK) rc = rf_rpc_server_add(s, &watch);
    return rc < 0 ? rc : rf_rpc_server_set_health(s, "", 1);
}

void rpc_health_free(rf_rpc_server *s) {
    for (size_t i = 0; i < s->nhealth; i++)
        free(s->health[i].service);
    free(s->health);
}
