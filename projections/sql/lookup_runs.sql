-- What the planner needs of stored runs that a batch mentions (columns in StoredRun order).
-- `projections.store.lookup_runs` adds the WHERE clause: a few ids are probed through the key of
-- `runs`, many are joined against a scan of it.
SELECT run_id, action_key, decision, close_hash, last_seq, last_hash, event_count, outcome,
       decision_id, decision_tool AS tool, arguments_digest,
       decision_issued_at, decision_expires_at, decision_signature_check, decision_signature_problem
FROM runs
