-- One stream's digests in chain order.
-- param topic VARCHAR, partition INTEGER
SELECT topic, partition, digest_seq, body, signature, entries
FROM ledger_digests
WHERE topic = $topic AND partition = $partition
ORDER BY digest_seq;
