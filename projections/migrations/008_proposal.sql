-- 008: real calls (SPEC §2.6): a field is an argument leaf (a nested one named by JSON Pointer, e.g.
-- `/to/account`) and, on a run given the model's proposed arguments, records whether the settled value is
-- what the model proposed: `matched`, `diverged` (another value, or none: the model would have invented
-- it) or `absent` (nothing proposed). NULL for a run without a proposal. Backfilled from the archive.
ALTER TABLE field_provenance ADD COLUMN proposal VARCHAR;

UPDATE field_provenance
SET proposal = json_extract_string(a.event, '$.field.proposal')
FROM archive AS a
WHERE a.run_id = field_provenance.run_id
  AND a.event_type = 'field_resolved'
  AND json_extract_string(a.event, '$.field.name') = field_provenance.name;
