-- Liveness: every service process writes a heartbeat row every few seconds
-- (runtime/ready.h: the readiness thread, after each probe), with whether its
-- dependencies answered. Control reads the newest beat per service to tell a
-- stage that is down from one that is slow (store.h: rf_store_liveness); a
-- stage's last progress per run is its newest stage_progress row (and, for
-- the trainer and the evaluator, checkpoints and eval_results).
CREATE TABLE heartbeats (
    service     text NOT NULL,       -- ingest, dedup, tokenizer, trainer, evaluator
    instance    text NOT NULL,       -- host:pid
    started_at  timestamptz NOT NULL,
    beat_at     timestamptz NOT NULL DEFAULT now(),
    ready       boolean NOT NULL,
    reason      text NOT NULL DEFAULT '',  -- why not ready
    PRIMARY KEY (service, instance)
);
