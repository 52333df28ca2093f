/* Refinery's metrics: every family's name, help and labels in one place
 * (obs.c), and one call per thing worth counting, so an instrumented line in
 * a stage or server stays one line. All of them update the default registry
 * (rf_prom_default), which the services serve at /metrics
 * (runtime/metrics_http.h) and `refinery run --metrics-port` serves too.
 * services/README.md lists the families.
 *
 * Names follow Prometheus conventions: refinery_ prefix, base units
 * (seconds, bytes), counters end in _total. Every call is thread-safe and
 * cheap (a mutex-guarded lookup of the series and an atomic update). */
#ifndef RF_OBS_H
#define RF_OBS_H

#include <stddef.h>
#include <stdint.h>

/* Documents a stage took in, passed on, and rejected (with the reason:
 * "invalid_json", "duplicate", ...). stage: "ingest", "dedup", ... */
void rf_obs_docs_in(const char *stage, double n);
void rf_obs_docs_out(const char *stage, double n);
void rf_obs_docs_rejected(const char *stage, const char *reason, double n);
/* A stage service's batch: documents in, out, and dropped as duplicates
 * (other rejects are counted with their reason where they happen). */
void rf_obs_stage_counts(const char *stage, double in, double out, double duplicate);
/* Seconds one batch took in a stage (the stage loop's poll, an embedded
 * stage's process call). */
void rf_obs_batch_seconds(const char *stage, double seconds);

/* One finished gRPC call: path "/refinery.v1.Ingest/Push", its final status
 * name ("OK", ...) and how long it ran. */
void rf_obs_grpc(const char *path, const char *code, double seconds);

/* The messages of topic/partition not yet consumed by a stage's consumer. */
void rf_obs_kafka_lag(const char *consumer, const char *topic, int32_t partition, int64_t lag);

/* A PostgreSQL statement or connection that failed; what: "query" or "connect". */
void rf_obs_pg_error(const char *what);

/* One optimizer step of the trainer. */
typedef struct rf_obs_train_step {
    double loss, lr, grad_norm;
    double tokens;  /* non-padding tokens in the step */
    double seconds; /* wall time of the step */
    /* The model, for MFU: parameters, layers, hidden size, and the padded
     * sequence length of the step's batches. */
    double nparams, layers, hidden, seq_len;
    double param_bytes; /* parameters, gradients and optimizer moments */
} rf_obs_train_step;
/* Sets the trainer gauges and counters. MFU = achieved FLOP/s / peak FLOP/s,
 * achieved = tokens/s x (6 N + 12 L H T) (forward and backward: 6 per
 * parameter per token, plus attention's QK^T and AV over T positions in L
 * layers of width H, as in the PaLM paper, appendix B); peak from
 * REFINERY_PEAK_FLOPS (FLOP/s of the hardware; unset or 0: the MFU gauge is
 * not written). */
void rf_obs_train_step_done(const rf_obs_train_step *s);

/* An evaluation finished: its accuracy (0..1), macro F1 and example count. */
void rf_obs_eval_done(double accuracy, double macro_f1, double examples);

/* The service's name as a label of refinery_service_info, and the process
 * collectors (resident and peak memory, CPU time, start time); idempotent. */
void rf_obs_init(const char *service);

#endif
