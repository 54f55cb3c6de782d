-- Every (topic, partition) the ledger holds digests of.
SELECT DISTINCT topic, partition FROM ledger_digests ORDER BY topic, partition;
