-- New runs of a batch. The planner has left out every run the projection holds (or the batches of the
-- open transaction add): a run_id stored already fails the statement (the key of runs), and the batch
-- is rolled back. No ON CONFLICT DO NOTHING: it would skip the run's row silently and keep its other
-- rows, and it cost the writer a quarter of this statement's time.
INSERT INTO runs BY NAME
SELECT * REPLACE (
    CAST(fixed_issues AS JSON) AS fixed_issues,
    TRY_CAST(started_at AS TIMESTAMPTZ) AS started_at,
    TRY_CAST(closed_at AS TIMESTAMPTZ) AS closed_at,
    TRY_CAST(outcome_at AS TIMESTAMPTZ) AS outcome_at
)
FROM batch_runs;
