/* grpc.health.v1.Health/Check: "" is the server as a whole (SERVING while it
 * runs); other names are set by the service with rf_rpc_server_set_health. */
#include <stdlib.h>
#include <string.h>

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

int rpc_health_register(rf_rpc_server *s) {
    rf_rpc_method m = {
        .path = "/grpc.health.v1.Health/Check",
        .kind = RF_RPC_UNARY,
        .request = &grpc__health__v1__health_check_request__descriptor,
        .handler = health_check,
        .user = s,
    };
    int rc = rf_rpc_server_add(s, &m);
    return rc < 0 ? rc : rf_rpc_server_set_health(s, "", 1);
}

void rpc_health_free(rf_rpc_server *s) {
    for (size_t i = 0; i < s->nhealth; i++)
        free(s->health[i].service);
    free(s->health);
}
