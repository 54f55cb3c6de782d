-- Every (topic, partition) the archive holds events of.
SELECT DISTINCT topic, partition FROM archive ORDER BY topic, partition;
