-- One stream's newest two digests (the head and the one it links to), newest first, and how many it has.
-- param topic VARCHAR, partition INTEGER
SELECT topic, partition, digest_seq, body, signature, entries, count(*) OVER () AS digests
FROM ledger_digests
WHERE topic = $topic AND partition = $partition
ORDER BY digest_seq DESC
LIMIT 2;
