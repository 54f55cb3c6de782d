-- The projector's read position, committed with the rows it covers.
INSERT INTO consumer_offsets BY NAME
SELECT * FROM batch_consumer_offsets
ON CONFLICT (projection, topic, partition) DO UPDATE
SET next_offset = excluded.next_offset, updated_at = now();
