-- 004: what the projector and the named queries need on a large archive (bench/projector.py,
-- bench/archive_queries.py at 10M events).
--
-- `runs.gap_class` is the gap class of the gate that stopped the run (NULL when none did), written with
-- the run: `gap_rates` counts it without joining `gate_decisions`. Backfilled from it here.
--
-- The indexes on `action_key` let the provenance of one key read that key's rows only (an ART lookup
-- for an equality on a constant) instead of scanning every run and field.
--
-- The primary keys of field_provenance, checklist_results, gate_decisions and executions go: their rows
-- are only ever written with a run (or an outcome) the planner found new, in the transaction that
-- writes that run's key (runs.run_id) or its outcome, so they could never refuse a row, and each cost
-- the projector an index insert per row. The tables are rebuilt without them (DuckDB cannot drop a
-- constraint); the analyst view over field_provenance is made again, unchanged.
ALTER TABLE runs ADD COLUMN gap_class VARCHAR;
UPDATE runs SET gap_class = g.gap_class FROM gate_decisions AS g WHERE g.run_id = runs.run_id;
CREATE INDEX runs_action_key ON runs (action_key);

DROP VIEW analyst_field_provenance;
CREATE TABLE field_provenance_v4 (
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
    ingested_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO field_provenance_v4 SELECT * FROM field_provenance;
DROP TABLE field_provenance;
ALTER TABLE field_provenance_v4 RENAME TO field_provenance;

CREATE TABLE checklist_results_v4 (
    run_id          VARCHAR NOT NULL,
    item_index      INTEGER NOT NULL,
    item_id         VARCHAR,
    description     VARCHAR,
    status          VARCHAR,
    source          VARCHAR,
    note            VARCHAR,
    verified_at     VARCHAR,
    item            JSON NOT NULL,
    ingested_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO checklist_results_v4 SELECT * FROM checklist_results;
DROP TABLE checklist_results;
ALTER TABLE checklist_results_v4 RENAME TO checklist_results;

CREATE TABLE gate_decisions_v4 (
    run_id              VARCHAR NOT NULL,
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
INSERT INTO gate_decisions_v4 SELECT * FROM gate_decisions;
DROP TABLE gate_decisions;
ALTER TABLE gate_decisions_v4 RENAME TO gate_decisions;

CREATE TABLE executions_v4 (
    run_id              VARCHAR NOT NULL,
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
INSERT INTO executions_v4 SELECT * FROM executions;
DROP TABLE executions;
ALTER TABLE executions_v4 RENAME TO executions;

CREATE INDEX field_provenance_action_key ON field_provenance (action_key);

CREATE VIEW analyst_field_provenance AS
SELECT
    run_id, field_index, name, action_key, agent_id,
    CASE WHEN value IS NULL THEN NULL ELSE json_type(value) END AS value_type,
    status, source, origin_source, supplied_by, supplied_via, resolved_at, tier,
    segment_index, span_start, span_end, segment_origin, pre_set_origin, measured,
    baseline_run_id, lookup_failed, pending_at_trigger, note
FROM field_provenance;
