-- The projection database's current schema, generated from a fresh file migrated by `open_database`.
-- Do not edit: add a migration (projections/migrations/), then run `python -m projections.schema`.
-- Migrations applied:
--   001_archive.sql
--   002_projections.sql
--   003_analyst_views.sql
--   004_query_paths.sql
--   005_signed_decisions.sql
--   006_archive_zstd.sql
--   007_readable_action_key.sql
--   008_proposal.sql
--   009_projector_starts.sql
--   010_answer_origin.sql
--   013_gap_day_counts.sql
--   016_shadow_of.sql

-- table archive
CREATE TABLE archive (
    event_id UUID PRIMARY KEY,
    run_id VARCHAR NOT NULL,
    seq INTEGER NOT NULL,
    event_type VARCHAR NOT NULL,
    schema_version INTEGER NOT NULL,
    action_key VARCHAR,
    user_id VARCHAR,
    agent_id VARCHAR,
    occurred_at TIMESTAMP WITH TIME ZONE,
    hash VARCHAR NOT NULL,
    prev_hash VARCHAR NOT NULL,
    "event" JSON USING COMPRESSION ZSTD NOT NULL,
    topic VARCHAR NOT NULL,
    "partition" INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    message_index INTEGER NOT NULL,
    ingested_at TIMESTAMP WITH TIME ZONE DEFAULT(now()) NOT NULL
);

-- table checklist_results
CREATE TABLE checklist_results (
    run_id VARCHAR NOT NULL,
    item_index INTEGER NOT NULL,
    item_id VARCHAR,
    description VARCHAR,
    status VARCHAR,
    "source" VARCHAR,
    note VARCHAR,
    verified_at VARCHAR,
    item JSON NOT NULL,
    ingested_at TIMESTAMP WITH TIME ZONE DEFAULT(now()) NOT NULL
);

-- table consumer_offsets
CREATE TABLE consumer_offsets (
    projection VARCHAR,
    topic VARCHAR,
    "partition" INTEGER,
    next_offset BIGINT NOT NULL,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT(now()) NOT NULL,
    PRIMARY KEY(projection, topic, "partition")
);

-- table dead_letters
CREATE TABLE dead_letters (
    topic VARCHAR,
    "partition" INTEGER,
    "offset" BIGINT,
    message_key BLOB,
    original BLOB,
    headers JSON,
    timestamp_ms BIGINT,
    code VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,
    run_id VARCHAR,
    dead_lettered_at TIMESTAMP WITH TIME ZONE DEFAULT(now()) NOT NULL,
    PRIMARY KEY(topic, "partition", "offset")
);

-- table executions
CREATE TABLE executions (
    run_id VARCHAR NOT NULL,
    event_id UUID NOT NULL,
    decision_id VARCHAR NOT NULL,
    action_key VARCHAR,
    user_id VARCHAR,
    agent_id VARCHAR,
    tool VARCHAR NOT NULL,
    outcome VARCHAR NOT NULL,
    arguments_digest VARCHAR NOT NULL,
    result_digest VARCHAR,
    error_type VARCHAR,
    "error" VARCHAR,
    reason VARCHAR,
    executed_at TIMESTAMP WITH TIME ZONE,
    occurred_at TIMESTAMP WITH TIME ZONE,
    ingested_at TIMESTAMP WITH TIME ZONE DEFAULT(now()) NOT NULL
);

-- table field_provenance
CREATE TABLE field_provenance (
    run_id VARCHAR NOT NULL,
    field_index INTEGER NOT NULL,
    "name" VARCHAR NOT NULL,
    action_key VARCHAR,
    user_id VARCHAR,
    agent_id VARCHAR,
    "value" JSON,
    status VARCHAR NOT NULL,
    "source" VARCHAR,
    origin_source VARCHAR,
    supplied_by VARCHAR,
    supplied_via VARCHAR,
    resolved_at TIMESTAMP WITH TIME ZONE,
    tier VARCHAR,
    segment_index INTEGER,
    span_start INTEGER,
    span_end INTEGER,
    segment_origin VARCHAR,
    pre_set_origin VARCHAR,
    measured BOOLEAN,
    baseline VARCHAR,
    baseline_run_id VARCHAR,
    baseline_timestamp VARCHAR,
    lookup_failed BOOLEAN NOT NULL,
    pending_at_trigger BOOLEAN NOT NULL,
    note VARCHAR,
    ingested_at TIMESTAMP WITH TIME ZONE DEFAULT(now()) NOT NULL,
    proposal VARCHAR,
    answer_origin VARCHAR
);

