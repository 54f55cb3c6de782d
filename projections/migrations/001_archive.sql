-- 001: the archive of every event, the projector's read positions, and the dead letters.
--
-- `archive` holds each event verbatim (its canonical JSON, exactly as hashed) with the envelope
-- columns pulled out and where it was read (topic, partition, offset, index within the message).
-- `consumer_offsets` is the projector's own read position, written in the same transaction as the
-- rows it covers: Kafka's committed offsets are never relied on. `dead_letters` keeps every message
-- that could not be projected, with its original bytes and the reason.

CREATE TABLE archive (
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
    event           JSON NOT NULL,
    topic           VARCHAR NOT NULL,
    partition       INTEGER NOT NULL,
    "offset"        BIGINT NOT NULL,
    message_index   INTEGER NOT NULL,
    ingested_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE consumer_offsets (
    projection      VARCHAR NOT NULL,
    topic           VARCHAR NOT NULL,
    partition       INTEGER NOT NULL,
    next_offset     BIGINT NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, topic, partition)
);

CREATE TABLE dead_letters (
    topic           VARCHAR NOT NULL,
    partition       INTEGER NOT NULL,
    "offset"        BIGINT NOT NULL,
    message_key     BLOB,
    original        BLOB,
    headers         JSON,
    timestamp_ms    BIGINT,
    code            VARCHAR NOT NULL,
    reason          VARCHAR NOT NULL,
    run_id          VARCHAR,
    dead_lettered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);
