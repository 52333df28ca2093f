/* refinery-loadgen: a closed-loop load generator for the unary methods of the
 * services. --clients threads each send one request, wait for its response,
 * and send the next, for --duration seconds (or until --requests requests
 * were sent in all). A request carries --batch texts taken in turn from
 * --texts (one text per line). Prints one JSON line: requests, successes,
 * errors per status, requests/s, texts/s, the client's own CPU seconds, and
 * the latency mean, p50, p90, p99 and max in milliseconds over the
 * successful requests after --warmup.
 *
 * A method is a row of the methods table: its name, gRPC path, response type
 * and a function that builds a request from a slice of texts. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "refinery.pb-c.h"
#include "runtime/rpc/client.h"
#include "runtime/rpc/rpc.h"
#include "runtime/svc.h"

typedef struct config {
    const char *target, *method, *texts_path, *run_id;
    int64_t clients, batch, requests, checkpoint;
    double duration_s, warmup_s, timeout_s;
} config;

/* Storage for one request of any method; builders fill it in place and
 * point its texts at the shared text table (never copied, never freed). */
typedef union request {
    Refinery__V1__TokenizeRequest tokenize;
    Refinery__V1__ClassifyRequest classify;
} request;

typedef struct method {
    const char *name, *path;
    const ProtobufCMessageDescriptor *response;
    const ProtobufCMessage *(*build)(request *r, const config *c, char **texts, size_t n);
} method;

static const ProtobufCMessage *build_tokenize(request *r, const config *c, char **texts, size_t n) {
    refinery__v1__tokenize_request__init(&r->tokenize);
    r->tokenize.texts = texts;
    r->tokenize.n_texts = n;
    r->tokenize.add_special_tokens = 1;
    return &r->tokenize.base;
}

static const ProtobufCMessage *build_classify(request *r, const config *c, char **texts, size_t n) {
    refinery__v1__classify_request__init(&r->classify);
    r->classify.run_id = (char *)c->run_id;
    r->classify.checkpoint_step = c->checkpoint;
    r->classify.texts = texts;
    r->classify.n_texts = n;
    return &r->classify.base;
}

static const method methods[] = {
    {"tokenize", "/refinery.v1.Tokenizer/Tokenize", &refinery__v1__tokenize_response__descriptor,
     build_tokenize},
    {"classify", "/refinery.v1.Evaluator/Classify", &refinery__v1__classify_response__descriptor,
     build_classify},
};

/* The texts, one per line of the file, and a window of batch pointers into
 * them (the table repeats its start so any window of `batch` is contiguous). */
typedef struct texts {
    char *data;
    char **line; /* n + batch entries: line[n + i] = line[i] */
    size_t n;
} texts;

static int texts_load(const char *path, size_t batch, texts *t) {
    size_t len;
    memset(t, 0, sizeof *t);
    int rc = rf_read_file(path, (size_t)1 << 30, &t->data, &len);
    if (rc < 0) return rc;
    size_t lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += t->data[i] == '\n';
    t->line = malloc((lines + 1 + batch) * sizeof *t->line);
    if (!t->line) return RF_ERR_NOMEM;
    for (char *p = t->data, *end = t->data + len; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) nl = end;
        *nl = 0;
        if (nl > p && nl[-1] == '\r') nl[-1] = 0;
        if (*p) t->line[t->n++] = p;
        p = nl + 1;
    }
    if (t->n == 0) return rf_fail(RF_ERR_INVALID, "%s: no texts", path);
    for (size_t i = 0; i < batch; i++)
        t->line[t->n + i] = t->line[i % t->n];
    return RF_OK;
}

static void texts_free(texts *t) {
    free(t->line);
    free(t->data);
}

/* What every client shares, and what each one measured. */
typedef struct shared {
    const config *c;
    const method *m;
    const texts *t;
    double start, measure_from, end; /* end < 0: stop on the request budget */
    atomic_int_fast64_t budget;
} shared;

typedef struct client {
    shared *s;
    size_t index;
    double *lat; /* seconds per successful measured request */
    size_t nlat, cap;
    uint64_t sent, ok, warm, codes[GRPC_STATUS_UNAUTHENTICATED + 2];
    int rc;
} client;

static int record(client *cl, double seconds) {
    if (cl->nlat == cl->cap) {
        size_t cap = cl->cap ? 2 * cl->cap : 4096;
        double *grown = realloc(cl->lat, cap * sizeof *grown);
        if (!grown) return RF_ERR_NOMEM;
        cl->lat = grown;
        cl->cap = cap;
    }
    cl->lat[cl->nlat++] = seconds;
    return RF_OK;
}

