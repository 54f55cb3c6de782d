"""The public engine object: construction checks, run, record, execute (SPEC §2.4).

`create_preflight` refuses to build without its six required hooks; `run` decides and never raises
for bad input (a malformed input is a recorded `hold`); `record` makes the run durable (events first,
then the record) and raises `RecordingError` if it cannot; `execute_if_ready` acts only on a state
this instance recorded with decision `execute`, calls the tool once and records the outcome.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from preflight.emit import outcome_event, run_events
from preflight.engine import Decided, backstop, decide, invalid_input, started_summary, validate_tool
from preflight.errors import ConstructionError, RecordingError
from preflight.events import PreflightEvent, digest
from preflight.hooks import ALL_HOOKS, DEFAULT_HOOKS, REQUIRED_HOOKS, UNSAFE_DEFAULT_HOOKS, Hook, call
from preflight.inputs import PreflightInput
from preflight.ports import EventSink, Storage
from preflight.records import ExecutionRecord
from preflight.testing import MemoryEventSink

CallTool = Callable[[str, dict[str, Any]], Any]
RECENT_RUNS = 100_000
PENDING_EXECUTIONS = 100_000


def utc_now() -> str:
    """ISO 8601 UTC with milliseconds and a Z, as the seed's records show."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class ExecutionOutcome:
    """What `execute_if_ready` did. `held` means nothing was called."""

    status: Literal["executed", "failed", "held"]
    state: ExecutionRecord
    result: Any = None
    error: BaseException | None = None
    reason: str = ""


