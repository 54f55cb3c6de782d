-- 010: where the user was asked for an answered (tier 0) value: `elicitation` for an MCP elicitation
-- form answered through the gateway, `interrupt` for a LangGraph interrupt, whatever the adopter passed
-- as the run's `answers_origin`; NULL when the run did not say. Backfilled from the archive.
ALTER TABLE field_provenance ADD COLUMN answer_origin VARCHAR;

UPDATE field_provenance
SET answer_origin = json_extract_string(a.event, '$.evidence.answer_origin')
FROM archive AS a
WHERE a.run_id = field_provenance.run_id
  AND a.event_type = 'field_resolved'
  AND json_extract_string(a.event, '$.field.name') = field_provenance.name;
