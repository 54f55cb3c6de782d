-- New runs of a batch (the planner has already left out runs the projection holds).
INSERT INTO runs BY NAME
SELECT * REPLACE (
    CAST(fixed_issues AS JSON) AS fixed_issues,
    TRY_CAST(started_at AS TIMESTAMPTZ) AS started_at,
    TRY_CAST(closed_at AS TIMESTAMPTZ) AS closed_at,
    TRY_CAST(outcome_at AS TIMESTAMPTZ) AS outcome_at
)
FROM batch_runs
ON CONFLICT DO NOTHING;
