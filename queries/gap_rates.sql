-- gap_rates: instruction-gap vs action-definition-gap rates, and the other gap classes, by UTC day,
-- tool (as the runtime selected it) and agent. The denominator is every run in the group, whatever
-- its decision; a run counts in at most one class (the gate that stopped it, `runs.gap_class`, written
-- with the run: no join).
-- param from_day DATE optional: first UTC day included
-- param to_day DATE optional: last UTC day included
WITH
classified AS (
    SELECT CAST(timezone('UTC', started_at) AS DATE) AS day, tool, agent_id, decision, gap_class
    FROM runs
),
scoped AS (
    SELECT *
    FROM classified
    WHERE ($from_day IS NULL OR day >= CAST($from_day AS DATE))
      AND ($to_day IS NULL OR day <= CAST($to_day AS DATE))
)
SELECT
    day,
    tool,
    agent_id,
    count(*) AS runs,
    count(*) FILTER (WHERE decision = 'execute') AS executes,
    count(*) FILTER (WHERE gap_class = 'instruction_gap') AS instruction_gaps,
    count(*) FILTER (WHERE gap_class = 'action_definition_gap') AS action_definition_gaps,
    count(*) FILTER (WHERE gap_class = 'configuration_defect') AS configuration_defects,
    count(*) FILTER (WHERE gap_class = 'unmet_condition') AS unmet_conditions,
    count(*) FILTER (WHERE gap_class = 'internal_error') AS internal_errors,
    round(count(*) FILTER (WHERE gap_class = 'instruction_gap') / count(*), 4) AS instruction_gap_rate,
    round(count(*) FILTER (WHERE gap_class = 'action_definition_gap') / count(*), 4) AS action_definition_gap_rate,
    round(count(*) FILTER (WHERE gap_class = 'configuration_defect') / count(*), 4) AS configuration_defect_rate,
    round(count(*) FILTER (WHERE gap_class = 'unmet_condition') / count(*), 4) AS unmet_condition_rate,
    round(count(*) FILTER (WHERE gap_class = 'internal_error') / count(*), 4) AS internal_error_rate
FROM scoped
GROUP BY day, tool, agent_id
ORDER BY day, tool NULLS LAST, agent_id NULLS LAST;
