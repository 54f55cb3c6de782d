"""Effect unknown (SPEC §2.7, §4 row 5): settling a call that may have acted before the next one is judged.

A call that times out (``[tools.<tool>] timeout_s``, else ``[gateway] call_timeout_s``) or whose upstream
connection closes before it answers is recorded ``effect_unknown`` by the engine, which then holds every run
of that action key that would execute (``timed_out_without_readback``) until a read-back settles it. Before
a call of such a tool is judged, the gateway tries to settle it (`settle_first`):

1. the **user's word in the console**: when the effect became unknown, a question "did it take effect?" was
   written to the questions store (`ask_the_user`, under the key's ``#effect`` entry); once answered there,
   it settles the run with basis ``user``;
2. a **read-back tool** the settings name (``[tools.<tool>] readback = {tool, arguments, took_effect_if}``):
   a read-only tool called with the unknown call's arguments filled in; a match of ``took_effect_if`` in its
   text means it took effect, no match that it did not, an error result (or no answer) settles nothing.

A settled run is recorded (`Preflight.settle_effect`: an ``effect_read_back`` event); one that took effect
counts as executed, its fields' origins kept. What remains unknown keeps holding, and the hold says so.

An unsettled run is kept in the questions store's file (`keep`), and a gateway that starts again holds its
key again (`restore`): a restart never turns an unknown effect into a blind retry.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp.types import CallToolResult

from gateway.questions import ConsoleAsk, question_link, readable_key
from gateway.settings import ReadBackEntry
from preflight.adapters.mcp import result_text
from preflight.adapters.questions import QuestionStore
from preflight.api import Preflight
from preflight.errors import ChainError, EventDecodeError, RecordingError
from preflight.events import decode_event, decode_message, encode_message
from preflight.records import ExecutionRecord

__all__ = ["EFFECT_FIELD", "Settled", "ask_the_user", "effect_key", "fill", "keep", "restore", "settle_first"]

log = logging.getLogger("preflight.gateway")

#: The one field of the console question "did the call take effect?".
EFFECT_FIELD = "took_effect"
_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_]+)\}")

CallTool = Callable[[str, dict[str, Any]], Awaitable[CallToolResult]]


def effect_key(user_id: str, tool: str) -> str:
    """The questions-store key of the user's word on an unknown effect (apart from the call's questions)."""
    return readable_key(user_id, tool) + "#effect"


def _arguments(record: ExecutionRecord) -> dict[str, Any]:
    return {f.name.lstrip("/"): f.value for f in record.fields or () if "/" not in f.name.lstrip("/")}


def fill(value: Any, arguments: dict[str, Any], *, pattern: bool = False) -> Any:
    """`value` with each ``{name}`` replaced by the unknown call's argument (escaped in a pattern)."""
    if isinstance(value, dict):
        return {k: fill(v, arguments, pattern=pattern) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, arguments, pattern=pattern) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in arguments:
            return match.group(0)
        text = str(arguments[name])
        return re.escape(text) if pattern else text

    whole = _PLACEHOLDER.fullmatch(value)
    if whole is not None and not pattern and whole.group(1) in arguments:
        return arguments[whole.group(1)]  # a whole placeholder keeps the argument's own type
    return _PLACEHOLDER.sub(one, value)


@dataclass(frozen=True)
class Settled:
    """What `settle_first` did: ``none`` (nothing unknown), ``settled`` (`record` is the settled run) or
    ``unknown`` (still unknown: `why`; `link` is the console question, if any)."""

    how: str
    record: ExecutionRecord | None = None
    why: str = ""
    link: str | None = None


def ask_the_user(console: ConsoleAsk, record: ExecutionRecord, tool: str) -> str:
    """The console question "did it take effect?" for the user's unknown call of `tool` (its link)."""
    form = {
        "type": "object",
        "properties": {
            EFFECT_FIELD: {
                "type": "boolean",
                "title": f"Did the call of {tool} take effect?",
                "description": "Look at what it acts on. Until you say, or a read-back tells, it is not retried.",
            }
        },
        "required": [EFFECT_FIELD],
    }
    question = console.store.ask(
        user_id=console.user_id,
        action_key=effect_key(console.user_id, tool),
        tool=tool,
        message=f"The call of {tool} did not answer: did it take effect?",
        form=form,
        run_id=record.run_ref.run_id if record.run_ref is not None else None,
        gate="effect_unknown",
        ttl_s=max(console.ttl_s, 86_400.0),
    )
    return question_link(console.console_url, question.question_id)


async def settle_first(
    preflight: Preflight,
    user_id: str,
    tool: str,
    *,
    readback: ReadBackEntry | None,
    call: CallTool,
    console: ConsoleAsk | None,
) -> Settled:
    """Settle the user's unknown call of `tool` before a new one is judged (see the module docstring)."""
    record = preflight.unsettled_effect(user_id, tool)
    if record is None:
        return Settled("none")
    try:
        if console is not None:
            said = console.store.take_settled(user_id, effect_key(user_id, tool))
            if (
                said is not None
                and said.state == "answered"
                and isinstance((said.answer or {}).get(EFFECT_FIELD), bool)
            ):
                took = bool((said.answer or {})[EFFECT_FIELD])
                settled = await preflight.settle_effect(
                    record, took_effect=took, basis="user", reason="the user, answering in the console"
                )
                return Settled("settled", settled)
        if readback is not None:
            arguments = _arguments(record)
            result = await call(readback.tool, fill(readback.arguments, arguments))
            if not result.is_error:
                text = result_text(result)
                took = re.search(fill(readback.took_effect_if, arguments, pattern=True), text) is not None
                settled = await preflight.settle_effect(
                    record,
                    took_effect=took,
                    basis="readback_tool",
                    reason=f"{readback.tool} {'shows' if took else 'does not show'} it",
                    readback_tool=readback.tool,
                    readback_result=result,
                )
                return Settled("settled", settled)
            why = f"the read-back {readback.tool} answered an error: {result_text(result)[:200]}"
        else:
            why = "no read-back tool is configured for it"
    except RecordingError:
        raise
    except Exception as exc:  # an upstream still down: nothing is settled, and the key keeps holding
        log.warning("gateway: the read-back of %s failed: %s", tool, exc)
        why = f"the read-back failed: {type(exc).__name__}: {exc}"
    link = ask_the_user(console, record, tool) if console is not None else None
    return Settled("unknown", record, why, link)


def keep(store: QuestionStore, record: ExecutionRecord, user_id: str, tool: str) -> None:
    """Keep an unsettled run in the store's file, for a gateway that starts again (`restore`)."""
    if record.run_ref is not None:
        store.remember_effect(record.run_ref.run_id, user_id, tool, encode_message(record.run_events))


def restore(store: QuestionStore, preflight: Preflight) -> int:
    """Hold again every kept run that is not settled yet; how many. A kept run that cannot be read (altered,
    or settled since) is logged and left out, never a reason not to start."""
    restored = 0
    for run_id, data in store.unknown_effects():
        try:
            events = [decode_event(e) for e in decode_message(data)]
            preflight.restore_unsettled(events)
            restored += 1
        except (EventDecodeError, ChainError, ValueError) as exc:
            log.warning("gateway: the kept run %s with an unknown effect cannot be held again: %s", run_id, exc)
    return restored
