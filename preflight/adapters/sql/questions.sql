-- The pending-questions store (`preflight.adapters.questions`): one SQLite file shared by the gateway,
-- which asks, and the console, which takes the answers. Each statement is named by a `-- name:` line;
-- every value is a bound parameter.

-- name: create
CREATE TABLE IF NOT EXISTS questions (
    question_id  TEXT PRIMARY KEY,            -- unguessable; also the URL-mode elicitation id
    user_id      TEXT NOT NULL,               -- the run's user: the only one who may see or answer it
    action_key   TEXT NOT NULL,               -- the retried call finds its answer under this key
    tool         TEXT NOT NULL,
    run_id       TEXT,                        -- the run that asked
    gate         TEXT,                        -- value | approval_required | tool_undetermined | ...
    message      TEXT NOT NULL,
    form         TEXT NOT NULL,               -- JSON: the requested schema (what, in what form)
    created_at   REAL NOT NULL,               -- seconds since the epoch
    expires_at   REAL NOT NULL,
    state        TEXT NOT NULL DEFAULT 'pending',   -- pending | answered | declined
    answer       TEXT,                        -- JSON: the accepted content
    answered_at  REAL,
    used_at      REAL                         -- when the retried call took the answer (once)
);
CREATE INDEX IF NOT EXISTS questions_by_key ON questions (user_id, action_key, state);

-- name: insert
INSERT INTO questions (question_id, user_id, action_key, tool, run_id, gate, message, form, created_at, expires_at)
VALUES (:question_id, :user_id, :action_key, :tool, :run_id, :gate, :message, :form, :created_at, :expires_at);

-- name: open_for_key
SELECT * FROM questions
WHERE user_id = :user_id AND action_key = :action_key AND state = 'pending' AND expires_at > :now AND form = :form
ORDER BY created_at DESC LIMIT 1;

-- name: pending_for_user
SELECT * FROM questions
WHERE user_id = :user_id AND state = 'pending' AND expires_at > :now
ORDER BY created_at;

-- name: get
SELECT * FROM questions WHERE question_id = :question_id;

-- name: settle
UPDATE questions SET state = :state, answer = :answer, answered_at = :now
WHERE question_id = :question_id AND user_id = :user_id AND state = 'pending' AND expires_at > :now;

-- name: settled_for_key
SELECT * FROM questions
WHERE user_id = :user_id AND action_key = :action_key AND state IN ('answered', 'declined') AND used_at IS NULL
ORDER BY answered_at DESC LIMIT 1;

-- name: use
UPDATE questions SET used_at = :now WHERE question_id = :question_id AND used_at IS NULL;

-- name: create_effects
CREATE TABLE IF NOT EXISTS unknown_effects (
    run_id       TEXT PRIMARY KEY,            -- the run whose call did not answer
    user_id      TEXT,
    tool         TEXT NOT NULL,
    events       BLOB NOT NULL,               -- the run's events, as the transport carries them
    recorded_at  REAL NOT NULL
);

-- name: remember_effect
INSERT OR REPLACE INTO unknown_effects (run_id, user_id, tool, events, recorded_at)
VALUES (:run_id, :user_id, :tool, :events, :now);

-- name: forget_effect
DELETE FROM unknown_effects WHERE run_id = :run_id;

-- name: unknown_effects
SELECT run_id, user_id, tool, events FROM unknown_effects ORDER BY recorded_at;
