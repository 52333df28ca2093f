#include "common/obs.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/prom.h"
#include "common/sys.h"

/* A family of the default registry, looked up once and cached. */
static rf_prom_family *family(_Atomic(rf_prom_family *) *cache, rf_prom_type t, const char *name,
                              const char *help, const char *labels, const double *b, size_t nb) {
    rf_prom_family *f = atomic_load(cache);
    if (!f) {
        f = rf_prom_family_get(rf_prom_default(), t, name, help, labels, b, nb);
        atomic_store(cache, f);
    }
    return f;
}

#define COUNTER(name, help, labels)                                                                \
    ({                                                                                             \
        static _Atomic(rf_prom_family *) c_;                                                       \
        family(&c_, RF_PROM_COUNTER, name, help, labels, NULL, 0);                                 \
    })
#define GAUGE(name, help, labels)                                                                  \
    ({                                                                                             \
        static _Atomic(rf_prom_family *) c_;                                                       \
        family(&c_, RF_PROM_GAUGE, name, help, labels, NULL, 0);                                   \
    })
#define LATENCY(name, help, labels)                                                                \
    ({                                                                                             \
        static _Atomic(rf_prom_family *) c_;                                                       \
        family(&c_, RF_PROM_HISTOGRAM, name, help, labels, rf_prom_latency_buckets,                \
               rf_prom_nlatency_buckets);                                                          \
    })

void rf_obs_docs_in(const char *stage, double n) {
    rf_prom_add(COUNTER("refinery_documents_in_total", "Documents a stage received.", "stage"), n,
                stage);
}

void rf_obs_docs_out(const char *stage, double n) {
    rf_prom_add(COUNTER("refinery_documents_out_total", "Documents a stage passed on.", "stage"), n,
                stage);
}

void rf_obs_docs_rejected(const char *stage, const char *reason, double n) {
    rf_prom_add(COUNTER("refinery_documents_rejected_total",
                        "Documents a stage rejected or dropped, by reason.", "stage,reason"),
                n, stage, reason);
}

void rf_obs_stage_counts(const char *stage, double in, double out, double duplicate) {
    rf_obs_docs_in(stage, in);
    rf_obs_docs_out(stage, out);
    if (duplicate > 0) rf_obs_docs_rejected(stage, "duplicate", duplicate);
}

void rf_obs_batch_seconds(const char *stage, double seconds) {
    rf_prom_observe(LATENCY("refinery_batch_duration_seconds",
                            "Time a stage took to process one batch.", "stage"),
                    seconds, stage);
}

void rf_obs_grpc(const char *path, const char *code, double seconds) {
    /* "/refinery.v1.Ingest/Push" -> service "refinery.v1.Ingest", method "Push" */
    char service[160] = "unknown";
    const char *method = path;
    const char *slash = path ? strrchr(path, '/') : NULL;
    if (slash && path[0] == '/') {
        snprintf(service, sizeof service, "%.*s", (int)(slash - path - 1), path + 1);
        method = slash + 1;
    }
    rf_prom_add(COUNTER("refinery_grpc_server_handled_total",
                        "gRPC calls finished, by service, method and status code.",
                        "grpc_service,grpc_method,grpc_code"),
                1, service, method, code);
    rf_prom_observe(LATENCY("refinery_grpc_server_handling_seconds",
                            "Time from a gRPC call's arrival to its status.",
                            "grpc_service,grpc_method"),
                    seconds, service, method);
}

void rf_obs_kafka_lag(const char *consumer, const char *topic, int32_t partition, int64_t lag) {
    char part[16];
    snprintf(part, sizeof part, "%d", (int)partition);
    rf_prom_set(GAUGE("refinery_kafka_consumer_lag_messages",
                      "Messages of a partition not yet consumed (high watermark minus the next "
                      "offset), as of the consumer's last poll.",
                      "consumer,topic,partition"),
                (double)lag, consumer, topic, part);
}

static rf_prom_family *pg_errors(void) {
    return COUNTER("refinery_postgres_errors_total",
                   "PostgreSQL statements or connections that failed.", "kind");
}

void rf_obs_pg_error(const char *what) {
    rf_prom_add(pg_errors(), 1, what);
}

