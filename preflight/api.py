"""The public engine object: construction checks, run, record, execute (SPEC §2.4).

`create_preflight` refuses to build without its six required hooks; `run` decides and never raises
for bad input (a malformed input is a recorded `hold`); `record` makes the run durable (events first,
then the record) and raises `RecordingError` if it cannot; `execute_if_ready` acts only on a state
this instance recorded with decision `execute`, calls the tool once and records the outcome.

Two options tighten the path (both off by default, so a run decides as the reference skeleton did):
`require_approval=True` judges every run that would execute for admission (SPEC §4, see
`preflight.reversibility`), and `signer=` signs every `execute` decision so that `execute_if_ready`
acts only on a decision whose signature, expiry, tool, arguments and nonce verify (see
`preflight.signing`); with `verifier=` it also acts on a decision another process signed with a
trusted key.
"""

from __future__ import annotations

import asyncio
import binascii
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from preflight.admission import ContractInput
from preflight.arguments import call_arguments
from preflight.emit import Sign, outcome_event, read_back_event, rebuild_record, run_events
from preflight.engine import Decided, backstop, decide, execution_refused, invalid_input, started_summary, validate_tool
from preflight.errors import ChainError, ConstructionError, OutcomeNotRecorded, RecordingError, effect_unknown_cause
from preflight.events import Envelope, ExecutionApproved, PreflightEvent, digest, verify_run
from preflight.hooks import ALL_HOOKS, CALL_SUCCEEDED, DEFAULT_HOOKS, REQUIRED_HOOKS, UNSAFE_DEFAULT_HOOKS, Hook, call
from preflight.inputs import PreflightInput, Tool
from preflight.ports import EventSink, ReplayStore, Storage
from preflight.protect import ProtectionError, RunSealer, ValueProtector, baseline_view
from preflight.records import (
    ExecutionRecord,
    ExecutionRefusalCode,
    KeptEvents,
    RunRef,
    RunRefMembers,
    event_member,
)
from preflight.replay import DecisionClaim, MemoryReplayStore
from preflight.results import output_check, structured_content, tool_error
from preflight.reversibility import AdmissionPolicy
from preflight.signing import REPLAY_CACHE_LIMIT, DecisionSigner, DecisionVerifier, SignedDecision
from preflight.testing import MemoryEventSink
from preflight.tracing import NO_SPAN, RunSpan, run_span, traced

CallTool = Callable[[str, dict[str, Any]], Any]
log = logging.getLogger("preflight")
#: The waits before each new attempt to record an outcome recorded after its answer (`execute_if_ready`).
OUTCOME_RETRY_S = (0.1, 0.5, 2.0)
RECENT_RUNS = 100_000
PENDING_EXECUTIONS = 100_000
#: How many signed runs not yet recorded are remembered (one is normally recorded at once; an older one is
#: verified in full when acted on).
SIGNED_UNRECORDED = 1_000
#: The ids a run draws at its start (`Preflight._run`, one read of random bytes): its own, and the ones its events
#: and decision take (`len(steps) + 4`) when it took at most 11 steps; a longer run draws those again. One read
#: of random bytes a run where there were two (the run's own id was a `new_id`: ~0.9 us warm; bench/README.md,
#: engine, fourteenth pass).
RUN_IDS = 16


#: The last second `utc_now` wrote, and its text up to the seconds.
_SECOND: tuple[int, str] = (-1, "")
#: The last millisecond `utc_now` wrote, and its whole text.
_MILLISECOND: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """ISO 8601 UTC with milliseconds and a Z, as the seed's records show (`2026-12-05T08:03:01.123Z`).

    The text `datetime.now(UTC).isoformat(timespec="milliseconds")` gives (the same clock, milliseconds
    truncated), written from the clock's nanoseconds with the second's text kept, and the millisecond's
    whole text kept: the clock is read every time, and a run reads it a dozen times, mostly within one
    millisecond. datetime's way costs ~4-6 us a reading, the second's text kept ~0.5, the millisecond's
    ~0.15 (bench/README.md, engine)."""
    global _SECOND, _MILLISECOND
    millisecond = time.time_ns() // 1_000_000
    kept = _MILLISECOND
    if kept[0] == millisecond:
        return kept[1]
    second, rest = divmod(millisecond, 1000)
    prefix = _SECOND
    if prefix[0] != second:
        prefix = _SECOND = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    text = f"{prefix[1]}.{rest:03d}Z"
    _MILLISECOND = (millisecond, text)
    return text


@dataclass(frozen=True)
class ExecutionOutcome:
    """What `execute_if_ready` did. `held` means nothing was called.

    `state` is the record of the call (`executed` / `failed`), or for `held` the state given (and for a call
    whose outcome is recorded after its answer, ``await_outcome=False``, the decision as recorded). A held
    `execute` decision is recorded as a run of its own (`refusal`: a `hold` whose gate is an
    `ExecutionGate` naming the decision and the `code` of the refusal); `code` is that code.
    """

    status: Literal["executed", "failed", "held", "effect_unknown"]
    state: ExecutionRecord
    result: Any = None
    error: BaseException | None = None
    reason: str = ""
    code: str | None = None
    refusal: ExecutionRecord | None = None


@dataclass(frozen=True)
class Refusal:
    """Why a state must not be executed: a code (`preflight.records.ExecutionRefusalCode`) and words."""

    code: ExecutionRefusalCode
    reason: str


