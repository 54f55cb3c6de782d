-- reask_loops: per action_key, each episode of runs up to an execute decision or a hold, in log
-- order: how many times the user was asked before it executed (first try: 0; recovered: 1 or more),
-- or how the episode ended otherwise -- held, or abandoned (asked, and no run followed).
-- Runs without an action_key (intent not settled) have no key to loop on and are not counted.
-- param action_key VARCHAR optional: only this action_key
WITH
keyed AS (
    SELECT
        run_id, action_key, started_at, partition, "offset", decision, outcome,
        coalesce(sum(CASE WHEN decision IN ('execute', 'hold') THEN 1 ELSE 0 END) OVER (
            PARTITION BY action_key ORDER BY partition, "offset"
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
        ), 0) AS episode
    FROM runs
    WHERE action_key IS NOT NULL
      AND ($action_key IS NULL OR action_key = $action_key)
),
episodes AS (
    SELECT
        action_key,
        episode,
        count(*) AS runs,
        count(*) FILTER (WHERE decision = 'ask_user') AS asks,
        count(*) FILTER (WHERE decision = 'deferred') AS deferrals,
        min(started_at) AS first_started_at,
        max(started_at) AS last_started_at,
        arg_max(decision, "offset") AS final_decision,
        arg_max(outcome, "offset") AS final_outcome,
        arg_max(run_id, "offset") AS final_run_id
    FROM keyed
    GROUP BY action_key, episode
)
SELECT
    action_key,
    episode,
    runs,
    asks,
    deferrals,
    CASE
        WHEN final_decision = 'execute' THEN coalesce(final_outcome, 'approved')
        WHEN final_decision = 'hold' THEN 'held'
        WHEN final_decision = 'deferred' THEN 'deferred'
        ELSE 'abandoned'
    END AS ended,
    final_decision = 'execute' AND asks = 0 AS first_try,
    final_decision = 'execute' AND asks > 0 AS recovered,
    final_run_id,
    first_started_at,
    last_started_at
FROM episodes
ORDER BY action_key, episode;
