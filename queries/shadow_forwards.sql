-- shadow_forwards: for a run judged in shadow mode, the call forwarded unchanged in its stead (SPEC §2.7):
-- the forwarded run (unkeyed, never a baseline), its `decision` (execute), its `outcome` (executed, failed,
-- effect_unknown; NULL: none recorded) and when, each row `marked` shadow. The forwarded run names the
-- judged run in its `run_started` (`runs.shadow_of`, migration 016). No value is shown.
-- param run_id VARCHAR optional: only the forwards of this judged run
SELECT
    f.shadow_of AS judged_run_id,
    f.run_id AS forwarded_run_id,
    f.tool,
    f.decision,
    f.outcome,
    f.outcome_at,
    'shadow' AS marked
FROM runs AS f
WHERE f.shadow_of IS NOT NULL
  AND ($run_id IS NULL OR f.shadow_of = $run_id)
ORDER BY f.started_at, f.run_id;