class Preflight:
    """A configured preflight engine. Build it with `create_preflight`."""

    def __init__(
        self,
        hooks: Mapping[str, Hook],
        storage: Storage,
        sink: EventSink,
        clock: Callable[[], str],
        unsafe_defaults: tuple[str, ...],
        *,
        admission: AdmissionPolicy | None = None,
        signer: DecisionSigner | None = None,
        verifier: DecisionVerifier | None = None,
        replay_store: ReplayStore | None = None,
        protector: ValueProtector | None = None,
    ) -> None:
        self._hooks = dict(hooks)
        self.storage = storage
        self.sink = sink
        self._clock = clock
        self.unsafe_defaults = unsafe_defaults
        self._admission = admission
        self._signer = signer
        self._verifier = verifier
        self._protector = protector
        # Where signed decisions are claimed before their call (`preflight.replay`); its reach is the
        # reach of "executes at most once".
        self.replay_store: ReplayStore = replay_store if replay_store is not None else MemoryReplayStore()
        #: This engine object's name in the claims it makes.
        self.engine_id = f"engine-{uuid.uuid4().hex[:12]}"
        # Bounded memory: recent recorded runs (for idempotent re-recording) and the `execute`
        # decisions not yet acted on, each with the digest of the record as it was recorded.
        self._recorded: BoundedSet = BoundedSet(RECENT_RUNS)
        self._executable: OrderedDict[str, _Pending] = OrderedDict()
        # The `execute` decisions this engine signed and has not recorded yet, each with the record (frozen) it
        # signed it for: `record` keeps it with the pending decision when given that very record.
        self._signed_here: OrderedDict[str, tuple[ExecutionRecord, SignedDecision]] = OrderedDict()
        #: Per action key, the call whose effect is unknown and not yet read back (SPEC §2.7): while it is
        #: here, a run of that key that would execute holds (`timed_out_without_readback`; judged with
        #: ``require_approval=True``).
        self.unsettled: dict[str, ExecutionRecord] = {}
        if admission is not None:
            admission.unsettled = self._unsettled_record
        #: The outcomes being recorded after their answer (``await_outcome=False``); `drain` waits for them.
        self._recording: set[asyncio.Task[None]] = set()
        #: Told of each outcome recorded after its answer that could not be recorded (after its retries).
        self.on_outcome_not_recorded: Callable[[OutcomeNotRecorded], None] | None = None

    # ---- deciding ----------------------------------------------------------------------------------

    async def run(self, input: Any) -> ExecutionRecord:
        """Decide one run. Never raises for bad input or failing hooks: those are recorded holds.

        A protected engine raises `preflight.protect.KeyStoreError` when the key store cannot give the
        user's key: nothing is then recorded, as nothing could be sealed."""
        if not traced():  # no span would open: no context manager entered for it either (~1 us a run)
            return await self._run(input, NO_SPAN)
        with run_span(input) as span:  # preflight.tracing: a span per run, never a value in it
            return await self._run(input, span)

    async def _run(self, input: Any, span: RunSpan) -> ExecutionRecord:
        user_id, agent_id = _ids(input)
        ids = new_ids(RUN_IDS)
        run_id = next(ids)
        # `_sealer`, without its call where there is no protector: before deciding (the action key is its pseudonym)
        protector = self._protector
        sealer = protector.sealer(user_id, run_id) if protector is not None else None
        decided = await self._decide(input, sealer.pseudonym if sealer is not None else None)
        state = self._emit(decided, user_id, agent_id, run_id=run_id, sealer=sealer, ids=ids)
        span.record(state, gap_class=decided.trace.gap_class, gate=decided.trace.gate_name)
        return state

    def _emit(
        self,
        decided: Decided,
        user_id: str | None,
        agent_id: str | None,
        *,
        run_id: str | None = None,
        sealer: RunSealer | None = None,
        ids: Iterator[str] | None = None,
    ) -> ExecutionRecord:
        """The decided run's record, carrying its events (sealed and signed as this engine does). `ids`: the
        `RUN_IDS - 1` ids left of what the run drew at its start, if it did."""
        if run_id is None:
            run_id = new_id()
            sealer = self._sealer(user_id, run_id)
        signed: list[SignedDecision] = []
        # Every id the run's events and its decision take, at most (`run_events`: its start, its steps, the gate
        # or deferral or approval and the decision's id, its close): those left of the run's draw when enough
        # are, else drawn at once now.
        taken = len(decided.trace.steps) + 4
        if ids is None or taken > RUN_IDS - 1:
            ids = new_ids(taken)
        try:
            events, ref = run_events(
                decided,
                run_id=run_id,
                user_id=user_id,
                agent_id=agent_id,
                clock=self._clock,
                new_id=ids.__next__,
                sign=self._signing(signed),
                sealer=sealer,
            )
        except Exception as exc:  # an unrecordable decision is itself a backstop hold
            decided = backstop(exc, [], self._clock(), started_summary(None, None))
            events, ref = run_events(
                decided,
                run_id=run_id,
                user_id=_encodable(user_id),
                agent_id=_encodable(agent_id),
                clock=self._clock,
                new_id=new_id,
                sealer=sealer,
            )
        if sealer is not None:
            sealer.close()
        # The decided record is the run's own (each `Decided` is made with its record, handed to no one before
        # this): given its run in place, not copied (`ExecutionRecord.given_run`).
        state = decided.record.given_run(ref, events)
        if len(signed) == 1 and state.execution_decision == "execute":
            self._signed_here[run_id] = (state, signed[0])
            while len(self._signed_here) > SIGNED_UNRECORDED:
                self._signed_here.popitem(last=False)
        return state

    async def _decide(self, raw: Any, pseudonym: Callable[[str], str] | None = None) -> Decided:
        try:
            # A dict (the usual input) validated without the class check: `isinstance` against a model runs
            # pydantic's Python `__instancecheck__` (~70 against ~18 ns alone).
            inp = (
                PreflightInput.model_validate(raw) if type(raw) is dict or not isinstance(raw, PreflightInput) else raw
            )
        except ValidationError as exc:
            return invalid_input(raw, exc, self._clock())
        try:
            return await decide(self._hooks, inp, self._clock, self._load_baseline, self._admission, pseudonym)
        except Exception as exc:
            checklist = inp.user_checklist if isinstance(inp.user_checklist, list) else []
            return backstop(exc, checklist, self._clock(), started_summary(None, inp))

    async def _load_baseline(self, action_key: str) -> ExecutionRecord | None:
        record = await self.storage.load(action_key)
        if record is not None and record.execution_decision != "executed":
            # A storage that hands back anything but an executed record is not a baseline source.
            return None
        # Sealed values opened with this engine's keys; a value that cannot be opened (erased key, no
        # protector) makes its field unknown: never inherited, never handed to a tool sealed.
        return baseline_view(record, self._protector)

    def _unsettled_record(self, action_key: str) -> str | None:
        """The run id of `action_key`'s unsettled unknown effect (None: none)."""
        record = self.unsettled.get(action_key)
        return record.run_ref.run_id if record is not None and record.run_ref is not None else None

    def _sealer(self, user_id: str | None, run_id: str) -> RunSealer | None:
        """The run's sealer in a protected engine (None otherwise). Raises `KeyStoreError`."""
        return self._protector.sealer(user_id, run_id) if self._protector is not None else None

    def _durable(self, state: ExecutionRecord) -> ExecutionRecord:
        """The record storage keeps: in a protected engine, the record as its events carry it (sealed)."""
        if self._protector is None:
            return state
        return rebuild_record(state.run_events, verify=False)

    def _persist(self, state: ExecutionRecord) -> Awaitable[None]:
        """Hand `state`'s record to storage, unless the storage says it keeps none (``keeps_records =
        False``, `preflight.ports.Storage`): then no record is built only to be discarded. The caller awaits what
        this returns, the storage's `persist` itself: no coroutine of its own around it (one frame less a record,
        ~0.12 us alone; bench/README.md, engine, sixteenth pass)."""
        storage = self.storage
        if getattr(storage, "keeps_records", True) is False:
            return _nothing()
        return storage.persist(state.storage_key, self._durable(state))

    def _arguments_digest(self, state: ExecutionRecord, reference: str) -> str | None:
        """The arguments digest a decision over `state` carries: keyed, under the key `reference` names,
        in a protected engine (None when that key is gone: the decision cannot be checked)."""
        arguments = call_arguments({f.name: f.value for f in state.fields or ()})
        if self._protector is None:
            return digest(arguments)
        return self._protector.digest_like(reference, arguments)

    # ---- recording ---------------------------------------------------------------------------------

    def events_of(self, state: ExecutionRecord) -> list[PreflightEvent]:
        """The events an engine built for `state`'s run (empty for a state no engine built)."""
        return list(state.run_events)

    async def record(self, state: ExecutionRecord) -> ExecutionRecord:
        """Publish the run's events, then append its record. Idempotent for the same run.

        Raises `RecordingError` when either cannot be made durable: no record, no execution.
        """
        ref = state.run_ref
        events = state.kept_events  # the models are not built to publish them (`KeptEvents`)
        if ref is None or not events or event_member(events, 0, "run_id") != ref.run_id:
            raise RecordingError("this state was not produced by a preflight run(); refusing to record it")
        run_id = ref.run_id  # read once: a model's member is read by pydantic's slower attribute path
        if run_id in self._recorded:
            return state
        try:
            await self.sink.publish(events)
        except Exception as exc:
            raise RecordingError(f"the run's events were not acknowledged by the event log: {exc}") from exc
        try:
            await self._persist(state)
        except Exception as exc:
            raise RecordingError(f"the run's record could not be stored: {exc}") from exc
        self._recorded.add(run_id)
        if state.execution_decision == "execute":
            recorded = _record_digest(state)
            signed_here = self._signed_here.pop(run_id, None)
            # What this engine signed for this very record; None (a state changed since it was signed, or
            # signed elsewhere) leaves the signature to be verified when it is acted on.
            own = signed_here[1] if signed_here is not None and signed_here[0] is state else None
            self._executable[run_id] = (recorded, ref.members(), own)
            while len(self._executable) > PENDING_EXECUTIONS:
                self._executable.popitem(last=False)
        return state

    async def admit_read(self, input: Any, *, named_read_only: bool = False) -> ExecutionRecord:
        """Decide a read-only call by admission alone (SPEC §2.7, `preflight.reads.decide_read`) and record
        it: ``execute`` with the model's arguments, or a named ``hold``. Unkeyed: never a baseline.

        :raises ValueError: the tool is not judged read-only (it goes through `run_and_record`)."""
        from preflight.reads import decide_read

        return await self._record_unkeyed(
            input, lambda inp: decide_read(inp, self._clock, named_read_only=named_read_only)
        )

    async def record_forward(self, input: Any, *, reason: str, shadow_of: str | None = None) -> ExecutionRecord:
        """Record a call forwarded unchanged in shadow mode (`preflight.reads.decide_forward`): an unkeyed
        ``execute`` with the model's arguments, so `execute_if_ready` records its outcome, never a baseline.
        `shadow_of` is the judged run's id: the call is counted once, as that run, which shows the outcome."""
        from preflight.reads import decide_forward

        return await self._record_unkeyed(
            input, lambda inp: decide_forward(inp, self._clock, reason=reason, shadow_of=shadow_of)
        )

    async def _record_unkeyed(self, input: Any, decide_it: Callable[[PreflightInput], Decided]) -> ExecutionRecord:
        with run_span(input) as span:
            user_id, agent_id = _ids(input)
            run_id = new_id()
            sealer = self._sealer(user_id, run_id)
            try:
                inp = input if isinstance(input, PreflightInput) else PreflightInput.model_validate(input)
            except ValidationError as exc:
                decided = invalid_input(input, exc, self._clock())
            else:
                decided = decide_it(inp)
            state = self._emit(decided, user_id, agent_id, run_id=run_id, sealer=sealer)
            span.record(state, gap_class=decided.trace.gap_class, gate=decided.trace.gate_name)
        return await self.record(state)

    async def run_and_record(self, input: Any) -> ExecutionRecord:
        """`run` then `record`, as a pair, so nothing goes unrecorded."""
        if not traced():  # `run`'s untraced path, without its coroutine frame (~0.12 us alone; bench/README.md)
            return await self.record(await self._run(input, NO_SPAN))
        return await self.record(await self.run(input))

    async def prior_state(self, action_key: str) -> ExecutionRecord | None:
        """The baseline for `action_key`: its latest executed record, or None."""
        return await self._load_baseline(action_key)

    # ---- executing ---------------------------------------------------------------------------------

    async def execute_if_ready(
        self, state: ExecutionRecord, tool: Any, call_tool: CallTool, *, await_outcome: bool = True
    ) -> ExecutionOutcome:
        """Call `tool` once for a recorded `execute` decision; record `executed` or `failed`.

        Never retries: a raised call may still have had its effect. Never mutates `state`.
        With a signer or a verifier, a decision's signature, expiry, tool, arguments and nonce must
        verify too, and a decision signed by a trusted key in another process is acted on as well.

        ``await_outcome=False`` (the gateway's admitted reads) returns once the tool answered and records
        the outcome after: its event is built (the result's digest, its output check, the sealing) and
        published in a task of this engine's, retried (`OUTCOME_RETRY_S`), and if it still fails (or cannot
        be built), an `OutcomeNotRecorded` is logged and handed to `on_outcome_not_recorded`; `drain` waits
        for such tasks. The returned outcome's `state` is then the decision as recorded (its run ends at the
        decision; the outcome event follows it in the log), except for an unknown effect, whose record is
        built before returning (its action key holds at once). The decision is recorded before the call
        either way. A process that dies before the outcome is acknowledged leaves the run open (admitted, no
        outcome), never executed.
        """
        definition = _tool_definition(tool)  # validated once: the gate below and the output check read it
        refusal, signed = self._refusal(state, definition)
        if refusal is None and signed is not None:
            refusal = await self._claim(signed)  # before the call: a second use is a replay
        if refusal is not None:
            return await self._held(state, tool, refusal)
        ref = state.run_ref
        assert ref is not None and state.fields is not None and state.fixed is not None
        # A protected engine takes the user's key before the call: a key store that fails calls nothing.
        sealer = self._sealer(event_member(state.kept_events, 0, "user_id"), ref.run_id)
        self._executable.pop(ref.run_id, None)  # consumed before the call: a second call is a replay

        arguments = call_arguments({f.name: f.value for f in state.fields})
        result: Any = None
        error: BaseException | None = None
        try:
            result = await call(call_tool, state.fixed.c3_provider_action_name, dict(arguments))
        except Exception as exc:
            error = exc
        else:
            error = tool_error(result)  # an MCP error result is a failed call, never an execution
        cause = effect_unknown_cause(error)
        suffix = CALL_SUCCEEDED if error is None else f"call failed: {type(error).__name__}: {error}"
        if cause is not None:
            suffix = f"effect unknown ({cause}): {type(error).__name__}: {error}"
        status: Literal["executed", "failed", "effect_unknown"] = (
            "executed" if error is None else "effect_unknown" if cause else "failed"
        )
        if not await_outcome and cause is None:
            # The answer goes back now; the outcome's event (the result's digest, its output check, the
            # sealing) is built after it, in the recording task, with the time the call answered.
            answered = self._clock()
            early = ExecutionOutcome(status=status, state=state, result=result, error=error, reason=suffix)
            self._record_later(
                lambda: self._outcome_record(state, definition, sealer, result, error, suffix, lambda: answered),
                early,
            )
            return early
        event, final = self._outcome_record(state, definition, sealer, result, error, suffix, self._clock)
        outcome = ExecutionOutcome(status=status, state=final, result=result, error=error, reason=suffix)
        if cause is not None and final.action_key is not None:
            self.unsettled[final.action_key] = final  # before publishing: held even if recording fails
        if not await_outcome:
            self._record_later(lambda: (event, final), outcome)
            return outcome
        try:
            await self.sink.publish([event])
            await self._persist(final)
        except Exception as exc:
            raise RecordingError(
                f"the tool was called ({outcome.status}) but the outcome could not be recorded: {exc}",
                outcome,
            ) from exc
        return outcome

    def _outcome_record(
        self,
        state: ExecutionRecord,
        definition: Tool | None,
        sealer: RunSealer | None,
        result: Any,
        error: BaseException | None,
        suffix: str,
        clock: Callable[[], str],
    ) -> tuple[PreflightEvent, ExecutionRecord]:
        """The outcome event of `state`'s call and the record it ends (`state`'s run extended by it); the
        run's sealer is closed after it."""
        ref = state.run_ref
        assert ref is not None
        try:
            output_schema = definition.output_schema_json if definition is not None else None
            checked = None if error is not None else output_check(structured_content(result), output_schema)
            cause = effect_unknown_cause(error)
            final = state.model_copy(
                update={
                    "execution_decision": "executed" if error is None else "effect_unknown" if cause else "failed",
                    "reason": f"{state.reason} / {suffix}",
                    "timestamp": clock(),
                }
            )
            events = state.kept_events
            event = outcome_event(
                state,
                ref,
                executed=final,
                error=error,
                result=result,
                user_id=event_member(events, 0, "user_id"),
                agent_id=event_member(events, 0, "agent_id"),
                clock=clock,
                new_id=new_id,
                sealer=sealer,
                checked=checked,
            )
        finally:
            if sealer is not None:
                sealer.close()
        ran = events.then(event) if isinstance(events, KeptEvents) else (*events, event)
        final = final.with_run_ref(ref.model_copy(update={"last_hash": event.hash, "next_seq": ref.next_seq + 1}), ran)
        return event, final

    def _record_later(
        self, build: Callable[[], tuple[PreflightEvent, ExecutionRecord]], outcome: ExecutionOutcome
    ) -> None:
        """Record an outcome after its answer, in a task of this engine's (`drain` waits for it)."""
        task = asyncio.get_running_loop().create_task(self._record_outcome(build, outcome))
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _record_outcome(
        self, build: Callable[[], tuple[PreflightEvent, ExecutionRecord]], outcome: ExecutionOutcome
    ) -> None:
        """Build and record an outcome after its answer, retried; a last failure (or an outcome that cannot be
        built) is an `OutcomeNotRecorded`, logged and told (never dropped silently). A retry may publish the
        event twice: consumers keep one (event id)."""
        run_id = outcome.state.run_ref.run_id if outcome.state.run_ref is not None else "?"
        try:
            event, final = build()
        except Exception as exc:
            failure: Exception = exc
            attempts = 0
        else:
            attempts = len(OUTCOME_RETRY_S) + 1
            for wait in (*OUTCOME_RETRY_S, None):
                try:
                    await self.sink.publish([event])
                    await self._persist(final)
                    return
                except Exception as exc:
                    failure = exc
                if wait is not None:
                    log.warning("the outcome of run %s is not recorded yet (%s); retrying", run_id, failure)
                    await asyncio.sleep(wait)
        how = f"after {attempts} attempts" if attempts else "its event could not be built"
        error = OutcomeNotRecorded(
            f"the tool was called ({outcome.status}) but the outcome of run {run_id} could not be recorded"
            f" ({how}): {failure}",
            outcome,
        )
        log.error("%s", error)
        if self.on_outcome_not_recorded is not None:
            try:
                self.on_outcome_not_recorded(error)
            except Exception:  # a listener's own failure must not hide the error it was told of
                log.exception("the listener of an unrecorded outcome failed")

    async def drain(self) -> None:
        """Wait until every outcome being recorded after its answer is recorded, or reported unrecorded."""
        while self._recording:
            await asyncio.gather(*self._recording, return_exceptions=True)

    def restore_unsettled(self, events: Sequence[PreflightEvent]) -> ExecutionRecord:
        """Hold again a run whose call's effect is unknown, from its events (kept by the caller across a
        restart): its chain is verified and it must end in `effect_unknown` (`ValueError` otherwise)."""
        record = rebuild_record(events, opener=self._protector)
        if record.execution_decision != "effect_unknown" or record.action_key is None:
            raise ValueError(f"run {record.run_ref.run_id if record.run_ref else '?'} has no unknown effect to hold")
        self.unsettled[record.action_key] = record
        return record

    def unsettled_effect(self, user_id: str | None, tool_name: str) -> ExecutionRecord | None:
        """This engine's unsettled `effect_unknown` record of `user_id`'s `tool_name`, if any."""
        for record in self.unsettled.values():
            first = record.run_events[0] if record.run_events else None
            if (
                record.fixed is not None
                and record.fixed.c3_provider_action_name == tool_name
                and getattr(first, "user_id", None) == user_id
            ):
                return record
        return None

    async def settle_effect(
        self,
        state: ExecutionRecord,
        *,
        took_effect: bool,
        basis: Literal["readback_tool", "user"],
        reason: str,
        readback_tool: str | None = None,
        readback_result: Any = None,
    ) -> ExecutionRecord:
        """Record what settled `state`'s unknown effect (SPEC §2.7): a read-only tool's result the settings
        map to "took effect" or "did not" (`basis` ``readback_tool``), or the user's word (``user``).

        The run is then ``executed`` (it took effect: a baseline, its fields' origins kept) or ``failed``,
        and its action key no longer holds. Raises `RecordingError` if the read-back cannot be recorded (the
        key keeps holding) and `ValueError` for a state whose effect is not unknown."""
        ref = state.run_ref
        if state.execution_decision != "effect_unknown" or ref is None or not state.run_events:
            raise ValueError("only a recorded effect_unknown outcome can be settled")
        first = state.run_events[0]
        sealer = self._sealer(first.user_id, ref.run_id)
        words = "took effect" if took_effect else "did not take effect"
        text = f"{state.reason} / read back ({basis}): {words}: {reason}"
        event = read_back_event(
            state,
            ref,
            took_effect=took_effect,
            basis=basis,
            readback_tool=readback_tool,
            readback_result=readback_result,
            reason=text,
            timestamp=self._clock(),
            user_id=first.user_id,
            agent_id=first.agent_id,
            clock=self._clock,
            new_id=new_id,
            sealer=sealer,
        )
        if sealer is not None:
            sealer.close()
        final = state.model_copy(
            update={
                "execution_decision": "executed" if took_effect else "failed",
                "reason": text,
                "timestamp": event.timestamp,  # type: ignore[union-attr]
            }
        ).with_run_ref(
            ref.model_copy(update={"last_hash": event.hash, "next_seq": ref.next_seq + 1}),
            (*state.run_events, event),
        )
        try:
            await self.sink.publish([event])
            await self._persist(final)
        except Exception as exc:
            raise RecordingError(f"the read-back could not be recorded: {exc}") from exc
        if state.action_key is not None and self.unsettled.get(state.action_key) is state:
            del self.unsettled[state.action_key]
        return final

    async def _claim(self, signed: SignedDecision) -> Refusal | None:
        """Claim the decision in the replay store; a refusal if it is not this engine's to act on."""
        try:
            refused = await self.replay_store.claim(DecisionClaim.of(signed, self.engine_id))
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            return Refusal("replay_store_unavailable", f"the replay store cannot vouch for this decision: {text}")
        return Refusal("decision_replayed", refused) if refused is not None else None

    async def _held(self, state: Any, tool: Any, refusal: Refusal) -> ExecutionOutcome:
        """The outcome of a refused call; an `execute` decision's refusal is recorded as a run of its own.

        Raises `RecordingError` (its `outcome` the held one: nothing was called) if that run cannot be
        made durable."""
        outcome = ExecutionOutcome(status="held", state=state, reason=refusal.reason, code=refusal.code)
        if not isinstance(state, ExecutionRecord) or state.execution_decision != "execute":
            return outcome  # nothing was decided for execution: the run's own record says what it decided
        try:
            tool_name: str | None = validate_tool(tool).name
        except (ValidationError, TypeError):
            tool_name = None
        first = state.run_events[0] if state.run_events else None
        user_id = getattr(first, "user_id", None) if isinstance(getattr(first, "user_id", None), str) else None
        agent_id = getattr(first, "agent_id", None) if isinstance(getattr(first, "agent_id", None), str) else None
        ref = state.run_ref
        decided = execution_refused(
            action_key=state.action_key,
            tool_name=tool_name,
            code=refusal.code,
            reason=refusal.reason,
            decision_id=ref.decision_id if ref is not None else None,
            decided_run_id=ref.run_id if ref is not None else None,
            now=self._clock(),
        )
        record = self._emit(decided, user_id, agent_id)
        try:
            await self.record(record)
        except RecordingError as exc:
            raise RecordingError(
                f"an execution was refused (nothing was called) but not recorded: {exc}", outcome
            ) from exc
        return ExecutionOutcome(status="held", state=state, reason=refusal.reason, code=refusal.code, refusal=record)

    def _signing(self, signed: list[SignedDecision]) -> Sign | None:
        """How this engine signs its `execute` decisions (None: it does not); each decision it signs is
        appended to `signed`."""
        signer = self._signer
        if signer is None:
            return None

        def sign(fields: Mapping[str, str | None]) -> Mapping[str, Any]:
            def text(name: str) -> str:
                value = fields[name]
                if not isinstance(value, str):
                    raise TypeError(f"a signed decision needs a {name}")
                return value

            decision = signer.sign(
                decision_id=text("decision_id"),
                run_id=text("run_id"),
                action_key=fields["action_key"],
                tool_name=text("tool_name"),
                arguments_digest=text("arguments_digest"),
            )
            signed.append(decision)
            return decision.event_fields()

        return sign

    def _refusal(self, state: Any, tool: Tool | None) -> tuple[Refusal | None, SignedDecision | None]:
        """Why `state` must not be executed with `tool` (validated; None: not a valid tool definition) (None if
        it may), and its signed decision."""
        if not isinstance(state, ExecutionRecord):
            return Refusal("not_execute", "not an execution record"), None
        if state.execution_decision != "execute":
            return Refusal("not_execute", f"decision is {state.execution_decision}, not execute"), None
        ref = state.run_ref
        if ref is None or not state.kept_events or state.fields is None or state.fixed is None:
            return Refusal("state_unrecorded", "this state was not recorded by this preflight"), None
        own = ref.run_id in self._recorded
        pending: _Pending | None = None
        if own:
            pending = self._executable.get(ref.run_id)
            if pending is None:
                return Refusal(
                    "decision_replayed", "this decision was already acted on (or is no longer pending)"
                ), None
            recorded, recorded_ref, _ = pending
            if type(ref) is not RunRef or ref.members() != recorded_ref or _record_digest(state) != recorded:
                return Refusal("state_altered", "this state differs from the decision that was recorded"), None
        elif self._verifier is None:
            return Refusal("state_unrecorded", "this state was not recorded by this preflight"), None
        else:
            problem = _foreign_state_problem(state, ref, self._protector)
            if problem is not None:
                return problem, None
        if tool is None:
            return Refusal("tool_mismatch", "the tool given is not a valid tool definition"), None
        name = tool.name
        judged = state.fixed.c3_provider_action_name
        if name != judged:
            return Refusal("tool_mismatch", f"the tool given ({name}) is not the one judged ({judged})"), None
        if self._verifier is None:
            return None, None
        signed_here = None if pending is None else pending[2]
        if signed_here is not None:
            # This engine signed it and recorded it, and the state is still what was recorded (its digest):
            # verifying its own signature and digest again proves nothing new. Its validity window still holds.
            late = self._verifier.check_times(signed_here, self._verifier.now())
            if late is not None:
                return Refusal("decision_unverified", f"the signed decision is refused: {late}"), None
            return None, signed_here
        return self._signature_refusal(state, ref, unsigned_ok=own and self._signer is None)

    def _signature_refusal(
        self, state: ExecutionRecord, ref: RunRef, *, unsigned_ok: bool
    ) -> tuple[Refusal | None, SignedDecision | None]:
        """The signed decision's checks: trusted key, untouched payload, not expired, matching this
        state's run, key, tool and arguments (its nonce is claimed after these, `_claim`)."""
        assert self._verifier is not None and state.fields is not None and state.fixed is not None
        approved = [e for e in state.run_events if isinstance(e, ExecutionApproved)]
        if len(approved) != 1:
            reason = "the decision's events do not hold exactly one execution_approved event"
            return Refusal("state_altered", reason), None
        if approved[0].signature is None and unsigned_ok:
            return None, None  # this engine's own unsigned decision, checked by its record digest
        signed = SignedDecision.from_approved(approved[0])
        if signed is None:
            return Refusal("decision_unverified", "the decision carries no signature: it cannot be verified"), None
        problem = self._verifier.check(signed)
        if problem is not None:
            return Refusal("decision_unverified", f"the signed decision is refused: {problem}"), None
        expected = {
            "decision_id": ref.decision_id,
            "run_id": ref.run_id,
            "action_key": state.action_key,
            "tool_name": state.fixed.c3_provider_action_name,
            "arguments_digest": self._arguments_digest(state, signed.arguments_digest),
        }
        for name, value in expected.items():
            if getattr(signed, name) != value:
                return Refusal("state_altered", f"the signed decision is refused: its {name} is not this state's"), None
        return None, signed


