"""Asking in the console when the client cannot ask (SPEC §2.7): the gateway's side of the questions store.

A run that asks reaches the user one of three ways, chosen from what the client declared at
``initialize`` and the settings (``[gateway] elicitation``):

* **form** elicitation (the client declared ``elicitation.form``, or an empty ``elicitation`` object, and
  the settings do not prefer URL mode): the question is a form inside the same ``tools/call``, as before;
* **URL** elicitation (MCP 2025-11-25; the client declared ``elicitation.url``, and either declared no
  form mode or the settings say ``elicitation = "url"``): the question is written to the store, the client
  is sent to its console page (``elicitation/create`` with ``mode: "url"`` and the question's id as the
  ``elicitationId``); the call waits, polling the store, until the user answers or declines there or the
  question expires, then sends ``notifications/elicitation/complete`` and goes on with the answer;
* **neither**: the question is written to the store and the call ends with an ``isError`` result that
  carries the page's link and says to call again once answered. The next call under the same action key
  (`ConsoleAsk.taken`) takes the answer, once.

A console answer goes into the next run as tier-0 ``user_answers`` with ``answers_origin: "console"``; a
declined question calls nothing. Without ``[gateway] console_url`` the gateway behaves as before (a client
that cannot be asked gets an ``isError`` result naming what is missing).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio

from preflight.adapters.mcp import (
    APPROVE_FIELD,
    CONFIRM_PREFIX,
    RESTATE_FIELD,
    Answers,
    GuardedOutcome,
    MissingField,
    answers_from_form,
)
from preflight.adapters.questions import Question, QuestionStore

__all__ = ["LEAVES_KEY", "ConsoleAsk", "Reached", "answers_of", "question_link", "readable_key", "stores"]

#: The member of a stored form that keeps each leaf's own JSON Schema (the form shows primitives only;
#: the answer is read back with the leaf's schema, as a form answer is).
LEAVES_KEY = "x-preflight-leaves"
#: The member of a stored form that keeps what the user already answered in this call (a later call takes
#: it with the answer: one call may need several questions, e.g. a value and then an approval).
CARRIED_KEY = "x-preflight-carried"
#: How often a URL-mode call looks at the store for the user's answer (seconds).
POLL_S = 0.2

UrlElicit = Callable[[str, str, str], Awaitable[str]]
Complete = Callable[[str], Awaitable[None]]


def readable_key(user_id: str, tool: str) -> str:
    """The key a retried call finds its answer under: the user and the tool (the MCP hooks' action key)."""
    return f"{user_id}:{tool}"


def question_link(console_url: str, question_id: str) -> str:
    return f"{console_url.rstrip('/')}/console/questions/{question_id}"


_STORES: dict[Path, QuestionStore] = {}


def stores(path: Path) -> QuestionStore:
    """One open store per file in this process."""
    resolved = path.resolve()
    if resolved not in _STORES:
        _STORES[resolved] = QuestionStore(resolved)
    return _STORES[resolved]


def stored_form(
    outcome: GuardedOutcome, form: tuple[str, dict[str, Any]], carried: Answers | None = None
) -> dict[str, Any]:
    """The requested schema as stored: the form, each missing leaf's own schema, and what the user already
    answered in this call (`carried`)."""
    leaves = {m.name: dict(m.schema) for m in outcome.missing}
    stored = {**form[1], LEAVES_KEY: leaves}
    if carried is not None and (
        carried.user_answers or carried.checklist_answers or carried.approved or carried.restatement is not None
    ):
        stored[CARRIED_KEY] = {
            "user_answers": carried.user_answers,
            "checklist_answers": carried.checklist_answers,
            "approved": carried.approved is True,
        }
        if carried.restatement is not None:  # the user's own words, said before this question: not asked again
            stored[CARRIED_KEY]["restatement"] = carried.restatement
    return stored


def answers_of(question: Question) -> Answers:
    """What an answered question says, in the engine's terms (as a form's answer is read)."""
    props = question.form.get("properties") or {}
    leaves = question.form.get(LEAVES_KEY) or {}
    missing = tuple(
        MissingField(name, None, leaves.get(name, props[name]))
        for name in props
        if name not in (APPROVE_FIELD, RESTATE_FIELD) and not name.startswith(CONFIRM_PREFIX)
    )
    unverified = tuple({"id": name[len(CONFIRM_PREFIX) :]} for name in props if name.startswith(CONFIRM_PREFIX))
    shaped = GuardedOutcome(
        "asked", question.tool, gate=question.gate, missing=missing, unverified=unverified, reason="console"
    )
    said = answers_from_form(shaped, question.answer or {})
    carried = question.form.get(CARRIED_KEY) or {}
    return Answers(
        user_answers={**carried.get("user_answers", {}), **said.user_answers},
        checklist_answers={**carried.get("checklist_answers", {}), **said.checklist_answers},
        approved=True if carried.get("approved") is True and said.approved is None else said.approved,
        restatement=said.restatement if said.restatement is not None else carried.get("restatement"),
    )


@dataclass(frozen=True)
class Reached:
    """How asking in the console went: the user ``answered`` or ``declined`` (URL mode, or a retried call),
    the question ``expired`` or the client refused to open the page (``cancel``), or only a ``link``
    could be given (the client cannot be asked at all)."""

    how: Literal["answered", "declined", "expired", "cancel", "link"]
    question: Question
    link: str


@dataclass
class ConsoleAsk:
    """Asking one user through the console for one `tools/call` (see the module docstring)."""

    store: QuestionStore
    console_url: str
    user_id: str
    ttl_s: float
    url_elicit: UrlElicit | None = None
    complete: Complete | None = None
    poll_s: float = POLL_S

    def taken(self, tool: str) -> Question | None:
        """The answer (or refusal) the user gave in the console for this key since the last call, once."""
        return self.store.take_settled(self.user_id, readable_key(self.user_id, tool))

    async def ask(
        self, outcome: GuardedOutcome, form: tuple[str, dict[str, Any]], carried: Answers | None = None
    ) -> Reached:
        state = outcome.state
        question = self.store.ask(
            user_id=self.user_id,
            action_key=readable_key(self.user_id, outcome.tool),
            tool=outcome.tool,
            message=form[0],
            form=stored_form(outcome, form, carried),
            run_id=state.run_ref.run_id if state is not None and state.run_ref is not None else None,
            gate=outcome.gate,
            ttl_s=self.ttl_s,
        )
        link = question_link(self.console_url, question.question_id)
        if self.url_elicit is None:
            return Reached("link", question, link)
        action = await self.url_elicit(form[0], link, question.question_id)
        if action != "accept":
            return Reached("declined" if action == "decline" else "cancel", question, link)
        settled = await self._wait(question)
        if self.complete is not None:
            await self.complete(question.question_id)
        if settled is None:
            return Reached("expired", question, link)
        taken = self.taken(outcome.tool)  # mark it used: a later call does not take it again
        chosen = taken if taken is not None and taken.question_id == settled.question_id else settled
        return Reached("answered" if chosen.state == "answered" else "declined", chosen, link)

    async def _wait(self, question: Question) -> Question | None:
        """The question once the user answered or declined it, or None once it expired."""
        while True:
            now = time.time()
            current = self.store.get(question.question_id)
            if current is None:
                return None
            if current.state != "pending":
                return current
            if now >= current.expires_at:
                return None
            await anyio.sleep(min(self.poll_s, max(0.0, current.expires_at - now)))  # polling a shared file


def describe_link(outcome: GuardedOutcome, link: str) -> str:
    """The tool error a client that cannot be asked gets: what is missing, the page, and what to do."""
    return (
        f"{outcome.describe()} Answer it in the console at {link} (signed in as the user who made this call),"
        f" then call {outcome.tool} again with the same arguments."
    )
