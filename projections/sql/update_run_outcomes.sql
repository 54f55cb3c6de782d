-- An outcome (executed / execution_failed / effect_unknown, or the read-back that settles an effect_unknown)
-- for a run stored by an earlier batch.
UPDATE runs
SET outcome = u.outcome,
    outcome_at = TRY_CAST(u.outcome_at AS TIMESTAMPTZ),
    event_count = u.event_count,
    last_seq = u.last_seq,
    last_hash = u.last_hash
FROM batch_run_outcomes AS u
WHERE runs.run_id = u.run_id
  AND (runs.outcome IS NULL OR runs.outcome = 'effect_unknown');
