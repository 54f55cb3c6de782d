-- effects: the calls whose effect was unknown (SPEC §2.7: no answer -- it timed out, or its connection
-- closed first; never `failed`) and what settled each: a read-back by a read-only tool the settings name
-- (`read_back_basis` readback_tool, `read_back_tool`) or the user's word (user), and whether the call took
-- effect (`settled`: took effect, did not take effect, or still unknown). Read from the archived events;
-- no value is shown.
-- param run_id VARCHAR optional: only this run
-- param action_key VARCHAR optional: only runs under this action_key
SELECT
    u.run_id,
    u.action_key,
    u.user_id,
    json_extract_string(u.event, '$.tool_name') AS tool,
    json_extract_string(u.event, '$.cause') AS cause,
    u.occurred_at AS unknown_at,
    rb.occurred_at AS read_back_at,
    json_extract_string(rb.event, '$.basis') AS read_back_basis,
    json_extract_string(rb.event, '$.readback_tool') AS read_back_tool,
    CAST(json_extract(rb.event, '$.took_effect') AS BOOLEAN) AS took_effect,
    CASE
        WHEN rb.run_id IS NULL THEN 'still unknown'
        WHEN CAST(json_extract(rb.event, '$.took_effect') AS BOOLEAN) THEN 'took effect'
        ELSE 'did not take effect'
    END AS settled
FROM archive AS u
LEFT JOIN archive AS rb ON rb.run_id = u.run_id AND rb.event_type = 'effect_read_back'
WHERE u.event_type = 'effect_unknown'
  AND ($run_id IS NULL OR u.run_id = $run_id)
  AND ($action_key IS NULL OR u.action_key = $action_key)
ORDER BY u.occurred_at, u.run_id;
