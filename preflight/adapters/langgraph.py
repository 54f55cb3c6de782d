"""A LangGraph tool node that calls MCP tools through the preflight, asking the user with `interrupt`.

Two nodes for a `StateGraph` whose state has ``messages`` (LangGraph's `add_messages` list) and
``preflight`` (a dict, last value wins; `GuardedState` declares both):

* ``tools`` (`GuardedToolNode.tools`): for every tool call of the last AI message, `GuardedSession.call_tool`
  with the model's arguments as the proposal and the user's trusted words (``instruction``, given once
  when the node is built or per thread in the state); an executed or failed call becomes a `ToolMessage`
  with the tool's text; a call the preflight asks about stops there and hands ``ask`` the question;
* ``ask`` (`GuardedToolNode.ask`): `langgraph.types.interrupt` with the question (the elicitation form of
  `preflight.adapters.mcp.elicitation_form`: names, types, descriptions, never the proposed values); the
  graph stops until the user resumes it with ``Command(resume={...})`` (the form's answers, or
  ``{"action": "decline"}``), then goes back to ``tools``, which runs the call again with the answers.

The ``ask`` node only interrupts, so resuming runs nothing twice: the preflight run that asked is recorded
once, and the run that follows the answer is a new run of the same action key. A held or declined call
becomes a `ToolMessage` with ``status="error"`` saying that nothing was called. Route ``tools`` with
`route_after_tools` (``ask`` while a question is pending, else back to the model).

This module imports LangGraph and LangChain's message types; the engine core does not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from preflight.adapters.mcp import GuardedOutcome, GuardedSession, answers_from_form, elicitation_form, result_text

__all__ = ["GuardedState", "GuardedToolNode", "route_after_tools"]


class GuardedState(TypedDict, total=False):
    """The graph state the two nodes read and write."""

    messages: Annotated[list[AnyMessage], add_messages]
    #: The user's trusted words for this thread (segments ``{text, trust, origin?}``).
    instruction: list[dict[str, Any]]
    #: The nodes' bookkeeping: the pending question and the answers given so far, per tool call id.
    preflight: dict[str, Any]


def _text(outcome: GuardedOutcome) -> tuple[str, Literal["success", "error"]]:
    if outcome.status in ("executed", "forwarded") and outcome.result is not None:
        return result_text(outcome.result), "error" if outcome.result.is_error else "success"
    if outcome.status == "failed":
        text = result_text(outcome.result) if outcome.result is not None else outcome.reason
        return f"the call failed: {text}", "error"
    return outcome.describe(), "error"


class GuardedToolNode:
    """The ``tools`` and ``ask`` nodes over one `GuardedSession` (see the module docstring)."""

    def __init__(self, guard: GuardedSession, *, instruction: Sequence[Mapping[str, Any]] = ()) -> None:
        self.guard = guard
        self.instruction = [dict(s) for s in instruction]

    async def tools(self, state: GuardedState) -> dict[str, Any]:
        messages = state.get("messages") or []
        last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        book = dict(state.get("preflight") or {})
        answers: dict[str, Any] = dict(book.get("answers") or {})
        done: set[str] = set(book.get("done") or [])
        answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
        out: list[ToolMessage] = []
        calls = last.tool_calls if last is not None else []
        instruction = list(state.get("instruction") or self.instruction)
        for call in calls:
            call_id = str(call["id"])
            if call_id in done or call_id in answered:
                continue
            given = answers.get(call_id) or {}
            if given.get("declined"):
                text = f"{call['name']}: nothing was called: the user declined"
                out.append(ToolMessage(text, tool_call_id=call_id, status="error"))
                done.add(call_id)
                continue
            outcome = await self.guard.call_tool(
                call["name"],
                call.get("args") or {},
                instruction=instruction + list(given.get("restated") or []),
                user_answers=given.get("user_answers"),
                answers_origin="interrupt" if given.get("user_answers") else None,
                checklist_answers=given.get("checklist_answers"),
                approval=given.get("approval"),
                tool_attempt=int(given.get("tool_attempt") or 0),
                intent_attempt=int(given.get("intent_attempt") or 0),
            )
            form = elicitation_form(outcome)
            if outcome.status == "asked" and form is not None:
                question = {
                    "tool_call_id": call_id,
                    "tool": call["name"],
                    "gate": outcome.gate,
                    "message": form[0],
                    "requested_schema": form[1],
                    "next_tool_attempt": getattr(getattr(outcome.state, "gate", None), "next_tool_attempt", None),
                    "next_intent_attempt": getattr(getattr(outcome.state, "gate", None), "next_intent_attempt", None),
                    "missing": [m.name for m in outcome.missing],
                    "schemas": {m.name: dict(m.schema) for m in outcome.missing},
                    "unverified": [str(i["id"]) for i in outcome.unverified],
                }
                book.update(pending=question, answers=answers, done=sorted(done))
                return {"messages": out, "preflight": book}
            text, status = _text(outcome)
            out.append(ToolMessage(text, tool_call_id=call_id, status=status))
            done.add(call_id)
        return {"messages": out, "preflight": {}}

    def ask(self, state: GuardedState) -> dict[str, Any]:
        book = dict(state.get("preflight") or {})
        question = book.get("pending")
        if not question:
            return {}
        reply = interrupt(question)
        call_id = question["tool_call_id"]
        answers = dict(book.get("answers") or {})
        given = dict(answers.get(call_id) or {})
        reply = reply if isinstance(reply, Mapping) else {}
        if reply.get("action") in ("decline", "cancel"):
            given["declined"] = True
        else:
            content = {k: v for k, v in reply.items() if k != "action"}
            outcome = GuardedOutcome(
                "asked",
                question["tool"],
                gate=question["gate"],
                missing=tuple(_missing(question)),
                unverified=tuple({"id": i} for i in question["unverified"]),
            )
            said = answers_from_form(outcome, content)
            given["user_answers"] = {**(given.get("user_answers") or {}), **said.user_answers}
            given["checklist_answers"] = {**(given.get("checklist_answers") or {}), **said.checklist_answers}
            if question["gate"] == "approval_required":
                if said.approved is True:
                    given["approval"] = {"status": "active", "scope": question["tool"]}
                else:
                    given["declined"] = True
            if question["gate"] in ("tool_undetermined", "intent_undetermined"):
                if said.restatement is None:
                    given["declined"] = True
                else:
                    restated = list(given.get("restated") or [])
                    restated.append({"text": said.restatement, "trust": "user", "origin": "interrupt"})
                    given["restated"] = restated
                    given["tool_attempt"] = question.get("next_tool_attempt") or given.get("tool_attempt") or 0
                    given["intent_attempt"] = question.get("next_intent_attempt") or given.get("intent_attempt") or 0
        answers[call_id] = given
        book.update(pending=None, answers=answers)
        return {"preflight": book}


def _missing(question: Mapping[str, Any]) -> list[Any]:
    from preflight.adapters.mcp import MissingField

    schemas = question.get("schemas") or {}
    return [MissingField(name, None, schemas.get(name, {})) for name in question["missing"]]


def route_after_tools(state: GuardedState) -> Literal["ask", "agent"]:
    """After ``tools``: ``ask`` while a question is pending, else back to the model (node ``agent``)."""
    book = state.get("preflight") or {}
    return "ask" if book.get("pending") else "agent"
