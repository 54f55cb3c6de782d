-- One stream's archived events with position (offset, message_index) from lo to hi inclusive, with the
-- columns a span's rows_hash and row hashes cover (`ledger.digest.ROW_COLUMNS`), in storage order
-- (the caller sorts them into log order: sorting 700-byte rows here costs more than in Arrow).
-- The plain range on "offset" lets DuckDB skip row groups by their min/max.
-- param topic VARCHAR, partition INTEGER, lo_offset BIGINT, lo_index INTEGER, hi_offset BIGINT, hi_index INTEGER
SELECT
    "offset",
    message_index,
    CAST(event_id AS VARCHAR) AS event_id,
    run_id,
    seq,
    event_type,
    schema_version,
    action_key,
    user_id,
    agent_id,
    epoch_us(occurred_at) AS occurred_at_us,
    hash,
    prev_hash,
    CAST(event AS VARCHAR) AS event
FROM archive
WHERE topic = $topic
  AND partition = $partition
  AND "offset" >= $lo_offset
  AND "offset" <= $hi_offset
  AND ("offset" > $lo_offset OR message_index >= $lo_index)
  AND ("offset" < $hi_offset OR message_index <= $hi_index);
