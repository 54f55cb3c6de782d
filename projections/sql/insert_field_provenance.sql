-- Rows of runs (or outcomes) the planner found new, written in the same transaction as their run's key:
-- nothing to deduplicate here (migration 004).
INSERT INTO field_provenance BY NAME
SELECT * REPLACE (
    CAST(value AS JSON) AS value,
    TRY_CAST(resolved_at AS TIMESTAMPTZ) AS resolved_at
)
FROM batch_field_provenance;
