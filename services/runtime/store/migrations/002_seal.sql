-- A run's input is sealed once its client says no more documents will come
-- (Control.Seal); downstream stages know they are done when they have caught
-- up with a sealed run (store/store.h: rf_store_stage_complete).

ALTER TABLE runs ADD COLUMN sealed_at timestamptz;

CREATE INDEX runs_created_at ON runs (created_at DESC);
