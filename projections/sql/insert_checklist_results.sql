INSERT INTO checklist_results BY NAME
SELECT * REPLACE (CAST(item AS JSON) AS item)
FROM batch_checklist_results
ON CONFLICT DO NOTHING;
