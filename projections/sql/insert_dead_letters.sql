-- A message is dead-lettered once per (topic, partition, offset): a redelivery changes nothing.
INSERT INTO dead_letters BY NAME
SELECT * REPLACE (CAST(headers AS JSON) AS headers)
FROM batch_dead_letters
ON CONFLICT DO NOTHING;
