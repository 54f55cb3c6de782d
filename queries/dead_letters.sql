-- dead_letters: the messages the projector could not project, with the reason and the run they name
-- (a forged or unsigned outcome, a broken chain, an undecodable message), newest first.
-- param code VARCHAR optional: only dead letters with this code
SELECT topic, partition, "offset", code, reason, run_id, timestamp_ms, dead_lettered_at
FROM dead_letters
WHERE $code IS NULL OR code = $code
ORDER BY dead_lettered_at DESC, topic, partition, "offset";
