-- The runs counted by UTC day, tool, agent and gap class: what `gap_rates` reads. Over a DuckDB file it
-- counts `runs`; the lake (projections/lake.py) defines the same view over `gap_daily`, the counts kept as
-- runs arrive, so that a day's rates read the day's aggregate rather than its runs.
CREATE VIEW gap_day_counts AS
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
FROM runs
GROUP BY ALL;
