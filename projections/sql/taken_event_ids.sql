-- Which of a batch's event ids the archive already holds (asked only after an insert fell short).
SELECT lower(CAST(event_id AS VARCHAR)) AS event_id
FROM archive
WHERE event_id IN (SELECT CAST(event_id AS UUID) FROM batch_event_ids);
