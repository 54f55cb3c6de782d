-- provenance: for an action_key or a run, each field's value (one row per argument leaf: a nested leaf is
-- named by JSON Pointer, `/to/account`), where the run read it, whether the model proposed it (`proposal`:
-- matched, diverged, absent; NULL without a proposal), and who supplied
-- it -- the user (by answering, and where they were asked when the run says so, e.g. `elicitation`, or
-- `console`: "the user, answering in the console"; or in
-- their own words at a segment and span), a pre-set value and who
-- set it, or a system measurement. An inherited (prior_state) value is traced back through the
-- baseline runs to the executed run that first supplied it, whose evidence it reports.
-- The lineage stays within one action_key, as tier 4 does (a baseline is a run of the same key; one
-- that is not is reported by `integrity` as `baseline_of_another_key`, and here as not projected): the
-- fields and runs of the given key (an index lookup), else of the given run's key (a filtered scan),
-- else all of them, are read once (`fields`, `all_runs`) for every join that follows.
-- require one of: action_key, run_id
-- param action_key VARCHAR optional: only runs under this action_key
-- param run_id VARCHAR optional: only this run
WITH RECURSIVE
run_key AS MATERIALIZED (  -- a given run's key (none asked: none)
    SELECT action_key FROM runs WHERE $action_key IS NULL AND run_id = $run_id
),
fields AS MATERIALIZED (
    SELECT run_id, field_index, name, value, status, source, origin_source, supplied_by, resolved_at,
           segment_index, span_start, span_end, segment_origin, pre_set_origin, measured, baseline_run_id,
           lookup_failed, pending_at_trigger, note, proposal, answer_origin
    FROM field_provenance
    WHERE ($action_key IS NOT NULL AND action_key = $action_key) OR ($action_key IS NULL AND $run_id IS NULL)
    UNION ALL
    SELECT f.run_id, f.field_index, f.name, f.value, f.status, f.source, f.origin_source, f.supplied_by,
           f.resolved_at, f.segment_index, f.span_start, f.span_end, f.segment_origin, f.pre_set_origin,
           f.measured, f.baseline_run_id, f.lookup_failed, f.pending_at_trigger, f.note, f.proposal,
           f.answer_origin
    FROM field_provenance AS f SEMI JOIN run_key AS k ON f.action_key IS NOT DISTINCT FROM k.action_key
),
all_runs AS MATERIALIZED (
    SELECT run_id, action_key, user_id, agent_id, decision, outcome, started_at, partition, "offset"
    FROM runs
    WHERE ($action_key IS NOT NULL AND action_key = $action_key) OR ($action_key IS NULL AND $run_id IS NULL)
    UNION ALL
    SELECT r.run_id, r.action_key, r.user_id, r.agent_id, r.decision, r.outcome, r.started_at, r.partition,
           r."offset"
    FROM runs AS r SEMI JOIN run_key AS k ON r.action_key IS NOT DISTINCT FROM k.action_key
),
selected AS (
    SELECT fp.*
    FROM fields AS fp
    WHERE $run_id IS NULL OR fp.run_id = $run_id
),
lineage (for_run_id, name, run_id, depth) AS (
    SELECT run_id, name, baseline_run_id, 1
    FROM selected
    WHERE source = 'prior_state' AND baseline_run_id IS NOT NULL
    UNION ALL
    SELECT l.for_run_id, l.name, fp.baseline_run_id, l.depth + 1
    FROM lineage AS l
    JOIN fields AS fp ON fp.run_id = l.run_id AND fp.name = l.name
    WHERE fp.source = 'prior_state' AND fp.baseline_run_id IS NOT NULL AND l.depth < 100
),
origins AS (
    -- a value read directly was supplied in its own run; an inherited one, in the deepest baseline
    SELECT run_id, name, run_id AS first_run_id, 0 AS hops
    FROM selected
    WHERE status = 'known' AND source <> 'prior_state'
    UNION ALL
    SELECT for_run_id, name, arg_max(run_id, depth), max(depth)
    FROM lineage
    GROUP BY for_run_id, name
)
SELECT
    s.run_id,
    r.action_key,
    r.user_id,
    r.agent_id,
    r.decision,
    r.outcome,
    s.field_index,
    s.name AS field,
    s.status,
    s.value,
    s.source,
    s.origin_source,
    s.supplied_by,
    CASE
        WHEN s.status <> 'known' THEN 'nobody: the value is unknown'
        WHEN o.run_id IS NULL OR o.source = 'prior_state' THEN 'unknown: the run that first supplied it is not projected'
        WHEN o.source = 'user_answer' AND o.answer_origin = 'console' THEN 'the user, answering in the console'
        WHEN o.source = 'user_answer' THEN 'the user, answering a question' || coalesce(' through ' || o.answer_origin, '')
        WHEN o.source = 'instruction' THEN printf(
            'the user, in their own words (segment %s, characters %s to %s)',
            coalesce(CAST(o.segment_index AS VARCHAR), '?'),
            coalesce(CAST(o.span_start AS VARCHAR), '?'),
            coalesce(CAST(o.span_end AS VARCHAR), '?'))
        WHEN o.source = 'pre_set_data' THEN 'a pre-set value, set by ' || coalesce(o.pre_set_origin, 'an unnamed origin')
        WHEN o.source = 'measured_data' THEN 'a system measurement'
        ELSE 'unknown source ' || o.source
    END || CASE WHEN s.source = 'prior_state' THEN ' (inherited)' ELSE '' END AS supplied_by_detail,
    coalesce(s.source = 'prior_state', false) AS inherited,
    s.baseline_run_id AS inherited_from_run_id,
    g.first_run_id AS first_supplied_in_run_id,
    g.hops AS inheritance_hops,
    fr.outcome AS first_run_outcome,
    fr.started_at AS first_supplied_at,
    o.segment_index,
    o.span_start,
    o.span_end,
    o.segment_origin,
    o.pre_set_origin,
    o.answer_origin,
    o.measured,
    s.lookup_failed,
    s.pending_at_trigger,
    s.note,
    s.proposal,
    s.resolved_at
FROM selected AS s
JOIN all_runs AS r ON r.run_id = s.run_id
LEFT JOIN origins AS g ON g.run_id = s.run_id AND g.name = s.name
LEFT JOIN fields AS o ON o.run_id = g.first_run_id AND o.name = s.name
LEFT JOIN all_runs AS fr ON fr.run_id = g.first_run_id
ORDER BY r.partition, r."offset", s.field_index;
