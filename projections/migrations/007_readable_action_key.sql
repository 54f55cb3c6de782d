-- 007: a protected engine publishes the action key as a keyed pseudonym of the adopter's key
-- (`preflight.protect`), so that neither the Kafka key nor this database spells the user's words; the
-- readable key travels sealed in the run's `tool_match_decided` event, which compliance opens with the
-- key store and an erasure shreds. It is kept on the run's row for the readers that look a key up
-- (NULL for a run of an unprotected engine, whose `action_key` is the readable key itself).
ALTER TABLE runs ADD COLUMN readable_action_key VARCHAR;

UPDATE runs
SET readable_action_key = json_extract_string(a.event, '$.readable_action_key')
FROM archive AS a
WHERE a.run_id = runs.run_id AND a.event_type = 'tool_match_decided';
