-- Archived events no digest covers yet whose envelope columns differ from their own stored JSON
-- (covered events need no such check: their row hash covers columns and text alike): one stream's
-- events with position from lo to hi inclusive. occurred_at is left out: its column was parsed in
-- the projector's time zone, which cannot be known here.
-- param topic VARCHAR, partition INTEGER, lo_offset BIGINT, lo_index INTEGER, hi_offset BIGINT, hi_index INTEGER
WITH
extracted AS MATERIALIZED (
    -- one parse per event, every path at once (materialized: not re-parsed for each path below)
    SELECT a.*, TRY(json_extract_string(a.event, [
        '$.event_id', '$.run_id', '$.seq', '$.event_type', '$.schema_version',
        '$.action_key', '$.user_id', '$.agent_id', '$.hash', '$.prev_hash'
    ])) AS j
    FROM archive AS a
    WHERE a.topic = $topic
      AND a.partition = $partition
      AND a."offset" >= $lo_offset
      AND a."offset" <= $hi_offset
      AND (a."offset" > $lo_offset OR a.message_index >= $lo_index)
      AND (a."offset" < $hi_offset OR a.message_index <= $hi_index)
),
uncovered AS (
    SELECT *, j[1] AS j_event_id, j[2] AS j_run_id, j[3] AS j_seq, j[4] AS j_event_type, j[5] AS j_schema_version,
           j[6] AS j_action_key, j[7] AS j_user_id, j[8] AS j_agent_id, j[9] AS j_hash, j[10] AS j_prev_hash
    FROM extracted
),
differing AS (
    SELECT *, concat_ws(', ',
        CASE WHEN lower(j_event_id) IS DISTINCT FROM CAST(event_id AS VARCHAR) THEN 'event_id' END,
        CASE WHEN j_run_id IS DISTINCT FROM run_id THEN 'run_id' END,
        CASE WHEN j_seq IS DISTINCT FROM CAST(seq AS VARCHAR) THEN 'seq' END,
        CASE WHEN j_event_type IS DISTINCT FROM event_type THEN 'event_type' END,
        CASE WHEN j_schema_version IS DISTINCT FROM CAST(schema_version AS VARCHAR) THEN 'schema_version' END,
        CASE WHEN j_action_key IS DISTINCT FROM action_key THEN 'action_key' END,
        CASE WHEN j_user_id IS DISTINCT FROM user_id THEN 'user_id' END,
        CASE WHEN j_agent_id IS DISTINCT FROM agent_id THEN 'agent_id' END,
        CASE WHEN j_hash IS DISTINCT FROM hash THEN 'hash' END,
        CASE WHEN j_prev_hash IS DISTINCT FROM prev_hash THEN 'prev_hash' END
    ) AS columns
    FROM uncovered
)
SELECT 'columns_mismatch' AS kind, topic, partition, "offset", message_index, CAST(event_id AS VARCHAR) AS event_id,
       run_id, seq, 'its ' || columns || ' column(s) differ from its stored JSON' AS detail
FROM differing
WHERE columns <> ''
ORDER BY topic, partition, "offset", message_index;
