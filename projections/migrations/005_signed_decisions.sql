-- 005: an outcome counts only for a validly signed decision (SPEC §3), in the projections as in the fold.
--
-- A run's row carries its approved decision's signed fields, exactly as signed -- the tool it names,
-- the key id, algorithm, validity period, nonce and the signature itself -- so that the row alone is
-- enough to check the decision again with the signer's public key. The projector checks it once, when
-- the run is projected, against the keys it trusts (`projections.signatures`): the verdict goes in
-- `decision_signature_check` (verified | unsigned | unreadable | untrusted_key | bad_signature; NULL
-- when not checked: no approved decision, or no keys), the verifier's words in
-- `decision_signature_problem`. An outcome of a decision that is not `verified`, or that occurred
-- outside the decision's validity period, is a dead letter (its code says which).
--
-- Backfilled here from the archived `execution_approved` events; the verdict stays NULL for runs
-- projected before this migration (SQL cannot check a signature): a replay with the keys fills it.
ALTER TABLE runs ADD COLUMN decision_tool VARCHAR;
ALTER TABLE runs ADD COLUMN decision_key_id VARCHAR;
ALTER TABLE runs ADD COLUMN decision_algorithm VARCHAR;
ALTER TABLE runs ADD COLUMN decision_issued_at VARCHAR;     -- ISO 8601 text, as signed
ALTER TABLE runs ADD COLUMN decision_expires_at VARCHAR;    -- ISO 8601 text, as signed
ALTER TABLE runs ADD COLUMN decision_nonce VARCHAR;
ALTER TABLE runs ADD COLUMN decision_signature VARCHAR;     -- base64url Ed25519 signature
ALTER TABLE runs ADD COLUMN decision_signature_check VARCHAR;
ALTER TABLE runs ADD COLUMN decision_signature_problem VARCHAR;

UPDATE runs
SET decision_tool = json_extract_string(a.event, '$.tool_name'),
    decision_key_id = json_extract_string(a.event, '$.signature.key_id'),
    decision_algorithm = json_extract_string(a.event, '$.signature.algorithm'),
    decision_issued_at = json_extract_string(a.event, '$.signature.issued_at'),
    decision_expires_at = json_extract_string(a.event, '$.signature.expires_at'),
    decision_nonce = json_extract_string(a.event, '$.signature.nonce'),
    decision_signature = json_extract_string(a.event, '$.signature.value')
FROM archive AS a
WHERE a.run_id = runs.run_id
  AND a.event_type = 'execution_approved';