static bool more(client *cl, double now) {
    shared *s = cl->s;
    if (s->end >= 0) return now < s->end;
    return atomic_fetch_sub(&s->budget, 1) > 0;
}

static void *client_thread(void *arg) {
    client *cl = arg;
    shared *s = cl->s;
    const config *c = s->c;
    rf_rpc_client *rpc;
    cl->rc = rf_rpc_client_new(c->target, NULL, 0, &rpc);
    if (cl->rc < 0) return NULL;
    size_t batch = (size_t)c->batch;
    /* Clients start at different places in the texts. */
    size_t next = cl->index * (s->t->n / (size_t)c->clients);
    request r;
    double now = rf_now();
    while (cl->rc == RF_OK && more(cl, now)) {
        const ProtobufCMessage *req = s->m->build(&r, c, s->t->line + next % s->t->n, batch);
        next = (next + batch) % s->t->n;
        ProtobufCMessage *resp = NULL;
        rf_rpc_status st = {0};
        double t0 = rf_now();
        int rc = rf_rpc_unary(rpc, s->m->path, req, s->m->response, &resp, c->timeout_s, &st);
        now = rf_now();
        cl->sent++;
        if (rc == RF_OK) {
            protobuf_c_message_free_unpacked(resp, NULL);
            cl->ok++;
            if (t0 >= s->measure_from)
                cl->rc = record(cl, now - t0);
            else
                cl->warm++;
        } else {
            size_t code = (size_t)st.code;
            cl->codes[code <= GRPC_STATUS_UNAUTHENTICATED ? code
                                                          : GRPC_STATUS_UNAUTHENTICATED + 1]++;
        }
    }
    rf_rpc_client_free(rpc);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n), n > 0. */
static double percentile(const double *v, size_t n, double p) {
    size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (rank < 1) rank = 1;
    return v[(rank > n ? n : rank) - 1];
}

static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
}

static void report(const shared *s, client *cl, size_t n, double wall, double cpu) {
    const config *c = s->c;
    uint64_t sent = 0, ok = 0, warm = 0, errors = 0, codes[GRPC_STATUS_UNAUTHENTICATED + 2] = {0};
    size_t nlat = 0;
    for (size_t i = 0; i < n; i++) {
        sent += cl[i].sent;
        ok += cl[i].ok;
        warm += cl[i].warm;
        nlat += cl[i].nlat;
        for (size_t k = 0; k < sizeof codes / sizeof codes[0]; k++)
            codes[k] += cl[i].codes[k];
    }
    double *all = malloc((nlat ? nlat : 1) * sizeof *all), sum = 0;
    size_t at = 0;
    for (size_t i = 0; all && i < n; i++) {
        if (cl[i].nlat) memcpy(all + at, cl[i].lat, cl[i].nlat * sizeof *all);
        at += cl[i].nlat;
    }
    if (all) qsort(all, nlat, sizeof *all, cmp_double);
    for (size_t i = 0; all && i < nlat; i++)
        sum += all[i];
    /* Rates over the measured window: requests that started after warmup. */
    double window = wall - (s->measure_from - s->start);
    printf("{\"method\":\"%s\",\"target\":\"%s\",\"clients\":%" PRId64 ",\"batch\":%" PRId64
           ",\"seconds\":%.3f,\"warmup_seconds\":%.3f,\"requests\":%" PRIu64 ",\"ok\":%" PRIu64
           ",\"warmup_ok\":%" PRIu64,
           s->m->name, c->target, c->clients, c->batch, wall, s->measure_from - s->start, sent, ok,
           warm);
    printf(",\"errors\":{");
    const char *sep = "";
    for (size_t k = 0; k < sizeof codes / sizeof codes[0]; k++) {
        if (!codes[k]) continue;
        errors += codes[k];
        printf("%s\"%s\":%" PRIu64, sep,
               k <= GRPC_STATUS_UNAUTHENTICATED ? rf_rpc_status_name((grpc_status_code)k) : "other",
               codes[k]);
        sep = ",";
    }
    printf("},\"error_total\":%" PRIu64, errors);
    if (all && nlat > 0 && window > 0)
        printf(",\"requests_per_s\":%.1f,\"texts_per_s\":%.1f,\"latency_ms\":{\"mean\":%.3f,"
               "\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,\"max\":%.3f}",
               (double)nlat / window, (double)nlat * (double)c->batch / window,
               sum / (double)nlat * 1e3, percentile(all, nlat, 50) * 1e3,
               percentile(all, nlat, 90) * 1e3, percentile(all, nlat, 99) * 1e3,
               all[nlat - 1] * 1e3);
    printf(",\"client_cpu_seconds\":%.3f}\n", cpu);
    free(all);
}

