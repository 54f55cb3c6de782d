-- 016: in shadow mode a call makes two runs: the judged run (its decision, keyed) and the run of the call
-- forwarded unchanged (unkeyed `execute`, with the call's outcome). The forwarded run's `run_started`
-- names the judged run (`shadow_of`), kept on its row. A shadow call is one call: `counted_runs` is every
-- run but a forward, and the gap counts read it (over a DuckDB file here; the lake's `gap_daily` reads the
-- same view, projections/lake.py), so each call counts once, as its judged run.
ALTER TABLE runs ADD COLUMN shadow_of VARCHAR;

UPDATE runs
SET shadow_of = json_extract_string(a.event, '$.shadow_of')
FROM archive AS a
WHERE a.run_id = runs.run_id AND a.event_type = 'run_started' AND json_extract_string(a.event, '$.shadow_of') IS NOT NULL;

-- The columns named, not `*`: a later migration's new column of `runs` leaves this view as it is.
CREATE VIEW counted_runs AS
SELECT run_id, started_at, ingested_at, tool, agent_id, decision, gap_class, topic, "partition", "offset"
FROM runs
WHERE shadow_of IS NULL;

CREATE OR REPLACE VIEW gap_day_counts AS
SELECT
    CAST(timezone('UTC', started_at) AS DATE) AS day,
    tool,
    agent_id,
    count(*) AS runs,
    count(*) FILTER (WHERE decision = 'execute') AS executes,
    count(*) FILTER (WHERE gap_class = 'instruction_gap') AS instruction_gaps,
    count(*) FILTER (WHERE gap_class = 'action_definition_gap') AS action_definition_gaps,
    count(*) FILTER (WHERE gap_class = 'configuration_defect') AS configuration_defects,
    count(*) FILTER (WHERE gap_class = 'unmet_condition') AS unmet_conditions,
    count(*) FILTER (WHERE gap_class = 'internal_error') AS internal_errors
FROM counted_runs
GROUP BY ALL;
