"""The pending-questions store: what the gateway asks a user who cannot be asked in their MCP client, and
the answers the user gives in the console.

The gateway (`gateway.questions`) writes a question when a run asks and the client cannot show its form
(or is sent to the console by URL-mode elicitation); the console (`preflight_audit.console.questions`)
lists a signed-in user's pending questions and records their answers; the next call under the same
action key takes the answer, once. The two may be separate processes, so the store is one **SQLite**
file (Python's own `sqlite3`, WAL journal, a busy timeout): both processes read and write it with
transactions and no server. DuckDB allows one writing process per file, so neither the projections
database nor a second DuckDB file would let the gateway and the console both write; the event log is
the record of decisions, and a question is not one yet (the run that asked is recorded; its answer
becomes the next run's tier-0 ``user_answers``, recorded there with ``answers_origin: "console"``).

The same file keeps the gateway's calls whose effect is unknown (`remember_effect`), so that a restarted
gateway still holds their action keys until a read-back settles them (`gateway.effects`).

Rules kept here, once: a question belongs to its run's user and only they can see or answer it
(`pending_for`, `settle` match the user); each question expires (`QuestionExpired`); a question is
answered or declined once (`QuestionClosed`); an answer is taken once (`take_settled`). `read_answer`
turns what a page posted into the form's typed content, refusing a wrong type with the reason.

The SQL is in ``sql/questions.sql``, every value a bound parameter.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from preflight.errors import PreflightError

__all__ = [
    "DEFAULT_TTL_S",
    "Question",
    "QuestionClosed",
    "QuestionError",
    "QuestionExpired",
    "QuestionNotFound",
    "QuestionStore",
    "read_answer",
]

#: How long a question stays open unless the gateway's settings say otherwise (seconds).
DEFAULT_TTL_S = 600.0

_SQL_FILE = Path(__file__).with_name("sql") / "questions.sql"
_NAMED = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _statements() -> dict[str, str]:
    text = _SQL_FILE.read_text(encoding="utf-8")
    parts = _NAMED.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


_SQL = _statements()


class QuestionError(PreflightError):
    """A question cannot be answered as asked; the message says why (shown to the user)."""


class QuestionNotFound(QuestionError):
    """No question of that id is this user's (another user's question is not found, never shown)."""


class QuestionExpired(QuestionError):
    """The question expired before it was answered: the call must be made again, and is asked again."""


class QuestionClosed(QuestionError):
    """The question was already answered or declined."""


@dataclass(frozen=True)
class Question:
    """One question as stored."""

    question_id: str
    user_id: str
    action_key: str
    tool: str
    run_id: str | None
    gate: str | None
    message: str
    form: dict[str, Any]
    created_at: float
    expires_at: float
    state: Literal["pending", "answered", "declined"]
    answer: dict[str, Any] | None
    answered_at: float | None
    used_at: float | None

    @classmethod
    def of_row(cls, row: sqlite3.Row) -> Question:
        return cls(
            question_id=row["question_id"],
            user_id=row["user_id"],
            action_key=row["action_key"],
            tool=row["tool"],
            run_id=row["run_id"],
            gate=row["gate"],
            message=row["message"],
            form=json.loads(row["form"]),
            created_at=row["created_at"],
            expires_at=row["expires_at"],
            state=row["state"],
            answer=None if row["answer"] is None else json.loads(row["answer"]),
            answered_at=row["answered_at"],
            used_at=row["used_at"],
        )

    def expired(self, now: float) -> bool:
        return self.state == "pending" and now >= self.expires_at

    @property
    def fields(self) -> list[tuple[str, dict[str, Any]]]:
        """The form's properties in order: (name, schema)."""
        props = self.form.get("properties")
        return list(props.items()) if isinstance(props, Mapping) else []