void rf_obs_train_step_done(const rf_obs_train_step *s) {
    double tps = s->seconds > 0 ? s->tokens / s->seconds : 0;
    double flops_per_token = 6 * s->nparams + 12 * s->layers * s->hidden * s->seq_len;
    rf_prom_add(COUNTER("refinery_trainer_steps_total", "Optimizer steps taken.", NULL), 1);
    rf_prom_add(COUNTER("refinery_trainer_tokens_total", "Non-padding tokens trained on.", NULL),
                s->tokens);
    rf_prom_observe(
        LATENCY("refinery_trainer_step_duration_seconds", "Wall time of one optimizer step.", NULL),
        s->seconds);
    rf_prom_set(GAUGE("refinery_trainer_tokens_per_second",
                      "Non-padding tokens per second in the last step.", NULL),
                tps);
    rf_prom_set(GAUGE("refinery_trainer_loss", "Training loss of the last step.", NULL), s->loss);
    rf_prom_set(GAUGE("refinery_trainer_learning_rate", "Learning rate of the last step.", NULL),
                s->lr);
    rf_prom_set(GAUGE("refinery_trainer_grad_norm",
                      "Global gradient L2 norm of the last step (before clipping).", NULL),
                s->grad_norm);
    rf_prom_set(GAUGE("refinery_trainer_model_flops",
                      "Training FLOP/s of the last step: tokens/s x (6 N + 12 L H T).", NULL),
                tps * flops_per_token);
    rf_prom_set(GAUGE("refinery_trainer_parameter_memory_bytes",
                      "Bytes of parameters, gradients and optimizer moments.", NULL),
                s->param_bytes);
    static double peak = -1;
    if (peak < 0) {
        const char *e = getenv("REFINERY_PEAK_FLOPS");
        peak = e ? strtod(e, NULL) : 0;
        if (!(peak > 0)) peak = 0;
    }
    if (peak > 0)
        rf_prom_set(GAUGE("refinery_trainer_mfu_ratio",
                          "Model FLOPs utilization: refinery_trainer_model_flops over "
                          "REFINERY_PEAK_FLOPS.",
                          NULL),
                    tps * flops_per_token / peak);
}

void rf_obs_eval_done(double accuracy, double macro_f1, double examples) {
    rf_prom_add(COUNTER("refinery_evaluator_evaluations_total", "Evaluations finished.", NULL), 1);
    rf_prom_set(GAUGE("refinery_evaluator_last_accuracy",
                      "Accuracy (0..1) of the last finished evaluation.", NULL),
                accuracy);
    rf_prom_set(GAUGE("refinery_evaluator_last_macro_f1",
                      "Macro-averaged F1 of the last finished evaluation.", NULL),
                macro_f1);
    rf_prom_set(GAUGE("refinery_evaluator_last_examples",
                      "Examples in the last finished evaluation.", NULL),
                examples);
}

static double start_time;

/* Refreshed at every scrape. */
static void collect_process(rf_prom *r, void *user) {
    (void)user;
    long pages = 0, page = sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        long size;
        if (fscanf(f, "%ld %ld", &size, &pages) != 2) pages = 0;
        fclose(f);
    }
    rf_prom_set(rf_prom_family_get(r, RF_PROM_GAUGE, "process_resident_memory_bytes",
                                   "Resident memory size in bytes.", NULL, NULL, 0),
                (double)pages * (double)page);
    rf_prom_set(rf_prom_family_get(r, RF_PROM_GAUGE, "refinery_process_peak_resident_memory_bytes",
                                   "Peak resident memory size in bytes.", NULL, NULL, 0),
                (double)rf_peak_rss_kb() * 1024.0);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
                     (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
        rf_prom_family *c =
            rf_prom_family_get(r, RF_PROM_COUNTER, "process_cpu_seconds_total",
                               "Total user and system CPU time in seconds.", NULL, NULL, 0);
        rf_prom_set(c, cpu);
    }
    rf_prom_set(rf_prom_family_get(r, RF_PROM_GAUGE, "process_start_time_seconds",
                                   "Start time of the process since the Unix epoch in seconds.",
                                   NULL, NULL, 0),
                start_time);
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_collectors(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    start_time = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    rf_prom_on_collect(rf_prom_default(), collect_process, NULL);
}

void rf_obs_init(const char *service) {
    pthread_once(&init_once, init_collectors);
    /* Known label values start at 0, so that a rate() over them works from
     * the first scrape (and the family is there before the first error). */
    rf_prom_add(pg_errors(), 0, "query");
    rf_prom_add(pg_errors(), 0, "connect");
    rf_prom_set(
        GAUGE("refinery_service_info", "Always 1; the service label names the process.", "service"),
        1, service);
}
