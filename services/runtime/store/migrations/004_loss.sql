-- Loss detection (issue 15). A sealed run records how many batches with
-- documents its ingest produced, and a stage that finds records of its input
-- deleted before it consumed them (retention) records the range, so that a
-- run whose batches never arrive ends failed with the reason instead of
-- looking like a slow run (stage_loop.h: the run check).

ALTER TABLE runs ADD COLUMN sealed_batches bigint CHECK (sealed_batches >= 0);

CREATE TABLE input_gaps (
    stage       text NOT NULL,
    topic       text NOT NULL,
    partition   integer NOT NULL CHECK (partition >= 0),
    from_offset bigint NOT NULL CHECK (from_offset >= 0),
    to_offset   bigint NOT NULL CHECK (to_offset > from_offset),
    detected_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stage, topic, partition, from_offset)
);
