-- Forget a projection's read position on a topic: its next run starts from offset 0 and, since
-- every row is keyed by what it projects, adds nothing it already holds.
DELETE FROM consumer_offsets WHERE projection = $projection AND topic = $topic;
