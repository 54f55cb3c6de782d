-- id_prefix: the run ids and decision ids that start with a given text (a short id as tables show it),
-- at most three of each, so that a caller can tell a unique prefix from an ambiguous one.
-- param prefix VARCHAR: the start of a run id or a decision id
(SELECT 'run_id' AS kind, run_id AS id FROM runs WHERE starts_with(run_id, $prefix) ORDER BY run_id LIMIT 3)
UNION ALL
(SELECT 'decision_id', decision_id FROM runs
 WHERE decision_id IS NOT NULL AND starts_with(decision_id, $prefix) ORDER BY decision_id LIMIT 3)
ORDER BY kind, id;
