-- Runs whose inputs the ingest service reads itself (Ingest.Load): one row
-- per run, written when the load is accepted. batch_docs is fixed then, so
-- that a loader restarted after a crash numbers its batches as before and
-- resumes after the last batch recorded in stage_progress (stage 'ingest').
CREATE TABLE loads (
    run_id      text PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    input_root  text NOT NULL,
    batch_docs  integer NOT NULL CHECK (batch_docs > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);