static int run(const config *c, const method *m) {
    texts t;
    int rc = texts_load(c->texts_path, (size_t)c->batch, &t);
    size_t n = (size_t)c->clients;
    client *cl = calloc(n, sizeof *cl);
    pthread_t *th = calloc(n, sizeof *th);
    if (rc == RF_OK && (!cl || !th)) rc = RF_ERR_NOMEM;
    shared s = {.c = c, .m = m, .t = &t};
    size_t started = 0;
    double cpu0 = cpu_seconds();
    s.start = rf_now();
    s.measure_from = s.start + (c->requests > 0 ? 0 : c->warmup_s);
    s.end = c->requests > 0 ? -1 : s.measure_from + c->duration_s;
    atomic_init(&s.budget, c->requests);
    for (size_t i = 0; rc == RF_OK && i < n; i++) {
        cl[i] = (client){.s = &s, .index = i};
        if (pthread_create(&th[i], NULL, client_thread, &cl[i]) != 0)
            rc = rf_fail(RF_ERR_IO, "cannot start client thread %zu", i);
        else
            started++;
    }
    for (size_t i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        if (rc == RF_OK && cl[i].rc < 0) rc = cl[i].rc;
    }
    double wall = rf_now() - s.start;
    if (rc == RF_OK) report(&s, cl, n, wall, cpu_seconds() - cpu0);
    for (size_t i = 0; cl && i < n; i++)
        free(cl[i].lat);
    free(cl);
    free(th);
    texts_free(&t);
    return rc;
}

int main(int argc, char **argv) {
    rf_log_init_from_env();
    config c;
    const rf_opt opts[] = {
        {"target", NULL, RF_OPT_STR, &c.target, "127.0.0.1:7103", "service host:port"},
        {"method", NULL, RF_OPT_STR, &c.method, "tokenize",
         "tokenize (Tokenizer.Tokenize) or classify (Evaluator.Classify)"},
        {"texts", NULL, RF_OPT_STR, &c.texts_path, NULL,
         "file with one text per line (required); empty lines are left out"},
        {"batch", NULL, RF_OPT_INT, &c.batch, "1", "texts per request"},
        {"clients", NULL, RF_OPT_INT, &c.clients, "8",
         "concurrent clients (threads, one call each)"},
        {"duration", NULL, RF_OPT_REAL, &c.duration_s, "5", "seconds to measure (after --warmup)"},
        {"warmup", NULL, RF_OPT_REAL, &c.warmup_s, "0.5",
         "seconds of calls left out of the latencies and rates"},
        {"requests", NULL, RF_OPT_INT, &c.requests, "0",
         "> 0: send this many requests in all instead of running for --duration (no warmup)"},
        {"timeout", NULL, RF_OPT_REAL, &c.timeout_s, "10", "deadline of each call, seconds"},
        {"run", NULL, RF_OPT_STR, &c.run_id, "", "classify: the run whose checkpoint answers"},
        {"checkpoint", NULL, RF_OPT_INT, &c.checkpoint, "0",
         "classify: checkpoint step (<= 0: the run's latest)"},
    };
    int rc = rf_svc_parse("refinery-loadgen",
                          "Closed-loop load on a unary service method; prints rates and latency "
                          "percentiles as JSON.",
                          opts, sizeof opts / sizeof opts[0], argc, argv);
    if (rc == 1) return 0;
    const method *m = NULL;
    for (size_t i = 0; rc == RF_OK && i < sizeof methods / sizeof methods[0]; i++)
        if (!strcmp(methods[i].name, c.method)) m = &methods[i];
    if (rc == RF_OK && !m) rc = rf_fail(RF_ERR_INVALID, "--method %s: unknown", c.method);
    if (rc == RF_OK && !c.texts_path) rc = rf_fail(RF_ERR_INVALID, "--texts is required");
    if (rc == RF_OK && (c.clients < 1 || c.clients > 1024 || c.batch < 1 || c.batch > 100000 ||
                        c.requests < 0 || c.duration_s <= 0 || c.warmup_s < 0 || c.timeout_s <= 0))
        rc = rf_fail(RF_ERR_INVALID, "a numeric option is out of range (see --help)");
    if (rc < 0) {
        fprintf(stderr, "refinery-loadgen: %s\n", rf_errmsg());
        return 2;
    }
    rc = run(&c, m);
    if (rc < 0) fprintf(stderr, "refinery-loadgen: %s\n", rf_errmsg());
    return rc == RF_OK ? 0 : 1;
}
