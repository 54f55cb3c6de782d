-- Rows one database holds and the other does not, per table, ignoring ingest timestamps (and the
-- projection name of the read positions). Both databases are attached as `left_db` and `right_db`.
WITH
archive_l AS (SELECT * EXCLUDE (ingested_at) FROM left_db.archive EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM right_db.archive),
archive_r AS (SELECT * EXCLUDE (ingested_at) FROM right_db.archive EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM left_db.archive),
runs_l AS (SELECT * EXCLUDE (ingested_at) FROM left_db.runs EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM right_db.runs),
runs_r AS (SELECT * EXCLUDE (ingested_at) FROM right_db.runs EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM left_db.runs),
fields_l AS (SELECT * EXCLUDE (ingested_at) FROM left_db.field_provenance EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM right_db.field_provenance),
fields_r AS (SELECT * EXCLUDE (ingested_at) FROM right_db.field_provenance EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM left_db.field_provenance),
checklist_l AS (SELECT * EXCLUDE (ingested_at) FROM left_db.checklist_results EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM right_db.checklist_results),
checklist_r AS (SELECT * EXCLUDE (ingested_at) FROM right_db.checklist_results EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM left_db.checklist_results),
gates_l AS (SELECT * EXCLUDE (ingested_at) FROM left_db.gate_decisions EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM right_db.gate_decisions),
gates_r AS (SELECT * EXCLUDE (ingested_at) FROM right_db.gate_decisions EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM left_db.gate_decisions),
executions_l AS (SELECT * EXCLUDE (ingested_at) FROM left_db.executions EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM right_db.executions),
executions_r AS (SELECT * EXCLUDE (ingested_at) FROM right_db.executions EXCEPT ALL SELECT * EXCLUDE (ingested_at) FROM left_db.executions),
dead_l AS (SELECT * EXCLUDE (dead_lettered_at) FROM left_db.dead_letters EXCEPT ALL SELECT * EXCLUDE (dead_lettered_at) FROM right_db.dead_letters),
dead_r AS (SELECT * EXCLUDE (dead_lettered_at) FROM right_db.dead_letters EXCEPT ALL SELECT * EXCLUDE (dead_lettered_at) FROM left_db.dead_letters),
offsets_l AS (SELECT * EXCLUDE (projection, updated_at) FROM left_db.consumer_offsets EXCEPT ALL SELECT * EXCLUDE (projection, updated_at) FROM right_db.consumer_offsets),
offsets_r AS (SELECT * EXCLUDE (projection, updated_at) FROM right_db.consumer_offsets EXCEPT ALL SELECT * EXCLUDE (projection, updated_at) FROM left_db.consumer_offsets)
SELECT 'archive' AS table_name, (SELECT count(*) FROM archive_l) AS only_left, (SELECT count(*) FROM archive_r) AS only_right
UNION ALL SELECT 'runs', (SELECT count(*) FROM runs_l), (SELECT count(*) FROM runs_r)
UNION ALL SELECT 'field_provenance', (SELECT count(*) FROM fields_l), (SELECT count(*) FROM fields_r)
UNION ALL SELECT 'checklist_results', (SELECT count(*) FROM checklist_l), (SELECT count(*) FROM checklist_r)
UNION ALL SELECT 'gate_decisions', (SELECT count(*) FROM gates_l), (SELECT count(*) FROM gates_r)
UNION ALL SELECT 'executions', (SELECT count(*) FROM executions_l), (SELECT count(*) FROM executions_r)
UNION ALL SELECT 'dead_letters', (SELECT count(*) FROM dead_l), (SELECT count(*) FROM dead_r)
UNION ALL SELECT 'consumer_offsets', (SELECT count(*) FROM offsets_l), (SELECT count(*) FROM offsets_r);
