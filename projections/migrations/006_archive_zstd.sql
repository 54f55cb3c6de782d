-- 006: the archive's `event` column (each event's canonical JSON, ~85% of the archive's bytes) is
-- compressed with zstd instead of what DuckDB picks by itself for text (dictionary + FSST).
--
-- Measured on bench/projector.py's 200k events (DuckDB 2.0, one thread): the column took 1.19 s to
-- compress into 74 MB with DuckDB's choice, 0.42 s into 19 MB with zstd; a scan reading every value
-- took about as long either way (0.09 s). The projector's writer compresses a row group as it fills and
-- the rest at COMMIT, on its one thread: this was the largest part of its time.
--
-- DuckDB sets a column's compression only when the table is made: the archive is rebuilt, unchanged
-- otherwise (the same columns in the same order, its key, its defaults). On a large archive this copies
-- every row once (minutes at 10M events).
CREATE TABLE archive_v6 (
    event_id        UUID PRIMARY KEY,
    run_id          VARCHAR NOT NULL,
    seq             INTEGER NOT NULL,
    event_type      VARCHAR NOT NULL,
    schema_version  INTEGER NOT NULL,
    action_key      VARCHAR,
    user_id         VARCHAR,
    agent_id        VARCHAR,
    occurred_at     TIMESTAMPTZ,
    hash            VARCHAR NOT NULL,
    prev_hash       VARCHAR NOT NULL,
    event           JSON NOT NULL USING COMPRESSION zstd,
    topic           VARCHAR NOT NULL,
    partition       INTEGER NOT NULL,
    "offset"        BIGINT NOT NULL,
    message_index   INTEGER NOT NULL,
    ingested_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO archive_v6 SELECT * FROM archive;
DROP TABLE archive;
ALTER TABLE archive_v6 RENAME TO archive;
