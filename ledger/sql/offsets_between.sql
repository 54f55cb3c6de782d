-- The offsets of one stream's archived events from lo to hi inclusive, with how many events each holds,
-- in order: where to cut the stream into windows of about N events without splitting a message.
-- param topic VARCHAR, partition INTEGER, lo_offset BIGINT, lo_index INTEGER, hi_offset BIGINT, hi_index INTEGER
SELECT "offset", count(*) AS events
FROM archive
WHERE topic = $topic
  AND partition = $partition
  AND "offset" >= $lo_offset
  AND "offset" <= $hi_offset
  AND ("offset" > $lo_offset OR message_index >= $lo_index)
  AND ("offset" < $hi_offset OR message_index <= $hi_index)
GROUP BY "offset"
ORDER BY "offset";
