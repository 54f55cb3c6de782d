-- integrity: findings that should never exist, one row each. An executed run with a field that has
-- no origin or an origin of prior_state; an execution without an execute decision (projected, or
-- refused into dead_letters); an execution without a valid signed decision (refused into dead_letters:
-- unsigned, signed by an untrusted key, a signature that does not verify, or outside the decision's
-- validity period); an attempt to execute a recorded decision that the engine refused (a replay of a
-- spent decision, an altered or unverifiable one: `execution_refused`, by refusal code); a run whose
-- archived events do not match its closing event (count,
-- seq, hash links, last hash); archived events of no projected run; a value inherited from a baseline
-- run of another action_key (tier 4 only reads the key's own). An empty result is a clean log.
-- param action_key VARCHAR optional: only runs under this action_key
WITH
scope AS (
    SELECT *
    FROM runs
    WHERE $action_key IS NULL OR action_key = $action_key
),
archived AS (
    SELECT a.*, row_number() OVER w - 1 AS position, lag(a.hash) OVER w AS previous_hash
    FROM archive AS a
    WHERE a.run_id IN (SELECT run_id FROM scope)
    WINDOW w AS (PARTITION BY a.run_id ORDER BY a.seq)
),
per_run AS (
    SELECT run_id, count(*) AS events, arg_max(hash, seq) AS last_hash, max(seq) AS last_seq,
           count(*) FILTER (WHERE event_type = 'effect_read_back') AS read_backs
    FROM archived
    GROUP BY run_id
),
findings AS (
    SELECT 'executed_field_without_origin' AS finding, r.run_id, r.action_key, fp.name AS subject,
           'executed with ' || fp.name || ' ' || fp.status || ', origin ' || coalesce(fp.origin_source, 'none') AS detail
    FROM scope AS r
    JOIN field_provenance AS fp ON fp.run_id = r.run_id
    WHERE r.outcome = 'executed'
      AND (fp.status <> 'known' OR fp.origin_source IS NULL OR fp.origin_source = 'prior_state')
    UNION ALL
    SELECT 'baseline_of_another_key', fp.run_id, fp.action_key, fp.name,
           'inherits ' || fp.name || ' from run ' || fp.baseline_run_id || ' of ' || coalesce(b.action_key, 'no key')
    FROM scope AS r
    JOIN field_provenance AS fp ON fp.run_id = r.run_id
    JOIN runs AS b ON b.run_id = fp.baseline_run_id
    WHERE fp.source = 'prior_state' AND b.action_key IS DISTINCT FROM fp.action_key
    UNION ALL
    SELECT 'executed_without_execute_decision', e.run_id, e.action_key, e.decision_id,
           CASE
               WHEN r.run_id IS NULL THEN 'no projected run'
               WHEN r.decision <> 'execute' THEN 'the run decided ' || r.decision
               ELSE 'the decision id differs from the approved one'
           END
    FROM executions AS e
    LEFT JOIN runs AS r ON r.run_id = e.run_id
    WHERE ($action_key IS NULL OR e.action_key = $action_key)
      AND (r.run_id IS NULL OR r.decision <> 'execute' OR r.decision_id IS DISTINCT FROM e.decision_id)
    UNION ALL
    SELECT 'executed_without_execute_decision', d.run_id, CAST(d.message_key AS VARCHAR), d.code, d.reason
    FROM dead_letters AS d
    WHERE d.code IN ('outcome_for_non_execute', 'outcome_without_run', 'outcome_mismatch', 'second_outcome')
      AND ($action_key IS NULL OR CAST(d.message_key AS VARCHAR) = $action_key)
    UNION ALL
    -- projections.signatures.REFUSAL_CODES
    SELECT 'executed_without_valid_decision', d.run_id, CAST(d.message_key AS VARCHAR), d.code, d.reason
    FROM dead_letters AS d
    WHERE d.code IN ('unsigned_decision', 'untrusted_decision_key', 'bad_decision_signature', 'unchecked_decision',
                     'expired_decision', 'decision_not_yet_valid', 'invalid_decision_period', 'undated_outcome')
      AND ($action_key IS NULL OR CAST(d.message_key AS VARCHAR) = $action_key)
    UNION ALL
    SELECT 'execution_refused', g.run_id, g.action_key, json_extract_string(g.gate, '$.code'),
           'refused to execute decision ' || coalesce(json_extract_string(g.gate, '$.decision_id'), '(none)')
           || ' of run ' || coalesce(json_extract_string(g.gate, '$.decided_run_id'), '(none)')
    FROM gate_decisions AS g
    WHERE g.kind = 'execution_refused' AND ($action_key IS NULL OR g.action_key = $action_key)
    UNION ALL
    SELECT 'missing_events', r.run_id, r.action_key, NULL,
           printf('archive holds %d event(s); the run has %d (%d closed%s)',
                  coalesce(p.events, 0), r.event_count, r.closing_event_count,
                  CASE WHEN r.outcome IS NULL THEN '' ELSE ' + outcome' END)
    FROM scope AS r
    LEFT JOIN per_run AS p ON p.run_id = r.run_id
    WHERE coalesce(p.events, 0) <> r.event_count
       OR r.event_count <> r.closing_event_count + CASE WHEN r.outcome IS NULL THEN 0 ELSE 1 END
                            + coalesce(p.read_backs, 0)  -- the read-back that settled an effect_unknown
    UNION ALL
    SELECT 'chain_mismatch', a.run_id, a.action_key, CAST(a.seq AS VARCHAR),
           CASE
               WHEN a.seq <> a.position THEN printf('seq %d where %d was expected', a.seq, a.position)
               ELSE printf('seq %d does not link to the event before it', a.seq)
           END
    FROM archived AS a
    WHERE a.seq <> a.position
       OR a.prev_hash <> coalesce(a.previous_hash, '0000000000000000000000000000000000000000000000000000000000000000')
    UNION ALL
    SELECT 'chain_mismatch', a.run_id, a.action_key, CAST(a.seq AS VARCHAR),
           'run_closed names another last hash or count than its run has'
    FROM archived AS a
    WHERE a.event_type = 'run_closed'
      AND (json_extract_string(a.event, '$.last_hash') <> a.prev_hash
           OR CAST(json_extract(a.event, '$.event_count') AS BIGINT) <> a.seq + 1)
    UNION ALL
    SELECT 'chain_mismatch', r.run_id, r.action_key, NULL, 'the run''s last hash is not its last archived event''s'
    FROM scope AS r
    JOIN per_run AS p ON p.run_id = r.run_id
    WHERE p.last_hash <> r.last_hash OR p.last_seq <> r.last_seq
    UNION ALL
    SELECT 'orphan_events', a.run_id, a.action_key, CAST(count(*) AS VARCHAR), 'archived events of no projected run'
    FROM archive AS a
    LEFT JOIN runs AS r ON r.run_id = a.run_id
    WHERE r.run_id IS NULL AND ($action_key IS NULL OR a.action_key = $action_key)
    GROUP BY a.run_id, a.action_key
)
SELECT finding, run_id, action_key, subject, detail
FROM findings
ORDER BY finding, action_key NULLS LAST, run_id, subject;