class Preflight:
    """A configured preflight engine. Build it with `create_preflight`."""

    def __init__(
        self,
        hooks: Mapping[str, Hook],
        storage: Storage,
        sink: EventSink,
        clock: Callable[[], str],
        unsafe_defaults: tuple[str, ...],
    ) -> None:
        self._hooks = dict(hooks)
        self.storage = storage
        self.sink = sink
        self._clock = clock
        self.unsafe_defaults = unsafe_defaults
        # Bounded memory: recent recorded runs (for idempotent re-recording) and the `execute`
        # decisions not yet acted on, each with the digest of the record as it was recorded.
        self._recorded: BoundedSet = BoundedSet(RECENT_RUNS)
        self._executable: OrderedDict[str, str] = OrderedDict()

    # ---- deciding ----------------------------------------------------------------------------------

    async def run(self, input: Any) -> ExecutionRecord:
        """Decide one run. Never raises for bad input or failing hooks: those are recorded holds."""
        decided = await self._decide(input)
        run_id = str(uuid.uuid4())
        user_id, agent_id = _ids(input)
        try:
            events, ref = run_events(
                decided, run_id=run_id, user_id=user_id, agent_id=agent_id, clock=self._clock, new_id=_new_id
            )
        except Exception as exc:  # an unrecordable decision is itself a backstop hold
            decided = backstop(exc, [], self._clock(), started_summary(None, None))
            events, ref = run_events(
                decided,
                run_id=run_id,
                user_id=_encodable(user_id),
                agent_id=_encodable(agent_id),
                clock=self._clock,
                new_id=_new_id,
            )
        return decided.record.with_run_ref(ref, tuple(events))

    async def _decide(self, raw: Any) -> Decided:
        try:
            inp = raw if isinstance(raw, PreflightInput) else PreflightInput.model_validate(raw)
        except ValidationError as exc:
            return invalid_input(raw, exc, self._clock())
        try:
            return await decide(self._hooks, inp, self._clock, self._load_baseline)
        except Exception as exc:
            checklist = inp.user_checklist if isinstance(inp.user_checklist, list) else []
            return backstop(exc, checklist, self._clock(), started_summary(None, inp))

    async def _load_baseline(self, action_key: str) -> ExecutionRecord | None:
        record = await self.storage.load(action_key)
        if record is not None and record.execution_decision != "executed":
            # A storage that hands back anything but an executed record is not a baseline source.
            return None
        return record

    # ---- recording ---------------------------------------------------------------------------------

    def events_of(self, state: ExecutionRecord) -> list[PreflightEvent]:
        """The events an engine built for `state`'s run (empty for a state no engine built)."""
        return list(state.run_events)

    async def record(self, state: ExecutionRecord) -> ExecutionRecord:
        """Publish the run's events, then append its record. Idempotent for the same run.

        Raises `RecordingError` when either cannot be made durable: no record, no execution.
        """
        ref = state.run_ref
        events = list(state.run_events)
        if ref is None or not events or events[0].run_id != ref.run_id:
            raise RecordingError("this state was not produced by a preflight run(); refusing to record it")
        if ref.run_id in self._recorded:
            return state
        try:
            await self.sink.publish(events)
        except Exception as exc:
            raise RecordingError(f"the run's events were not acknowledged by the event log: {exc}") from exc
        try:
            await self.storage.persist(state.storage_key, state)
        except Exception as exc:
            raise RecordingError(f"the run's record could not be stored: {exc}") from exc
        self._recorded.add(ref.run_id)
        if state.execution_decision == "execute":
            self._executable[ref.run_id] = _record_digest(state)
            while len(self._executable) > PENDING_EXECUTIONS:
                self._executable.popitem(last=False)
        return state

    async def run_and_record(self, input: Any) -> ExecutionRecord:
        """`run` then `record`, as a pair, so nothing goes unrecorded."""
        return await self.record(await self.run(input))

    async def prior_state(self, action_key: str) -> ExecutionRecord | None:
        """The baseline for `action_key`: its latest executed record, or None."""
        return await self._load_baseline(action_key)

    # ---- executing ---------------------------------------------------------------------------------

    async def execute_if_ready(self, state: ExecutionRecord, tool: Any, call_tool: CallTool) -> ExecutionOutcome:
        """Call `tool` once for a recorded `execute` decision; record `executed` or `failed`.

        Never retries: a raised call may still have had its effect. Never mutates `state`.
        """
        refusal = self._refusal(state, tool)
        if refusal is not None:
            return ExecutionOutcome(status="held", state=state, reason=refusal)
        ref = state.run_ref
        assert ref is not None and state.fields is not None and state.fixed is not None
        del self._executable[ref.run_id]  # consumed before the call: a second call is a replay

        arguments = {f.name: f.value for f in state.fields}
        result: Any = None
        error: BaseException | None = None
        try:
            result = await call(call_tool, state.fixed.c3_provider_action_name, dict(arguments))
        except Exception as exc:
            error = exc
        suffix = "call succeeded" if error is None else f"call failed: {type(error).__name__}: {error}"
        final = state.model_copy(
            update={
                "execution_decision": "executed" if error is None else "failed",
                "reason": f"{state.reason} / {suffix}",
                "timestamp": self._clock(),
            }
        )
        events = list(state.run_events)
        user_id, agent_id = events[0].user_id, events[0].agent_id
        event = outcome_event(
            state,
            ref,
            executed=final,
            error=error,
            result=result,
            user_id=user_id,
            agent_id=agent_id,
            clock=self._clock,
            new_id=_new_id,
        )
        final = final.with_run_ref(
            ref.model_copy(update={"last_hash": event.hash, "next_seq": ref.next_seq + 1}), (*events, event)
        )
        outcome = ExecutionOutcome(
            status="executed" if error is None else "failed",
            state=final,
            result=result,
            error=error,
            reason=suffix,
        )
        try:
            await self.sink.publish([event])
            await self.storage.persist(final.storage_key, final)
        except Exception as exc:
            raise RecordingError(
                f"the tool was called ({outcome.status}) but the outcome could not be recorded: {exc}",
                outcome,
            ) from exc
        return outcome

    def _refusal(self, state: Any, tool: Any) -> str | None:
        if not isinstance(state, ExecutionRecord):
            return "not an execution record"
        if state.execution_decision != "execute":
            return f"decision is {state.execution_decision}, not execute"
        ref = state.run_ref
        if ref is None or ref.run_id not in self._recorded:
            return "this state was not recorded by this preflight"
        recorded_digest = self._executable.get(ref.run_id)
        if recorded_digest is None:
            return "this decision was already acted on (or is no longer pending)"
        if _record_digest(state) != recorded_digest or not state.run_events:
            return "this state differs from the decision that was recorded"
        try:
            name = validate_tool(tool).name
        except (ValidationError, TypeError):
            return "the tool given is not a valid tool definition"
        judged = state.fixed.c3_provider_action_name if state.fixed else None
        if name != judged:
            return f"the tool given ({name}) is not the one judged ({judged})"
        return None


