-- 003: what analysts may read. Field values may be personal data (SPEC §3): this view keeps the
-- provenance and drops the value, leaving only its JSON type. Compliance reads field_provenance.

CREATE VIEW analyst_field_provenance AS
SELECT
    run_id, field_index, name, action_key, agent_id,
    CASE WHEN value IS NULL THEN NULL ELSE json_type(value) END AS value_type,
    status, source, origin_source, supplied_by, supplied_via, resolved_at, tier,
    segment_index, span_start, span_end, segment_origin, pre_set_origin, measured,
    baseline_run_id, lookup_failed, pending_at_trigger, note
FROM field_provenance;
