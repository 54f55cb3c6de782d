-- proposal_divergence: how often the model's proposed arguments diverged from the defined sources -- how
-- often it would have invented a value -- by UTC day, tool and agent. Over the argument leaves of runs
-- given a proposal: `proposed` leaves the model proposed, `matched` those settled to exactly its value,
-- `diverged` those settled to another value or to none (the model's value alone was never a source),
-- `not_proposed` the required leaves it left out. A leaf counts once per run.
-- param from_day DATE optional: first UTC day included
-- param to_day DATE optional: last UTC day included
WITH
leaves AS (
    SELECT CAST(timezone('UTC', r.started_at) AS DATE) AS day, r.tool, r.agent_id, fp.proposal
    FROM field_provenance AS fp
    JOIN runs AS r ON r.run_id = fp.run_id
    WHERE fp.proposal IS NOT NULL
),
scoped AS (
    SELECT *
    FROM leaves
    WHERE ($from_day IS NULL OR day >= CAST($from_day AS DATE))
      AND ($to_day IS NULL OR day <= CAST($to_day AS DATE))
)
SELECT
    day,
    tool,
    agent_id,
    count(*) FILTER (WHERE proposal <> 'absent') AS proposed,
    count(*) FILTER (WHERE proposal = 'matched') AS matched,
    count(*) FILTER (WHERE proposal = 'diverged') AS diverged,
    count(*) FILTER (WHERE proposal = 'absent') AS not_proposed,
    round(count(*) FILTER (WHERE proposal = 'diverged') / nullif(count(*) FILTER (WHERE proposal <> 'absent'), 0), 4)
        AS divergence_rate
FROM scoped
GROUP BY day, tool, agent_id
ORDER BY day, tool NULLS LAST, agent_id NULLS LAST;
