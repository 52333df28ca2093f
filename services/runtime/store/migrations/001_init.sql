-- Refinery metadata: runs, per-batch stage progress, checkpoints, training
-- metrics and evaluation results. Every write of a batch-derived row is keyed
-- so that a batch replayed after a crash is recognised (ON CONFLICT DO NOTHING).

CREATE TABLE runs (
    id          text PRIMARY KEY,
    spec        text NOT NULL,
    state       text NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    error       text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per (run, stage, batch): counts of that batch through that stage.
CREATE TABLE stage_progress (
    run_id      text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    stage       text NOT NULL,
    batch_seq   bigint NOT NULL CHECK (batch_seq >= 0),
    docs_in     bigint NOT NULL CHECK (docs_in >= 0),
    docs_out    bigint NOT NULL CHECK (docs_out >= 0),
    rejected    bigint NOT NULL CHECK (rejected >= 0),
    duplicate   bigint NOT NULL CHECK (duplicate >= 0),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, stage, batch_seq)
);

CREATE TABLE checkpoints (
    run_id      text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step        bigint NOT NULL CHECK (step >= 0),
    path        text NOT NULL,
    train_loss  double precision,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, step)
);

CREATE TABLE training_metrics (
    run_id      text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step        bigint NOT NULL CHECK (step >= 0),
    name        text NOT NULL,
    value       double precision NOT NULL,
    PRIMARY KEY (run_id, step, name)
);

CREATE TABLE eval_results (
    run_id          text NOT NULL,
    checkpoint_step bigint NOT NULL,
    metric          text NOT NULL,
    value           double precision NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, checkpoint_step, metric),
    FOREIGN KEY (run_id, checkpoint_step) REFERENCES checkpoints (run_id, step) ON DELETE CASCADE
);