def _record_digest(state: ExecutionRecord) -> str:
    return digest(state.model_dump(mode="json"))


class BoundedSet:
    """A set that forgets its oldest members beyond `limit`."""

    def __init__(self, limit: int) -> None:
        self._items: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, item: str) -> None:
        self._items[item] = None
        self._items.move_to_end(item)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def __contains__(self, item: object) -> bool:
        return item in self._items


def _ids(raw: Any) -> tuple[str | None, str | None]:
    if isinstance(raw, PreflightInput):
        return raw.user_id, raw.agent_id
    if isinstance(raw, Mapping):
        user, agent = raw.get("user_id"), raw.get("agent_id")
        return (user if isinstance(user, str) else None, agent if isinstance(agent, str) else None)
    return None, None


def _encodable(text: str | None) -> str | None:
    """`text` if it can be written as UTF-8, else None (it cannot go into an event)."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return text


def _new_id() -> str:
    return str(uuid.uuid4())


def create_preflight(
    hooks: Mapping[str, Hook] | None = None,
    storage: Storage | None = None,
    sink: EventSink | None = None,
    clock: Callable[[], str] | None = None,
    strict: bool = False,
) -> Preflight:
    """Build a preflight engine, refusing wiring it cannot trust (raises `ConstructionError`).

    `hooks` maps hook names to functions or coroutines. The six required hooks must be given;
    unknown names and non-callables are refused; with `strict=True`, so are the defaults of
    `apply_field_policy`, `validate_field_schema` and `verify_user_checklist_item`, which verify
    nothing. `sink` defaults to an in-memory sink (`preflight.sink.events`).
    """
    given = dict(hooks or {})
    unknown = sorted(n for n in given if n not in ALL_HOOKS)
    if unknown:
        raise ConstructionError(f"unknown hook name(s): {', '.join(unknown)}")
    not_callable = sorted(n for n, fn in given.items() if not callable(fn))
    if not_callable:
        raise ConstructionError(f"hook(s) not callable: {', '.join(not_callable)}")
    missing = [n for n in REQUIRED_HOOKS if n not in given]
    if missing:
        raise ConstructionError(f"required hook(s) missing: {', '.join(missing)}")
    if (
        storage is None
        or not callable(getattr(storage, "persist", None))
        or not callable(getattr(storage, "load", None))
    ):
        raise ConstructionError("storage with async persist(key, record) and load(key) is required")
    if sink is not None and not callable(getattr(sink, "publish", None)):
        raise ConstructionError("sink must have an async publish(events)")
    if clock is not None and not callable(clock):
        raise ConstructionError("clock must be a callable returning an ISO 8601 string")
    unsafe = tuple(n for n in UNSAFE_DEFAULT_HOOKS if n not in given)
    if strict and unsafe:
        raise ConstructionError(f"strict: unsafe default(s) not permitted: {', '.join(unsafe)}")
    merged: dict[str, Hook] = {**DEFAULT_HOOKS, **given}
    return Preflight(merged, storage, sink or MemoryEventSink(), clock or utc_now, unsafe)


AsyncCallTool = Callable[[str, dict[str, Any]], Awaitable[Any]]
