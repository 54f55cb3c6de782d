-- Archive a batch's events. An event_id already archived changes nothing (ON CONFLICT DO NOTHING);
-- the writer compares the inserted count with the batch's and treats a shortfall as a conflict.
INSERT INTO archive BY NAME
SELECT * REPLACE (
    CAST(event_id AS UUID) AS event_id,
    TRY_CAST(occurred_at AS TIMESTAMPTZ) AS occurred_at,
    CAST(event AS JSON) AS event
)
FROM batch_archive
ON CONFLICT DO NOTHING;
