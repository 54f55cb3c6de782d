"""From a decided run to its events, and from events back to the record (SPEC §5).

`run_events` seals a run's trace -- the events of the steps the decision path took, in its order
(`preflight.engine.Trace`) -- into its hash-chained events and closes the run from its record (the
gate, deferral or approval, then `run_closed`); `rebuild_record` is the pure
inverse the archive relies on: a run's record must be rebuildable exactly from its events. The two
are written independently so that a test comparing them means something.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from preflight.arguments import call_arguments
from preflight.engine import Decided
from preflight.errors import ChainError, effect_unknown_cause
from preflight.events import (
    EVENT_SCHEMA_VERSION,
    GENESIS_HASH,
    HASH_PLACEHOLDER,
    AdmissionAssessed,
    ChecklistItemVerified,
    EffectReadBack,
    EffectUnknown,
    Envelope,
    Executed,
    ExecutionApproved,
    ExecutionFailed,
    FieldResolved,
    FixedChecklistResolved,
    PreflightEvent,
    RunClosed,
    RunDeferred,
    RunStarted,
    ToolMatchDecided,
    digest,
    native_pass,
    seal,
    sealed_later,
    sealed_text,
    verify_run,
)
from preflight.protect import RunSealer, ValueProtector, open_record
from preflight.records import RECORD_SCHEMA_VERSION, ExecutionRecord, KeptEvents, RunRef, ValueGate
from preflight.results import as_json, structured_content

Sign = Callable[[Mapping[str, str | None]], Mapping[str, Any]]
"""Signs an `execute` decision: given its decision_id, run_id, action_key, tool_name and
arguments_digest, returns what `execution_approved` carries under `signature`."""

_GATELESS_KIND = {
    "input": "invalid_input",
    "checklist_ids": "checklist_id_missing",
    "backstop": "preflight_error",
}


class _Chain:
    def __init__(
        self,
        run_id: str,
        envelope: tuple[str | None, str | None, str | None],
        clock: Callable[[], str],
        new_id: Callable[[], str],
        sealer: RunSealer | None,
    ):
        self.clock = clock
        self.new_id = new_id
        self.sealer = sealer
        self.texts: list[bytes] = []
        self.kept: list[Any] = []
        self.prev = GENESIS_HASH
        self.seq = 0
        # Where the compiled pass seals (`native_pass`), asked once a run: every event of the chain is of the
        # current version (it writes it) after a text link (the genesis, then each event's hash).
        self.native = native_pass(EVENT_SCHEMA_VERSION, GENESIS_HASH)
        # Every event's fields begin as a copy of these -- the chain's own members, in order, then the envelope
        # (the action key, the user's and the agent's ids) -- their own values set in place.
        action_key, user_id, agent_id = envelope
        self.head: dict[str, Any] = {
            "schema_version": EVENT_SCHEMA_VERSION,
            "event_id": None,
            "event_type": None,
            "run_id": run_id,
            "seq": 0,
            "prev_hash": GENESIS_HASH,
            "occurred_at": None,
            "action_key": action_key,
            "user_id": user_id,
            "agent_id": agent_id,
        }

    def add(self, *events: tuple[str, dict[str, Any]]) -> None:
        """Seal each of `events` -- an event's type and payload (its own members, in order; not changed) -- as
        the chain's next link, in order. A payload is taken as a dict, not as keywords: a run's payloads are
        built once and copied once, into the event's fields.

        Several events a call (the run's start and its steps, seven of the scenario's nine): the chain's members
        are read into locals once for them all, its link and count written back once; and each event's fields
        are a copy of the run's `head` with its own values set in place, then its payload: the dict the display
        ``{chain's members, **envelope, **payload, "hash": ...}`` gave, the same members in the same order
        (~0.41 -> ~0.32 us a dict). Together ~1-1.3 us a run of `run_events` (bench/README.md, engine,
        fifteenth pass)."""
        sealer = self.sealer
        head = self.head
        new_id = self.new_id
        clock = self.clock
        native = self.native
        texts = self.texts
        kept_events = self.kept
        prev = self.prev
        seq = self.seq
        for event_type, payload in events:
            if sealer is not None:  # a protected run: values sealed before the event is hashed
                payload = sealer.payload(event_type, payload)
            fields = head.copy()
            fields["event_id"] = new_id()
            fields["event_type"] = event_type
            fields["seq"] = seq
            fields["prev_hash"] = prev
            fields["occurred_at"] = clock()  # each event its own reading
            fields.update(payload)
            fields["hash"] = HASH_PLACEHOLDER
            # `sealed_text`, its compiled pass called here (where `native_pass` says it applies): one call less
            # an event (bench/README.md, engine, twelfth pass).
            answer = native(fields, prev) if native is not None else None
            if answer is not None:
                fields["hash"], text = answer
            else:
                text = sealed_text(fields)
            texts.append(text)
            kind = fields["event_type"]
            kept: Any = fields
            if kind == "execution_approved" and fields.get("signature") is not None:  # a signature is validated
                kept = sealed_later(fields, text)
            else:
                # `sealed_later`'s verdict, kept by the event's type with the set of its payload's members: the
                # fields' members are the chain's own (every event's) and the payload's, and the verdict is on
                # their set (`_shape`: none unknown, none required missing), so it is the verdict of every
                # event of that type whose payload has these members, in any order. Compared as a set (the
                # payload's keys view against it), no key built an event: ~0.3-1.3 us a run less than a tuple
                # of the type and the members (bench/README.md, engine, fifteenth pass).
                known = _KEEP.get(kind)
                keep = known[1] if known is not None and payload.keys() == known[0] else None
                if not keep:
                    kept = sealed_later(fields, text)
                    if keep is None and (kind in _KEEP or len(_KEEP) < _KEEP_LIMIT):
                        _KEEP[kind] = (set(payload), kept is fields)
            kept_events.append(kept)
            prev = fields["hash"]
            seq += 1
        self.prev = prev
        self.seq = seq


#: `sealed_later`'s verdict -- the fields kept as they are, else its model built -- by an event's type: the set of
#: the payload's members last seen for it and the verdict on them (`_Chain.add`; a type seen with other members
#: is asked again; at most `_KEEP_LIMIT` types, as `preflight.events._SHAPES`).
_KEEP: dict[Any, tuple[set[str], bool]] = {}
_KEEP_LIMIT = 512


def run_events(
    decided: Decided,
    *,
    run_id: str,
    user_id: str | None,
    agent_id: str | None,
    clock: Callable[[], str],
    new_id: Callable[[], str],
    sign: Sign | None = None,
    sealer: RunSealer | None = None,
) -> tuple[KeptEvents, RunRef]:
    """The run's events in order, closed by `run_closed`, and the reference the record carries. The events
    are their published bytes and what was sealed of them, their models built when asked for (`KeptEvents`).

    With `sign`, an `execute` decision's `execution_approved` event carries the signature `sign`
    returns for the decision's fields (`preflight.signing`); a signer that fails fails the run.

    With `sealer` (a protected run, `preflight.protect`), every protected slot is sealed before its
    event is hashed and digests of values are keyed; the record returned to the caller keeps plaintext.
    """
    record, trace = decided.record, decided.trace
    chain = _Chain(run_id, (record.action_key, user_id, agent_id), clock, new_id, sealer)
    if sealer is not None and record.fields is not None:
        sealer.arguments_digest = sealer.digest(call_arguments({f.name: f.value for f in record.fields}))
    # The run's start, then the steps the decision path took, in its order.
    chain.add(("run_started", {"record_schema_version": RECORD_SCHEMA_VERSION, **trace.started}), *trace.steps)

    gate = record.gate
    gate_json = (
        None if gate is None else gate.as_json() if isinstance(gate, ValueGate) else gate.model_dump(mode="json")
    )
    decision_id: str | None = None
    arguments_digest: str | None = None
    decision = record.execution_decision
    if decision in ("ask_user", "hold"):
        assert trace.gate_name is not None and trace.gap_class is not None
        gate_kind = (gate_json or {}).get("kind") or _GATELESS_KIND.get(trace.gate_name, "value_gate")
        chain.add(
            (
                "gate_blocked",
                {
                    "gate_name": trace.gate_name,
                    "kind": gate_kind,
                    "decision": decision,
                    "gap_class": trace.gap_class,
                    "unknown_fields": [f["name"] for f in (gate_json or {}).get("unknown_fields", [])],
                    "unverified_items": [i["id"] for i in (gate_json or {}).get("unverified_checklist", [])],
                    "gate": gate_json,
                },
            )
        )
    elif decision == "deferred":
        assert record.deferred_input is not None
        chain.add(
            ("run_deferred", {"pending_fields": trace.deferred_pending, "deferred_input": dict(record.deferred_input)})
        )
    elif decision == "execute":
        assert trace.arguments is not None and record.fixed is not None and gate_json is not None
        decision_id = new_id()
        arguments_digest = digest(trace.arguments) if sealer is None else sealer.digest(trace.arguments)
        tool_name = record.fixed.c3_provider_action_name
        approved: dict[str, Any] = {
            "decision_id": decision_id,
            "tool_name": tool_name,
            "arguments_digest": arguments_digest,
            "gate": gate_json,
        }
        if sign is not None:
            fields = {
                "decision_id": decision_id,
                "run_id": run_id,
                "action_key": record.action_key,
                "tool_name": tool_name,
                "arguments_digest": arguments_digest,
            }
            approved["signature"] = dict(sign(fields))
        chain.add(("execution_approved", approved))
    else:  # pragma: no cover - decide() never yields executed/failed
        raise ValueError(f"a run cannot decide {decision!r}")

    chain.add(
        (
            "run_closed",
            {
                "decision": decision,
                "event_count": chain.seq + 1,
                "last_hash": chain.prev,
                "record": {
                    "schema_version": record.schema_version,
                    "advisory_notes": record.advisory_notes,
                    "unknown_count": record.unknown_count,
                    "unverified_checklist_count": record.unverified_checklist_count,
                    "fields_computed": record.fields is not None,
                    "reason": record.reason,
                    "timestamp": record.timestamp,
                },
            },
        )
    )
    ref = RunRef(
        run_id=run_id,
        last_hash=chain.prev,
        next_seq=chain.seq,
        decision_id=decision_id,
        arguments_digest=arguments_digest,
    )
    return KeptEvents(tuple(chain.texts), tuple(chain.kept)), ref


def outcome_event(
    state: ExecutionRecord,
    ref: RunRef,
    *,
    executed: ExecutionRecord,
    error: BaseException | None,
    result: Any,
    user_id: str | None,
    agent_id: str | None,
    clock: Callable[[], str],
    new_id: Callable[[], str],
    sealer: RunSealer | None = None,
    checked: str | None = None,
) -> PreflightEvent:
    """The `executed` / `execution_failed` event that extends a closed run's chain (sealed by `sealer`);
    `checked` is the result's structured content checked against the tool's output schema."""
    members: dict[str, Any] = {"reason": executed.reason, "timestamp": executed.timestamp}
    if error is None:
        members.update(event_type="executed", result_digest=_result_digest(result, sealer))
        content = structured_content(result)
        if content is not None:
            members["structured_content_digest"] = _result_digest(content, sealer)
        if checked is not None:
            members["output_check"] = checked
    elif (cause := effect_unknown_cause(error)) is not None:
        members.update(event_type="effect_unknown", cause=cause, error_type=type(error).__name__, error=str(error))
    else:
        members.update(event_type="execution_failed", error_type=type(error).__name__, error=str(error))
    return _after_close(
        state, ref, members, user_id=user_id, agent_id=agent_id, clock=clock, new_id=new_id, sealer=sealer
    )


def read_back_event(
    state: ExecutionRecord,
    ref: RunRef,
    *,
    took_effect: bool,
    basis: str,
    readback_tool: str | None,
    readback_result: Any,
    reason: str,
    timestamp: str,
    user_id: str | None,
    agent_id: str | None,
    clock: Callable[[], str],
    new_id: Callable[[], str],
    sealer: RunSealer | None = None,
) -> PreflightEvent:
    """The `effect_read_back` event that settles a run's `effect_unknown` (the next link of its chain)."""
    members: dict[str, Any] = {
        "event_type": "effect_read_back",
        "took_effect": took_effect,
        "basis": basis,
        "readback_tool": readback_tool,
        "readback_result_digest": None if readback_result is None else _result_digest(readback_result, sealer),
        "reason": reason,
        "timestamp": timestamp,
    }
    return _after_close(
        state, ref, members, user_id=user_id, agent_id=agent_id, clock=clock, new_id=new_id, sealer=sealer
    )


def _after_close(
    state: ExecutionRecord,
    ref: RunRef,
    members: dict[str, Any],
    *,
    user_id: str | None,
    agent_id: str | None,
    clock: Callable[[], str],
    new_id: Callable[[], str],
    sealer: RunSealer | None,
) -> PreflightEvent:
    """The event of `members` (its type and own members) that extends the closed run `ref` of `state`: the
    next link of its chain, naming the decision it follows (sealed by `sealer`)."""
    assert ref.decision_id is not None and ref.arguments_digest is not None and state.fixed is not None
    body: dict[str, Any] = {
        "event_id": new_id(),
        "run_id": ref.run_id,
        "seq": ref.next_seq,
        "prev_hash": ref.last_hash,
        "occurred_at": clock(),
        "action_key": state.action_key,
        "user_id": user_id,
        "agent_id": agent_id,
        "decision_id": ref.decision_id,
        "tool_name": state.fixed.c3_provider_action_name,
        "arguments_digest": ref.arguments_digest,
        **members,
    }
    if sealer is not None:
        body = sealer.payload(body["event_type"], body)
    return seal(body, built=True)


def _result_digest(result: Any, sealer: RunSealer | None = None) -> str:
    keyed = digest if sealer is None else sealer.digest
    try:
        return keyed(as_json(result))
    except (TypeError, ValueError):
        pass
    try:
        return keyed(repr(result))
    except Exception:  # an answer that cannot even be shown is still recorded, by its type
        return keyed(f"<unreadable {type(result).__name__}>")


def rebuild_record(
    events: Sequence[Envelope], *, verify: bool = True, opener: ValueProtector | None = None
) -> ExecutionRecord:
    """The record a run's events describe: the decision record, or the executed/failed one after it.

    With `verify` (the default) the chain is checked first and `ChainError` raised if it is broken.
    A protected run rebuilds with its values sealed; with `opener` (holding the keys) they are opened,
    and the slots whose key was erased stay sealed and are listed in `erased_values` (`open_record`).
    """
    ordered = sorted(events, key=lambda e: e.seq)
    if verify:
        verify_run(ordered)
    by_type: dict[str, list[Any]] = {}
    for event in ordered:
        by_type.setdefault(getattr(event, "event_type", ""), []).append(event)
    closed: list[RunClosed] = by_type.get("run_closed", [])
    if len(closed) != 1:
        raise ChainError(f"run has {len(closed)} run_closed events")
    close = closed[0]
    started: RunStarted = by_type["run_started"][0]
    scalars = close.record

    fixed: dict[str, Any] | None = None
    fixed_events: list[FixedChecklistResolved] = by_type.get("fixed_checklist_resolved", [])
    match_events: list[ToolMatchDecided] = by_type.get("tool_match_decided", [])
    if fixed_events:
        fixed = dict(fixed_events[0].fixed)
        if match_events:
            fixed["c3_match"] = {"approved": match_events[0].approved, "reason": match_events[0].reason}
    phase = match_events[0].phase if match_events else None

    field_events: list[FieldResolved] = by_type.get("field_resolved", [])
    fields = [e.field for e in field_events] if scalars.get("fields_computed") else None

    checklist_events: list[ChecklistItemVerified] = by_type.get("checklist_item_verified", [])
    user_checklist = (
        [e.item for e in sorted(checklist_events, key=lambda e: e.index)]
        if checklist_events
        else list(started.user_checklist)
    )

    gate: Any = None
    for kind in ("gate_blocked", "execution_approved"):
        if by_type.get(kind):
            gate = by_type[kind][0].gate
    deferred: list[RunDeferred] = by_type.get("run_deferred", [])

    data: dict[str, Any] = {
        "schema_version": scalars["schema_version"],
        "action_key": close.action_key,
        "phase": phase,
        "fixed": fixed,
        "fields": fields,
        "advisory_notes": scalars["advisory_notes"],
        "user_checklist": user_checklist,
        "unknown_count": scalars["unknown_count"],
        "unverified_checklist_count": scalars["unverified_checklist_count"],
        "gate": gate,
        "execution_decision": close.decision,
        "reason": scalars["reason"],
        "timestamp": scalars["timestamp"],
    }
    if deferred:
        data["deferred_input"] = deferred[0].deferred_input
    assessed: list[AdmissionAssessed] = by_type.get("admission_assessed", [])
    if assessed:
        verdict = assessed[0]
        data["admission"] = {
            "effect_class": verdict.effect_class,
            "status": verdict.status,
            "code": verdict.code,
            "correlation_id": verdict.correlation_id,
            "missing_arguments": verdict.missing_arguments,
            "effect_status": verdict.effect_status,
        }

    approved: list[ExecutionApproved] = by_type.get("execution_approved", [])
    tails: list[Executed | ExecutionFailed] = by_type.get("executed", []) + by_type.get("execution_failed", [])
    last_event = ordered[-1]
    ref = RunRef(
        run_id=close.run_id,
        last_hash=last_event.hash,
        next_seq=last_event.seq + 1,
        decision_id=approved[0].decision_id if approved else None,
        arguments_digest=approved[0].arguments_digest if approved else None,
    )
    if tails:
        tail = tails[0]
        data["execution_decision"] = "executed" if tail.event_type == "executed" else "failed"
        data["reason"] = tail.reason
        data["timestamp"] = tail.timestamp
    unknown: list[EffectUnknown] = by_type.get("effect_unknown", [])
    read_back: list[EffectReadBack] = by_type.get("effect_read_back", [])
    if unknown and not tails:
        # Unknown until read back; then executed if it took effect (its fields' origins kept), else failed.
        settled = read_back[0] if read_back else None
        data["execution_decision"] = (
            "effect_unknown" if settled is None else "executed" if settled.took_effect else "failed"
        )
        data["reason"] = (settled or unknown[0]).reason
        data["timestamp"] = (settled or unknown[0]).timestamp
    record = ExecutionRecord.model_validate(data).with_run_ref(ref, tuple(ordered))
    return record if opener is None else open_record(record, opener)
