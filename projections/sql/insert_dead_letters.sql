-- A message is dead-lettered once per (topic, partition, offset): a redelivery changes nothing. The rows
-- actually inserted come back (in `projections.dlq.DeadLetter` order) to be published before COMMIT.
INSERT INTO dead_letters BY NAME
SELECT * REPLACE (CAST(headers AS JSON) AS headers)
FROM batch_dead_letters
ON CONFLICT DO NOTHING
RETURNING topic, partition, "offset", message_key, original, code, reason;
