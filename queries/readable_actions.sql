-- readable_actions: each published action key whose runs hold a sealed readable key (a protected engine's
-- runs), with one of its runs and that run's sealed readable key -- for a caller who may open them, to
-- search by the words of the adopter's own key (the console's search).
-- param user_id VARCHAR optional: only this user's actions
SELECT DISTINCT ON (action_key) action_key, run_id, user_id, readable_action_key
FROM runs
WHERE readable_action_key IS NOT NULL
  AND ($user_id IS NULL OR user_id = $user_id)
ORDER BY action_key, run_id;
