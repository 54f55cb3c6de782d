SELECT partition, next_offset
FROM consumer_offsets
WHERE projection = $projection AND topic = $topic
ORDER BY partition;
