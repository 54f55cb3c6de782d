-- responsibility: for a run or a decision, slot by slot, which party answered it or blocked it --
-- the user, a pre-set value, the provider, the system, or the calling runtime -- whose checklist the
-- slot is on (fixed: the system's; required fields: the provider's; items: the user's), and which
-- gate decided the run. Parties (SPEC §2.2): only the user creates values; the provider can require,
-- never permit; the system can reject, never fill in; the runtime selects the tool and passes input.
-- param run_id VARCHAR optional: only this run
-- param decision_id VARCHAR optional: only the run of this execute decision
WITH
selected AS (
    SELECT r.*, g.gate_name, g.kind AS gate_kind, g.gap_class
    FROM runs AS r
    LEFT JOIN gate_decisions AS g ON g.run_id = r.run_id
    WHERE ($run_id IS NULL OR r.run_id = $run_id)
      AND ($decision_id IS NULL OR r.decision_id = $decision_id)
),
fixed_issue AS (
    SELECT s.run_id, json_extract_string(t.issue, '$.slot') AS slot,
           string_agg(json_extract_string(t.issue, '$.code'), ', ') AS codes
    FROM selected AS s, unnest(CAST(s.fixed_issues AS JSON[])) AS t(issue)
    GROUP BY ALL
),
slots AS (
    -- C1, the system's question "when": only the user's own words can answer it
    SELECT s.run_id, 1 AS slot_order, 'fixed' AS checklist, 'system' AS checklist_owner, 'c1_when_case' AS slot,
           s.c1_when_case AS answer,
           CASE WHEN s.c1_when_case IS NOT NULL THEN 'user' END AS answered_by,
           CASE WHEN s.c1_when_case IS NOT NULL THEN 'instruction' END AS answered_via,
           CASE WHEN s.c1_when_case IS NULL THEN 'system' END AS blocked_by,
           fi.codes AS detail
    FROM selected AS s
    LEFT JOIN fixed_issue AS fi ON fi.run_id = s.run_id AND fi.slot = 'c1_when_case'
    WHERE s.fixed_issues IS NOT NULL
    UNION ALL
    -- C2, "what the user calls the act": the user's words, else the user's pre-set fallback
    SELECT s.run_id, 2, 'fixed', 'system', 'c2_user_action_name',
           s.c2_user_action_name,
           CASE s.c2_source WHEN 'instruction' THEN 'user' WHEN 'pre_set_data' THEN 'pre_set' END,
           s.c2_source,
           CASE WHEN s.c2_user_action_name IS NULL THEN 'system' END,
           fi.codes
    FROM selected AS s
    LEFT JOIN fixed_issue AS fi ON fi.run_id = s.run_id AND fi.slot = 'c2_user_action_name'
    WHERE s.fixed_issues IS NOT NULL
    UNION ALL
    -- C3, the tool: selected by the calling runtime, confirmed or refused by the system's tool gate;
    -- its definition (input schema) is the provider's
    SELECT s.run_id, 3, 'fixed', 'system', 'c3_provider_action_name',
           s.tool,
           'runtime',
           'tool selection',
           CASE
               WHEN s.c3_approved = false THEN 'system'
               WHEN s.gate_name = 'tool_definition' THEN 'provider'
           END,
           CASE
               WHEN s.gate_name = 'tool_definition' THEN 'definition incomplete: input schema missing'
               -- a protected run's reason is sealed (it may quote the user's words): the sealed text alone
               WHEN s.c3_approved IS NOT NULL AND starts_with(s.c3_reason, 'sealed:') THEN s.c3_reason
               WHEN s.c3_approved IS NOT NULL THEN
                   'tool gate ' || CASE WHEN s.c3_approved THEN 'confirmed' ELSE 'refused' END
                   || coalesce(': ' || s.c3_reason, '')
               ELSE 'tool gate not reached'
           END
    FROM selected AS s
    WHERE s.fixed_issues IS NOT NULL
    UNION ALL
    -- the provider's checklist: each required field, answered by whoever created its value
    SELECT fp.run_id, 100 + fp.field_index, 'provider', 'provider', fp.name,
           CAST(fp.value AS VARCHAR),
           fp.supplied_by,
           fp.supplied_via,
           CASE
               WHEN fp.status = 'known' OR fp.pending_at_trigger THEN NULL
               WHEN fp.lookup_failed OR fp.note IS NOT NULL THEN 'system'
               ELSE 'provider'
           END,
           CASE
               WHEN fp.pending_at_trigger AND fp.status <> 'known' THEN 'pending at trigger'
               ELSE fp.note
           END
    FROM field_provenance AS fp
    JOIN selected AS s ON s.run_id = fp.run_id
    UNION ALL
    -- the user's checklist: each item, verified (by whom) or holding the run
    SELECT c.run_id, 10000 + c.item_index, 'user', 'user', coalesce(c.item_id, '#' || c.item_index),
           c.status,
           CASE
               WHEN c.status <> 'verified' THEN NULL
               WHEN c.source IN ('user_answer', 'instruction') THEN 'user'
               WHEN c.source = 'pre_set_data' THEN 'pre_set'
               ELSE 'system'
           END,
           CASE WHEN c.status = 'verified' THEN c.source END,
           CASE WHEN c.status <> 'verified' THEN 'user' END,
           c.note
    FROM checklist_results AS c
    JOIN selected AS s ON s.run_id = c.run_id
    UNION ALL
    -- the run's decision, and what stopped it when no slot did (input, checklist ids, internal error)
    SELECT s.run_id, 1000000, 'run', 'system', 'decision',
           coalesce(s.outcome, s.decision),
           NULL,
           NULL,
           CASE s.gate_name
               WHEN 'input' THEN 'runtime'
               WHEN 'checklist_ids' THEN 'runtime'
               WHEN 'backstop' THEN 'system'
           END,
           s.reason
    FROM selected AS s
)
SELECT
    s.run_id,
    s.decision_id,
    s.action_key,
    s.agent_id,
    s.decision,
    s.outcome,
    s.gate_name,
    s.gate_kind,
    s.gap_class,
    x.checklist,
    x.checklist_owner,
    x.slot,
    x.answer,
    CASE
        WHEN x.blocked_by IS NOT NULL THEN 'blocked'
        WHEN x.checklist = 'run' THEN 'decided'
        WHEN x.answered_by IS NOT NULL THEN 'answered'
        WHEN x.detail = 'pending at trigger' THEN 'pending'
        ELSE 'open'
    END AS state,
    x.answered_by,
    x.answered_via,
    x.blocked_by,
    x.detail
FROM slots AS x
JOIN selected AS s ON s.run_id = x.run_id
ORDER BY s.partition, s."offset", x.slot_order;
