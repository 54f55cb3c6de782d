-- How many archived events one stream holds with position from lo to hi inclusive.
-- param topic VARCHAR, partition INTEGER, lo_offset BIGINT, lo_index INTEGER, hi_offset BIGINT, hi_index INTEGER
SELECT count(*)
FROM archive
WHERE topic = $topic
  AND partition = $partition
  AND "offset" >= $lo_offset
  AND "offset" <= $hi_offset
  AND ("offset" > $lo_offset OR message_index >= $lo_index)
  AND ("offset" < $hi_offset OR message_index <= $hi_index);
