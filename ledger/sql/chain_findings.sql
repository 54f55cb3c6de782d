-- Every run's chain, structurally (the rules of `preflight.events.verify_run`; each event's hash over
-- its own text is checked in Python, in `ledger.verify`): seq 0, 1, ... without gaps or repeats, each
-- prev_hash the hash of the event before it (64 zeros for the first), a run_closed whose event_count
-- and last_hash match the run, nothing after it but one executed / execution_failed. One row per
-- finding, at the event where the chain breaks (an unclosed run: at its last event).
-- Scope: every run, or (all_runs false) the runs named in the registered table `ledger_runs(run_id)`.
-- param all_runs BOOLEAN
WITH
ordered AS MATERIALIZED (
    SELECT
        a.topic, a.partition, a."offset", a.message_index, CAST(a.event_id AS VARCHAR) AS event_id,
        a.run_id, a.seq, a.event_type, a.prev_hash,
        -- TRY: an event whose text is no longer JSON (the column retyped and edited) is a finding, not an error
        CASE WHEN a.event_type = 'run_closed' THEN TRY(json_extract_string(a.event, '$.event_count')) END AS close_count,
        CASE WHEN a.event_type = 'run_closed' THEN TRY(json_extract_string(a.event, '$.last_hash')) END AS close_last_hash,
        row_number() OVER w - 1 AS position,
        lag(a.hash) OVER w AS previous_hash
    FROM archive AS a
    WHERE $all_runs OR a.run_id IN (SELECT run_id FROM ledger_runs)
    WINDOW w AS (PARTITION BY a.run_id ORDER BY a.seq, a.topic, a.partition, a."offset", a.message_index)
),
runs AS MATERIALIZED (
    SELECT run_id,
           min(position) FILTER (WHERE event_type = 'run_closed') AS close_position,
           max(position) AS last_position
    FROM ordered
    GROUP BY run_id
),
findings AS (
    SELECT 'seq_gap' AS kind, o.*, printf('seq %d where %d was expected', o.seq, o.position) AS detail
    FROM ordered AS o
    WHERE o.seq <> o.position
    UNION ALL
    SELECT 'broken_link', o.*, 'its prev_hash is not the hash of the event before it in its run'
    FROM ordered AS o
    WHERE o.prev_hash IS DISTINCT FROM coalesce(o.previous_hash, repeat('0', 64))
    UNION ALL
    SELECT 'event_after_close', o.*, printf('%s after the run''s run_closed', o.event_type)
    FROM ordered AS o
    JOIN runs AS r ON r.run_id = o.run_id
    WHERE o.position > r.close_position
      AND (o.position <> r.close_position + 1 OR o.event_type NOT IN ('executed', 'execution_failed'))
    UNION ALL
    SELECT 'close_mismatch', o.*, 'run_closed names another event count or last hash than its run has'
    FROM ordered AS o
    JOIN runs AS r ON r.run_id = o.run_id
    WHERE o.position = r.close_position
      AND (o.close_count IS DISTINCT FROM CAST(o.position + 1 AS VARCHAR)
           OR o.close_last_hash IS DISTINCT FROM o.prev_hash)
    UNION ALL
    SELECT 'unclosed_run', o.*, 'the run has no run_closed event (truncated)'
    FROM ordered AS o
    JOIN runs AS r ON r.run_id = o.run_id
    WHERE r.close_position IS NULL AND o.position = r.last_position
)
SELECT kind, topic, partition, "offset", message_index, event_id, run_id, seq, detail
FROM findings
ORDER BY topic, partition, "offset", message_index, kind;
