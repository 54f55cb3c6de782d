-- gap_rates: instruction-gap vs action-definition-gap rates, and the other gap classes, by UTC day,
-- tool (as the runtime selected it) and agent. The denominator is every run in the group, whatever
-- its decision; a run counts in at most one class (the gate that stopped it, `runs.gap_class`, written
-- with the run: no join), counted in `gap_day_counts`. A shadow-mode call counts once, as its judged run:
-- the run of the call forwarded in its stead is not counted (`counted_runs`, migration 016).
-- param from_day DATE optional: first UTC day included
-- param to_day DATE optional: last UTC day included
WITH
scoped AS (
    -- the runs counted by day, tool, agent and class (migration 013): over the lake, the day's aggregate
    SELECT *
    FROM gap_day_counts
    WHERE ($from_day IS NULL OR day >= CAST($from_day AS DATE))
      AND ($to_day IS NULL OR day <= CAST($to_day AS DATE))
)
SELECT
    day,
    tool,
    agent_id,
    runs,
    executes,
    instruction_gaps,
    action_definition_gaps,
    configuration_defects,
    unmet_conditions,
    internal_errors,
    round(instruction_gaps / runs, 4) AS instruction_gap_rate,
    round(action_definition_gaps / runs, 4) AS action_definition_gap_rate,
    round(configuration_defects / runs, 4) AS configuration_defect_rate,
    round(unmet_conditions / runs, 4) AS unmet_condition_rate,
    round(internal_errors / runs, 4) AS internal_error_rate
FROM scoped
ORDER BY day, tool NULLS LAST, agent_id NULLS LAST;
