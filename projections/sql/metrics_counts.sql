-- What the projection database holds, for the projector's metrics (`projections.metrics`): one row per
-- (what, label) with its count. Read in one transaction with the stored offsets, so the counts and the
-- position they cover are one snapshot.
SELECT 'events' AS what, '' AS label, count(*) AS n FROM archive
UNION ALL
SELECT 'runs', decision || '/' || coalesce(gap_class, 'none'), count(*) FROM runs GROUP BY decision, gap_class
UNION ALL
SELECT 'outcomes', outcome, count(*) FROM executions GROUP BY outcome
UNION ALL
SELECT 'dead_letters', code, count(*) FROM dead_letters GROUP BY code;