class QuestionStore:
    """The store at `path` (created with its table if new). Thread-safe; each call is one transaction."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._con = sqlite3.connect(str(self.path), timeout=10.0, isolation_level=None, check_same_thread=False)
        self._con.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._con.execute("PRAGMA journal_mode=WAL")
            self._con.execute("PRAGMA busy_timeout=10000")
            self._con.executescript(_SQL["create"])
            self._con.executescript(_SQL["create_effects"])
        with contextlib.suppress(OSError):
            self.path.chmod(0o600)

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def _one(self, name: str, **params: Any) -> Question | None:
        with self._lock:
            row = self._con.execute(_SQL[name], params).fetchone()
        return None if row is None else Question.of_row(row)

    def _all(self, name: str, **params: Any) -> list[Question]:
        with self._lock:
            rows = self._con.execute(_SQL[name], params).fetchall()
        return [Question.of_row(r) for r in rows]

    def _write(self, name: str, **params: Any) -> int:
        with self._lock:
            return self._con.execute(_SQL[name], params).rowcount

    # ---- the gateway's side -------------------------------------------------------------------------------

    def ask(
        self,
        *,
        user_id: str,
        action_key: str,
        tool: str,
        message: str,
        form: Mapping[str, Any],
        run_id: str | None = None,
        gate: str | None = None,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> Question:
        """The open question for this user, key and form, or a new one (asking again does not pile up)."""
        now = self._clock()
        text = json.dumps(form, ensure_ascii=False)  # in the form's own order: the page shows it so
        found = self._one("open_for_key", user_id=user_id, action_key=action_key, now=now, form=text)
        if found is not None:
            return found
        qid = secrets.token_urlsafe(24)
        self._write(
            "insert",
            question_id=qid,
            user_id=user_id,
            action_key=action_key,
            tool=tool,
            run_id=run_id,
            gate=gate,
            message=message,
            form=text,
            created_at=now,
            expires_at=now + ttl_s,
        )
        stored = self.get(qid)
        assert stored is not None
        return stored

    def take_settled(self, user_id: str, action_key: str) -> Question | None:
        """The latest answered or declined question under this key not yet taken, marked taken (once)."""
        found = self._one("settled_for_key", user_id=user_id, action_key=action_key)
        if found is None or self._write("use", question_id=found.question_id, now=self._clock()) != 1:
            return None
        return found

    def get(self, question_id: str) -> Question | None:
        return self._one("get", question_id=question_id)

    # ---- calls whose effect is unknown (kept across a gateway's restarts) -------------------------------------

    def remember_effect(self, run_id: str, user_id: str | None, tool: str, events: bytes) -> None:
        """Keep a run whose call's effect is unknown (its events) until `forget_effect`."""
        self._write("remember_effect", run_id=run_id, user_id=user_id, tool=tool, events=events, now=self._clock())

    def forget_effect(self, run_id: str) -> None:
        self._write("forget_effect", run_id=run_id)

    def unknown_effects(self) -> list[tuple[str, bytes]]:
        """Every kept run: (run_id, its events)."""
        with self._lock:
            rows = self._con.execute(_SQL["unknown_effects"]).fetchall()
        return [(str(r["run_id"]), bytes(r["events"])) for r in rows]

    # ---- the console's side -------------------------------------------------------------------------------

    def pending_for(self, user_id: str) -> list[Question]:
        """`user_id`'s open questions, oldest first (nobody else's)."""
        return self._all("pending_for_user", user_id=user_id, now=self._clock())

    def mine(self, question_id: str, user_id: str) -> Question:
        """The question, if it is `user_id`'s (`QuestionNotFound` otherwise: another's is not revealed)."""
        found = self.get(question_id)
        if found is None or found.user_id != user_id:
            raise QuestionNotFound("no such question is waiting for you")
        return found

    def settle(self, question_id: str, user_id: str, answer: Mapping[str, Any] | None) -> Question:
        """Record `user_id`'s answer (None: declined). Raises `QuestionNotFound`, `QuestionExpired`,
        `QuestionClosed`; exactly one of two concurrent answers is taken."""
        question = self.mine(question_id, user_id)
        now = self._clock()
        if question.state != "pending":
            raise QuestionClosed(f"this question was already {question.state}")
        if question.expired(now):
            raise QuestionExpired("this question expired: make the call again, and it will be asked again")
        state = "declined" if answer is None else "answered"
        text = None if answer is None else json.dumps(dict(answer), ensure_ascii=False)
        changed = self._write("settle", question_id=question_id, user_id=user_id, state=state, answer=text, now=now)
        if changed != 1:
            again = self.mine(question_id, user_id)
            if again.state != "pending":
                raise QuestionClosed(f"this question was already {again.state}")
            raise QuestionExpired("this question expired: make the call again, and it will be asked again")
        settled = self.get(question_id)
        assert settled is not None
        return settled


# ---- reading a posted answer ----------------------------------------------------------------------------------

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _typed(name: str, raw: str, schema: Mapping[str, Any]) -> tuple[Any, str | None]:
    kind = schema.get("type")
    text = raw.strip()
    if kind == "boolean":
        if text.lower() in _TRUE:
            return True, None
        if text.lower() in _FALSE:
            return False, None
        return None, f"{name}: invalid: expected yes or no"
    if kind == "integer":
        if re.fullmatch(r"[+-]?\d+", text):
            value: Any = int(text)
        else:
            return None, f"{name}: invalid: expected an integer, got {raw[:40]!r}"
    elif kind == "number":
        try:
            value = float(text)
        except ValueError:
            return None, f"{name}: invalid: expected a number, got {raw[:40]!r}"
        if value != value or value in (float("inf"), float("-inf")):
            return None, f"{name}: invalid: expected a finite number"
        if value.is_integer() and re.fullmatch(r"[+-]?\d+", text):
            value = int(text)
    else:
        value = raw
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        return None, f"{name}: invalid: expected one of {', '.join(json.dumps(v) for v in enum)}"
    if isinstance(value, str):
        low, high = schema.get("minLength"), schema.get("maxLength")
        if isinstance(low, int) and len(value) < low:
            return None, f"{name}: invalid: at least {low} character(s) expected"
        if isinstance(high, int) and len(value) > high:
            return None, f"{name}: invalid: at most {high} character(s) expected"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = schema.get("minimum"), schema.get("maximum")
        if isinstance(low, (int, float)) and value < low:
            return None, f"{name}: invalid: expected at least {low}"
        if isinstance(high, (int, float)) and value > high:
            return None, f"{name}: invalid: expected at most {high}"
    return value, None


def read_answer(question: Question, posted: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The typed content of a posted answer to `question`'s form, and each field's defect (none: valid).

    Every field the form asks is required; a field the form does not ask is ignored (never forwarded)."""
    content: dict[str, Any] = {}
    problems: list[str] = []
    for name, schema in question.fields:
        raw = posted.get(name)
        if raw is None or (schema.get("type") != "boolean" and not raw.strip()):
            problems.append(f"{name}: missing")
            continue
        value, problem = _typed(name, raw, schema)
        if problem is not None:
            problems.append(problem)
        else:
            content[name] = value
    return content, problems
