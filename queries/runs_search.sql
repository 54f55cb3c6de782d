-- runs_search: the runs that match every filter given -- one run, an action_key, a part of an action
-- key, a user, an agent, a tool, a decision or outcome, a time range of when they started -- one page
-- of them, in log order or newest first, each with the gate that stopped it (what was missing) and how
-- many runs match in all. The console's search and each action's timeline. The action key is the one
-- published (a protected engine's is a keyed pseudonym, `ak1.<hex>`); `readable_action_key` is the
-- adopter's own, sealed (NULL for an unprotected run, whose action_key is readable).
-- param run_id VARCHAR optional: only this run
-- param action_key VARCHAR optional: only runs under this action_key
-- param key_contains VARCHAR optional: only runs whose action_key contains this text
-- param also_keys VARCHAR optional: a JSON array of action keys that match key_contains too (the caller opened their readable keys)
-- param user_id VARCHAR optional: only this user's runs
-- param agent_id VARCHAR optional: only this agent's runs
-- param tool VARCHAR optional: only runs of this tool (as the runtime selected it)
-- param decision VARCHAR optional: only this decision (execute, ask_user, hold, deferred) or outcome (executed, failed, effect_unknown)
-- param from_time TIMESTAMPTZ optional: only runs started at or after this time
-- param to_time TIMESTAMPTZ optional: only runs started before this time
-- param newest_first BOOLEAN optional: newest first (default: in log order, oldest first)
-- param page_size INTEGER optional: runs per page (default 50)
-- param page_offset INTEGER optional: runs skipped before the page (default 0)
WITH
matched AS (
    SELECT r.run_id, r.action_key, r.user_id, r.agent_id, r.tool, r.decision, r.outcome, r.gap_class, r.reason,
           r.started_at, r.outcome_at, r.decision_id, r.phase, r.c2_user_action_name, r.readable_action_key,
           r.partition, r."offset",
           count(*) OVER () AS total
    FROM runs AS r
    WHERE ($run_id IS NULL OR r.run_id = $run_id)
      AND ($action_key IS NULL OR r.action_key = $action_key)
      AND ($key_contains IS NULL OR contains(r.action_key, $key_contains)
           OR list_contains(from_json(coalesce($also_keys, '[]'), '["VARCHAR"]'), r.action_key))
      AND ($user_id IS NULL OR r.user_id = $user_id)
      AND ($agent_id IS NULL OR r.agent_id = $agent_id)
      AND ($tool IS NULL OR r.tool = $tool)
      AND ($decision IS NULL OR r.decision = $decision OR r.outcome = $decision)
      AND ($from_time IS NULL OR r.started_at >= CAST($from_time AS TIMESTAMPTZ))
      AND ($to_time IS NULL OR r.started_at < CAST($to_time AS TIMESTAMPTZ))
    ORDER BY
        CASE WHEN coalesce($newest_first, false) THEN -epoch_us(r.started_at) ELSE epoch_us(r.started_at) END,
        r.partition, r."offset"
    LIMIT coalesce($page_size, 50) OFFSET coalesce($page_offset, 0)
)
SELECT m.run_id, m.action_key, m.user_id, m.agent_id, m.tool, m.decision, m.outcome, m.gap_class,
       g.gate_name, g.kind AS gate_kind, g.unknown_fields, g.unverified_items, m.reason, m.started_at,
       m.outcome_at, m.decision_id, m.phase, m.c2_user_action_name, m.readable_action_key, m.total
FROM matched AS m
LEFT JOIN gate_decisions AS g ON g.run_id = m.run_id
ORDER BY
    CASE WHEN coalesce($newest_first, false) THEN -epoch_us(m.started_at) ELSE epoch_us(m.started_at) END,
    m.partition, m."offset";