-- table gate_decisions
CREATE TABLE gate_decisions (
    run_id VARCHAR NOT NULL,
    action_key VARCHAR,
    user_id VARCHAR,
    agent_id VARCHAR,
    tool VARCHAR,
    gate_name VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    decision VARCHAR NOT NULL,
    gap_class VARCHAR NOT NULL,
    unknown_fields VARCHAR[] NOT NULL,
    unverified_items VARCHAR[] NOT NULL,
    gate JSON,
    occurred_at TIMESTAMP WITH TIME ZONE,
    "day" DATE,
    ingested_at TIMESTAMP WITH TIME ZONE DEFAULT(now()) NOT NULL
);

-- table projector_starts
CREATE TABLE projector_starts (
    projection VARCHAR NOT NULL,
    started_at TIMESTAMP WITH TIME ZONE DEFAULT(now()) NOT NULL,
    pid INTEGER
);

-- table runs
CREATE TABLE runs (
    run_id VARCHAR PRIMARY KEY,
    action_key VARCHAR,
    user_id VARCHAR,
    agent_id VARCHAR,
    tool VARCHAR,
    tool_digest VARCHAR,
    has_input_schema BOOLEAN,
    intent_fingerprint VARCHAR,
    intent_attempt INTEGER,
    tool_attempt INTEGER,
    phase VARCHAR,
    c1_when_case VARCHAR,
    c2_user_action_name VARCHAR,
    c2_source VARCHAR,
    c3_provider_action_name VARCHAR,
    c3_approved BOOLEAN,
    c3_reason VARCHAR,
    fixed_issues JSON,
    decision VARCHAR NOT NULL,
    reason VARCHAR,
    unknown_count INTEGER,
    unverified_count INTEGER,
    fields_computed BOOLEAN,
    decision_id VARCHAR,
    arguments_digest VARCHAR,
    started_at TIMESTAMP WITH TIME ZONE,
    closed_at TIMESTAMP WITH TIME ZONE,
    closing_event_count INTEGER NOT NULL,
    close_hash VARCHAR NOT NULL,
    event_count INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    last_hash VARCHAR NOT NULL,
    outcome VARCHAR,
    outcome_at TIMESTAMP WITH TIME ZONE,
    topic VARCHAR NOT NULL,
    "partition" INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    ingested_at TIMESTAMP WITH TIME ZONE DEFAULT(now()) NOT NULL,
    gap_class VARCHAR,
    decision_tool VARCHAR,
    decision_key_id VARCHAR,
    decision_algorithm VARCHAR,
    decision_issued_at VARCHAR,
    decision_expires_at VARCHAR,
    decision_nonce VARCHAR,
    decision_signature VARCHAR,
    decision_signature_check VARCHAR,
    decision_signature_problem VARCHAR,
    readable_action_key VARCHAR,
    shadow_of VARCHAR
);

-- table schema_migrations
CREATE TABLE schema_migrations (
    "version" INTEGER PRIMARY KEY,
    "name" VARCHAR NOT NULL,
    checksum VARCHAR NOT NULL,
    applied_at TIMESTAMP WITH TIME ZONE DEFAULT(now()) NOT NULL
);

-- view analyst_field_provenance
CREATE VIEW analyst_field_provenance AS
SELECT
    run_id,
    field_index,
    "name",
    action_key,
    agent_id,
    CASE  WHEN (("value" IS NULL)) THEN (NULL) ELSE json_type("value") END AS value_type,
    status,
    "source",
    origin_source,
    supplied_by,
    supplied_via,
    resolved_at,
    tier,
    segment_index,
    span_start,
    span_end,
    segment_origin,
    pre_set_origin,
    measured,
    baseline_run_id,
    lookup_failed,
    pending_at_trigger,
    note
FROM field_provenance;

-- view counted_runs
CREATE VIEW counted_runs AS
SELECT
    run_id,
    started_at,
    ingested_at,
    tool,
    agent_id,
    decision,
    gap_class,
    topic,
    "partition",
    "offset"
FROM runs WHERE (shadow_of IS NULL);

-- view gap_day_counts
CREATE VIEW gap_day_counts AS
SELECT
    CAST(timezone('UTC', started_at) AS DATE) AS "day",
    tool,
    agent_id,
    count_star() AS runs,
    count_star() FILTER (WHERE (decision = 'execute')) AS executes,
    count_star() FILTER (WHERE (gap_class = 'instruction_gap')) AS instruction_gaps,
    count_star() FILTER (WHERE (gap_class = 'action_definition_gap')) AS action_definition_gaps,
    count_star() FILTER (WHERE (gap_class = 'configuration_defect')) AS configuration_defects,
    count_star() FILTER (WHERE (gap_class = 'unmet_condition')) AS unmet_conditions,
    count_star() FILTER (WHERE (gap_class = 'internal_error')) AS internal_errors
FROM counted_runs GROUP BY ALL;

-- index field_provenance_action_key
CREATE INDEX field_provenance_action_key ON field_provenance(action_key);

-- index runs_action_key
CREATE INDEX runs_action_key ON runs(action_key);
