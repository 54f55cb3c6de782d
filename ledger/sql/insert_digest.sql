-- File one signed digest. The primary key refuses a second digest with the same number.
-- param topic VARCHAR, partition INTEGER, digest_seq BIGINT, body VARCHAR, signature VARCHAR, entries BLOB
INSERT INTO ledger_digests (topic, partition, digest_seq, body, signature, entries)
VALUES ($topic, $partition, $digest_seq, $body, $signature, $entries);