#: An `execute` decision this engine recorded and has not acted on: the digest of its record, its run reference's
#: members (`RunRef.members`) and the decision it signed (None: unsigned). A tuple of strings and integers, not
#: objects: one is kept for each `execute` decision recorded (up to `PENDING_EXECUTIONS`), and the garbage
#: collector stops tracking such a tuple, where a dataclass holding a `RunRef` left 4 objects a decision for every
#: full collection to walk (bench/README.md, twelfth pass).
_Pending = tuple[str, RunRefMembers, SignedDecision | None]


def _tool_definition(tool: Any) -> Tool | None:
    """`tool` validated (a `Tool` is taken as it is), or None if it is not a valid tool definition."""
    try:
        return validate_tool(tool)
    except (ValidationError, TypeError):
        return None


def _record_digest(state: ExecutionRecord) -> str:
    """The digest of `state`'s JSON (`model_dump(mode="json")`, written by `ExecutionRecord.as_json`): taken
    when an `execute` decision is recorded and again when it is acted on; written at once where that JSON is
    known plain (`ExecutionRecord.written`)."""
    written, plain = state.written()
    return digest(written, plain=plain)


def _foreign_state_problem(
    state: ExecutionRecord, ref: RunRef, protector: ValueProtector | None = None
) -> Refusal | None:
    """Why a state this engine did not record is not the decision its own events describe (or None).

    Its events must form an intact, closed run without an outcome, and rebuild exactly to the state
    and its run reference; the signature over the decision is checked after this."""
    events = list(state.run_events)
    if not all(isinstance(e, Envelope) for e in events):
        return Refusal("state_altered", "this state does not carry its run's events")
    try:
        verify_run(events)
    except ChainError as exc:
        return Refusal("state_altered", f"the decision's events do not verify: {exc}")
    if getattr(events[-1], "event_type", None) != "run_closed":
        return Refusal("decision_replayed", "this decision was already acted on (its run has an outcome)")
    try:
        rebuilt = rebuild_record(events, verify=False, opener=protector)  # opened: the state is plaintext
    except (ChainError, ProtectionError, ValueError, KeyError, IndexError, TypeError) as exc:
        return Refusal("state_altered", f"the decision's events do not describe a record: {type(exc).__name__}")
    if rebuilt.model_dump(mode="json") != state.model_dump(mode="json") or rebuilt.run_ref != ref:
        return Refusal("state_altered", "this state differs from the decision its events record")
    return None


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


