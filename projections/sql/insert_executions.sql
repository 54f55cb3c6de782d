-- Rows of runs (or outcomes) the planner found new, written in the same transaction as their run's key:
-- nothing to deduplicate here (migration 004).
INSERT INTO executions BY NAME
SELECT * REPLACE (
    CAST(event_id AS UUID) AS event_id,
    TRY_CAST(executed_at AS TIMESTAMPTZ) AS executed_at,
    TRY_CAST(occurred_at AS TIMESTAMPTZ) AS occurred_at
)
FROM batch_executions;
