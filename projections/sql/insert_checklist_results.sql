-- Rows of runs (or outcomes) the planner found new, written in the same transaction as their run's key:
-- nothing to deduplicate here (migration 004).
INSERT INTO checklist_results BY NAME
SELECT * REPLACE (CAST(item AS JSON) AS item)
FROM batch_checklist_results;