async def _nothing() -> None:
    """What `Preflight._persist` hands back for a storage that keeps no records."""


def _ids(raw: Any) -> tuple[str | None, str | None]:
    if type(raw) is dict:  # the usual input, without the class checks below (~620 -> ~210 ns alone; bench/README.md)
        user, agent = raw.get("user_id"), raw.get("agent_id")
        return (user if isinstance(user, str) else None, agent if isinstance(agent, str) else None)
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


def new_id() -> str:
    """A random (version 4) UUID as text, as `str(uuid.uuid4())` writes it, in less than half its time
    (~0.9 us against ~5; a run takes eleven: its id, its events', its decision's; bench/README.md, engine)."""
    h = os.urandom(16).hex()
    # Version 4 (the 13th digit), the RFC 4122 variant (the 17th: its two high bits 10), set on the text.
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


def new_ids(count: int) -> Iterator[str]:
    """`count` ids, each as `new_id` writes it, from one read of `count` x 16 random bytes (the bytes of each in
    turn): a run takes a dozen or so, and one read costs what one read for one id costs (~0.9 us; bench/README.md,
    engine, twelfth pass). Nothing is kept between calls.

    All ids are written at once, in C, with no Python step an id (fourteenth pass: 11 ids ~1.85 us against
    ~5.2 written one at a time, the read apart). The hex text in groups of four digits
    (`binascii.hexlify(raw, b"-", 2)`: an id is 40 characters, ``aaaa-bbbb-cccc-dddd-eeee-ffff-gggg-hhhh-``) is
    mended by strided slices of every id at once: the version digit (at 15) made ``4``, the variant digit (at
    20) given its two high bits 10, the dash between ids (at 39) made a space to split by, and the three dashes
    an id's text has not deleted (at 34, 29 and 4; an id is one character shorter after each deletion, so the
    strides are 40, 39, 38): ``aaaabbbb-cccc-4ddd-Veee-ffffgggghhhh``."""
    text = bytearray(binascii.hexlify(os.urandom(16 * count), b"-", 2))
    text[15::40] = b"4" * count
    text[20::40] = text[20::40].translate(_VARIANT_DIGIT)
    text[39::40] = b" " * (count - 1)
    del text[34::40]
    del text[29::39]
    del text[4::38]
    return iter(text.decode().split())


