-- 002: the projections compliance teams and analysts query, one row per run / field / item / gate /
-- outcome. Every row is derived from archived events only; `replay` rebuilds them from offset 0.

CREATE TABLE runs (
    run_id                  VARCHAR PRIMARY KEY,
    action_key              VARCHAR,
    user_id                 VARCHAR,
    agent_id                VARCHAR,
    tool                    VARCHAR,        -- the tool the calling runtime selected (run_started)
    tool_digest             VARCHAR,
    has_input_schema        BOOLEAN,
    intent_fingerprint      VARCHAR,
    intent_attempt          INTEGER,
    tool_attempt            INTEGER,
    phase                   VARCHAR,
    c1_when_case            VARCHAR,
    c2_user_action_name     VARCHAR,
    c2_source               VARCHAR,
    c3_provider_action_name VARCHAR,
    c3_approved             BOOLEAN,
    c3_reason               VARCHAR,
    fixed_issues            JSON,
    decision                VARCHAR NOT NULL,   -- execute | ask_user | hold | deferred
    reason                  VARCHAR,
    unknown_count           INTEGER,
    unverified_count        INTEGER,
    fields_computed         BOOLEAN,
    decision_id             VARCHAR,
    arguments_digest        VARCHAR,
    started_at              TIMESTAMPTZ,
    closed_at               TIMESTAMPTZ,
    closing_event_count     INTEGER NOT NULL,   -- what run_closed says the run has
    close_hash              VARCHAR NOT NULL,   -- hash of run_closed (a redelivered run matches it)
    event_count             INTEGER NOT NULL,   -- events archived for the run (outcome included)
    last_seq                INTEGER NOT NULL,
    last_hash               VARCHAR NOT NULL,   -- an outcome must link to this
    outcome                 VARCHAR,            -- executed | failed | NULL (none recorded)
    outcome_at              TIMESTAMPTZ,
    topic                   VARCHAR NOT NULL,
    partition               INTEGER NOT NULL,
    "offset"                BIGINT NOT NULL,
    ingested_at             TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE field_provenance (
    run_id              VARCHAR NOT NULL,
    field_index         INTEGER NOT NULL,
    name                VARCHAR NOT NULL,
    action_key          VARCHAR,
    user_id             VARCHAR,
    agent_id            VARCHAR,
    value               JSON,               -- NULL when unknown; JSON null is a known null
    status              VARCHAR NOT NULL,   -- known | unknown
    source              VARCHAR,            -- where this run read it
    origin_source       VARCHAR,            -- who created it (inherited through prior_state)
    supplied_by         VARCHAR,            -- party of origin_source: user | pre_set | system
    supplied_via        VARCHAR,            -- answer | instruction | pre_set | measurement | inherited
    resolved_at         TIMESTAMPTZ,
    tier                VARCHAR,
    segment_index       INTEGER,
    span_start          INTEGER,
    span_end            INTEGER,
    segment_origin      VARCHAR,
    pre_set_origin      VARCHAR,
    measured            BOOLEAN,
    baseline            VARCHAR,            -- the baseline load status the engine reported
    baseline_run_id     VARCHAR,            -- the executed run a prior_state value came from
    baseline_timestamp  VARCHAR,
    lookup_failed       BOOLEAN NOT NULL,
    pending_at_trigger  BOOLEAN NOT NULL,
    note                VARCHAR,
    ingested_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, name)
);

CREATE TABLE checklist_results (
    run_id          VARCHAR NOT NULL,
    item_index      INTEGER NOT NULL,
    item_id         VARCHAR,
    description     VARCHAR,
    status          VARCHAR,
    source          VARCHAR,
    note            VARCHAR,
    verified_at     VARCHAR,
    item            JSON NOT NULL,
    ingested_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, item_index)
);

CREATE TABLE gate_decisions (
    run_id              VARCHAR PRIMARY KEY,
    action_key          VARCHAR,
    user_id             VARCHAR,
    agent_id            VARCHAR,
    tool                VARCHAR,
    gate_name           VARCHAR NOT NULL,
    kind                VARCHAR NOT NULL,
    decision            VARCHAR NOT NULL,   -- ask_user | hold
    gap_class           VARCHAR NOT NULL,
    unknown_fields      VARCHAR[] NOT NULL,
    unverified_items    VARCHAR[] NOT NULL,
    gate                JSON,
    occurred_at         TIMESTAMPTZ,
    day                 DATE,               -- UTC day of occurred_at
    ingested_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE executions (
    run_id              VARCHAR PRIMARY KEY,
    event_id            UUID NOT NULL,
    decision_id         VARCHAR NOT NULL,
    action_key          VARCHAR,
    user_id             VARCHAR,
    agent_id            VARCHAR,
    tool                VARCHAR NOT NULL,
    outcome             VARCHAR NOT NULL,   -- executed | failed
    arguments_digest    VARCHAR NOT NULL,
    result_digest       VARCHAR,
    error_type          VARCHAR,
    error               VARCHAR,
    reason              VARCHAR,
    executed_at         TIMESTAMPTZ,        -- the outcome's own timestamp
    occurred_at         TIMESTAMPTZ,
    ingested_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);
