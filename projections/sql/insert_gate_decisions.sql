-- `day` is the UTC day the gate blocked the run, whatever the session's time zone. The planner only writes
-- gates of runs it found new, in the transaction that writes the run: nothing to deduplicate (migration 004).
INSERT INTO gate_decisions BY NAME
SELECT
    * REPLACE (CAST(gate AS JSON) AS gate, TRY_CAST(occurred_at AS TIMESTAMPTZ) AS occurred_at),
    CAST(timezone('UTC', TRY_CAST(occurred_at AS TIMESTAMPTZ)) AS DATE) AS day
FROM batch_gate_decisions;