#: A hex digit with its two high bits set to 10 (the RFC 4122 variant), by the digit.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
#: The same for a hex digit's ASCII byte (`bytes.translate`'s table; other bytes are never looked up).
_VARIANT_DIGIT = bytes(range(256)).translate(bytes.maketrans(b"0123456789abcdef", b"89ab89ab89ab89ab"))


def create_preflight(
    hooks: Mapping[str, Hook] | None = None,
    storage: Storage | None = None,
    sink: EventSink | None = None,
    clock: Callable[[], str] | None = None,
    strict: bool = False,
    *,
    require_approval: bool = False,
    contract: ContractInput | None = None,
    signer: DecisionSigner | None = None,
    verifier: DecisionVerifier | None = None,
    replay_cache_size: int = REPLAY_CACHE_LIMIT,
    replay_store: ReplayStore | None = None,
    protector: ValueProtector | None = None,
) -> Preflight:
    """Build a preflight engine, refusing wiring it cannot trust (raises `ConstructionError`).

    `hooks` maps hook names to functions or coroutines. The six required hooks must be given;
    unknown names and non-callables are refused; with `strict=True`, so are the defaults of
    `apply_field_policy`, `validate_field_schema` and `verify_user_checklist_item`, which verify
    nothing. `sink` defaults to an in-memory sink (`preflight.sink.events`).

    Reversibility (SPEC §3, §4; `preflight.reversibility`): with `require_approval=True` every run
    that would execute is judged by `assess_tool_invocation`, against `contract` (the operator's tool
    contract) if given, else against a contract derived from the tool; read-only tools may pass
    without approval, any other tool needs the input's `approval`, active and of matching scope. The
    default, `False`, judges no admission: a write executes on the value gate alone, as the reference
    skeleton did. A `contract` is only judged with `require_approval=True`.

    Signed decisions (SPEC §3; `preflight.signing`): with a `signer` every `execute` decision is
    signed and `execute_if_ready` checks the signature; `verifier` (default: one trusting the
    signer's key) also admits decisions signed by a trusted key in another process. Nonces acted on
    are claimed in `replay_store` before the call (`preflight.replay`): by default in this engine's memory,
    up to `replay_cache_size` of them, so "at most once" holds within this engine object; engines that
    must not act twice on one decision across processes, restarts or hosts share a durable store
    (`preflight.adapters.replay_file.FileReplayStore`, `preflight.adapters.replay_postgres.PostgresReplayStore`).
    A refused `execute` decision is recorded as a run of its own (a `hold` with an `ExecutionGate`).

    Protected values (SPEC §3; `preflight.protect`): with a `protector` every value a run writes into
    its events is sealed for the run's user before the event is hashed, digests of values are keyed,
    and storage is given the record as its events carry it (sealed); the record a caller gets keeps
    plaintext, and tier 4 opens the baseline with the protector (a value whose key was erased is
    unknown). Without one (the default) events carry plaintext values, as the reference skeleton did.
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
    admission = _admission_policy(require_approval, contract)
    if signer is not None and not isinstance(signer, DecisionSigner):
        raise ConstructionError("signer must be a preflight.signing.DecisionSigner")
    if verifier is not None and not isinstance(verifier, DecisionVerifier):
        raise ConstructionError("verifier must be a preflight.signing.DecisionVerifier")
    if signer is not None and verifier is None:
        verifier = signer.verifier()
    if signer is not None and verifier is not None and signer.key_id not in verifier.key_ids:
        raise ConstructionError(
            f"the verifier does not trust the signer's key ({signer.key_id}): no decision could execute"
        )
    if isinstance(replay_cache_size, bool) or not isinstance(replay_cache_size, int) or replay_cache_size < 1:
        raise ConstructionError("replay_cache_size must be a positive int")
    if replay_store is not None and not callable(getattr(replay_store, "claim", None)):
        raise ConstructionError("replay_store must have an async claim(claim)")
    if replay_store is not None and replay_cache_size != REPLAY_CACHE_LIMIT:
        raise ConstructionError("replay_cache_size sizes the default in-memory store: give it or a replay_store")
    if protector is not None and not isinstance(protector, ValueProtector):
        raise ConstructionError("protector must be a preflight.protect.ValueProtector")
    return Preflight(
        merged,
        storage,
        sink or MemoryEventSink(),
        clock or utc_now,
        unsafe,
        admission=admission,
        signer=signer,
        verifier=verifier,
        replay_store=replay_store if replay_store is not None else MemoryReplayStore(replay_cache_size),
        protector=protector,
    )


def _admission_policy(require_approval: bool, contract: ContractInput | None) -> AdmissionPolicy | None:
    if not isinstance(require_approval, bool):
        raise ConstructionError("require_approval must be True or False")
    if not require_approval:
        if contract is not None:
            raise ConstructionError("a tool contract is judged only with require_approval=True")
        return None
    try:
        return AdmissionPolicy(contract)
    except (ValueError, TypeError) as exc:
        raise ConstructionError(f"the tool contract cannot be read: {exc}") from exc


AsyncCallTool = Callable[[str, dict[str, Any]], Awaitable[Any]]
