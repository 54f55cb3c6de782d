-- The archived events of the runs to check, each run's in `seq` order (ties in log order), with what a
-- `run_closed` states of its run: the rows the run-chain rule (`preflight.chain.RunCursor`) is applied to,
-- in `ledger.store.chain_findings`. No rule here: the rule is defined once, in Python.
-- Scope: every run, or (all_runs false) the runs named in the registered table `ledger_runs(run_id)`.
-- param all_runs BOOLEAN
SELECT
    a.topic, a.partition, a."offset", a.message_index, CAST(a.event_id AS VARCHAR) AS event_id,
    a.run_id, a.seq, a.event_type, a.prev_hash, a.hash,
    -- TRY: an event whose text is no longer JSON (the column retyped and edited) is a finding, not an error
    CASE WHEN a.event_type = 'run_closed' THEN TRY(json_extract_string(a.event, '$.event_count')) END AS close_count,
    CASE WHEN a.event_type = 'run_closed' THEN TRY(json_extract_string(a.event, '$.last_hash')) END AS close_last_hash
FROM archive AS a
WHERE $all_runs OR a.run_id IN (SELECT run_id FROM ledger_runs)
ORDER BY a.run_id, a.seq, a.topic, a.partition, a."offset", a.message_index;
