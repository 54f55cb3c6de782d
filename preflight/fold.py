"""The fold: per-`action_key` state from the event log, and the executed-only baseline (SPEC §6).

`evolve(state, message, position)` is a pure function. A message is what the transport carries: a
whole run (its events from seq 0 to `run_closed`) or a run's tail (`executed` / `execution_failed`).
Only an `executed` tail for a run whose closed decision was `execute`, with an intact chain, moves
the baseline. Each run and outcome gets the consumers' shared verdict (`preflight.verdict`), which the
projector applies too: what it refuses is an anomaly under the same code (`Folded.code`). Everything
else that is wrong is an anomaly too: the state does not change and the caller routes the message to
the dead-letter topic with the reason.

An outcome must also match the run's approved decision: the same `decision_id`, tool and arguments
digest. A fold given a `DecisionVerifier` (the trusted public keys of the engines that sign decisions)
further requires the approved decision's signature to verify and the outcome to have happened before
the decision expired; an outcome without a valid signed decision is an anomaly and never a baseline.

Idempotence does not depend on the consumer's offset commits: a message at or below the key's
applied offset is a redelivery, and a run seen before with the same hashes (a producer retry at a
new offset) is a duplicate. Either changes nothing.

The state is a plain JSON-compatible dict so that a table can store it as is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from preflight.chain import TAIL_EVENT_TYPES, hash_matches, message_problem
from preflight.emit import rebuild_record
from preflight.errors import ChainError, EventDecodeError
from preflight.events import EVENT_TYPES, SUPPORTED_EVENT_VERSIONS, decode_event
from preflight.records import UNKEYED_RECORD_KEY, ExecutionRecord, RunRef
from preflight.signing import DecisionVerifier, SignedDecision, parse_time
from preflight.verdict import Problem, event_problem, run_problem

RECENT_RUNS_PER_KEY = 64
#: Event ids a key remembers, so that a new run reusing one (with other content) is an anomaly.
EVENT_IDS_PER_KEY = 128
AWAITING_RUNS_PER_KEY = 32
DECISIONS = ("execute", "ask_user", "hold", "deferred")

# The envelope's members and their JSON types (`bool` is not an `int` here).
_UUID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")
_ENVELOPE_STRINGS = ("event_id", "event_type", "run_id", "prev_hash", "hash", "occurred_at")


@dataclass(frozen=True)
class Position:
    """Where a message was read: the source partition and offset."""

    topic: str
    partition: int
    offset: int


Outcome = Literal["applied", "duplicate", "anomaly"]


@dataclass(frozen=True)
class Folded:
    state: dict[str, Any]
    outcome: Outcome
    reason: str | None = None
    baseline_changed: bool = False
    #: An anomaly's dead-letter code when the verdict named it (`preflight.verdict.CODES`), the projector's too.
    code: str | None = None


def initial_state(action_key: str) -> dict[str, Any]:
    return {
        "action_key": action_key,
        "partition": None,
        "applied_offset": -1,
        "counts": {"runs": 0, **{d: 0 for d in DECISIONS}, "executed": 0, "failed": 0, "duplicates": 0},
        "awaiting": {},
        "recent": {},
        "event_ids": [],
        "baseline": None,
    }


def _anomaly(state: dict[str, Any], reason: str, code: str | None = None) -> Folded:
    """An anomaly, with the projector's dead-letter code for the same defect where the fold knows it (else
    `streams.batch.dead_letter_code` reads one from the reason)."""
    return Folded(state, "anomaly", reason, code=code)


def _refused(state: dict[str, Any], problem: Problem) -> Folded:
    """An anomaly the consumers' shared verdict names: its code leads the reason, as in the projector's."""
    return Folded(state, "anomaly", str(problem), code=problem.code)


def check_shape(event: Any) -> str | None:
    """A cheap structural check of one decoded event (type, version, envelope); None if it passes.

    Exact type checks (`type(v) is str`): decoded JSON holds no subclasses, and a `bool` is not a seq.
    """
    if type(event) is not dict and not isinstance(event, Mapping):
        return f"event is a JSON {type(event).__name__}, not an object"
    get = event.get
    event_type = get("event_type")
    if type(event_type) is not str or event_type not in EVENT_TYPES:
        return f"unknown event_type: {event_type!r:.80}"
    version = get("schema_version")
    if type(version) is not int or version not in SUPPORTED_EVENT_VERSIONS:
        return f"unsupported schema_version {version!r:.80} for {event_type}"
    for key in _ENVELOPE_STRINGS:
        if type(get(key)) is not str:
            return f"{event_type}: missing or mistyped {key}"
    if type(get("seq")) is not int:
        return f"{event_type}: missing or mistyped seq"
    action_key = get("action_key")
    if action_key is not None and type(action_key) is not str:
        return f"{event_type}: mistyped action_key"
    return None


def _shape_code(problem: str) -> str:
    """The projector's code for a `check_shape` problem."""
    if problem.startswith("unknown event_type"):
        return "unknown_event_type"
    if problem.startswith("unsupported schema_version"):
        return "unsupported_schema_version"
    return "malformed_event"


def _working_copy(state: Mapping[str, Any]) -> dict[str, Any]:
    """A copy `evolve` may change: the containers it mutates are copied, their entries are only ever
    replaced, never changed in place (a full deep copy of the runs awaiting execution dominated)."""
    copied = dict(state)
    for name in ("counts", "awaiting", "recent"):
        copied[name] = dict(state[name])
    if state.get("baseline") is not None:
        copied["baseline"] = dict(state["baseline"])
    return copied


def _remember(bucket: dict[str, Any], run_id: str, entry: dict[str, Any], limit: int) -> None:
    bucket.pop(run_id, None)
    bucket[run_id] = entry
    while len(bucket) > limit:
        del bucket[next(iter(bucket))]


def evolve(
    state: Mapping[str, Any] | None,
    message: Sequence[Any],
    position: Position,
    key: str,
    *,
    verifier: DecisionVerifier | None = None,
) -> Folded:
    """Apply one transport message for `key` read at `position`. Pure: `state` is never mutated.

    With `verifier`, an outcome counts only for a decision signed by one of its trusted keys."""
    if (
        state is not None
        and state.get("partition") == position.partition
        and position.offset <= state["applied_offset"]
    ):
        return Folded(dict(state), "duplicate", "offset already applied")
    base = _working_copy(state) if state is not None else initial_state(key)
    if not isinstance(message, Sequence) or isinstance(message, (str, bytes)) or not message:
        return _anomaly(base, "message is not a non-empty list of events", "not_an_event_array")
    # Event by event, each wholly (shape, model, id, hash) before the next, in the projector's order
    # (`projections.decode`), so that both name the same first defect.
    texts = getattr(message, "texts", None) or [None] * len(message)
    for index, (event, text) in enumerate(zip(message, texts, strict=True)):
        problem = check_shape(event)
        if problem is not None:
            return _anomaly(base, f"event {index}: {problem}", _shape_code(problem))
        try:
            # The whole model, strictly, as the projector reads it: an intact chain does not make a run well
            # formed. (`hashed`: the hash is checked next; without it nothing of this event is used.)
            decode_event(event, hashed=True)
        except EventDecodeError as exc:
            return _anomaly(base, f"event {index}: {exc}", "malformed_event")
        if not _UUID.fullmatch(event["event_id"]):
            return _anomaly(
                base, f"event {index}: event_id {event['event_id']!r:.80} is not a UUID", "event_id_not_uuid"
            )
        if not hash_matches(event, text):
            try:  # a value with no canonical form (a lone surrogate) is malformed, as the projector finds
                decode_event(event)
            except EventDecodeError as exc:
                return _anomaly(base, f"event {index}: {exc}", "malformed_event")
            return _anomaly(
                base, f"broken hash chain: seq {event['seq']} hash does not match its content", "broken_chain"
            )
    run_ids = {e["run_id"] for e in message}
    if len(run_ids) != 1:
        return _anomaly(base, "message mixes events of several runs", "mixed_runs")
    expected_key = None if key == UNKEYED_RECORD_KEY else key
    if any(e.get("action_key") != expected_key for e in message):
        return _anomaly(base, f"event action_key does not match the message key {key!r}", "key_mismatch")
    run_id = next(iter(run_ids))

    if message[0]["event_type"] in TAIL_EVENT_TYPES:
        folded = _apply_tail(base, run_id, message, verifier)
    else:
        folded = _apply_run(base, run_id, message)
    if folded.outcome != "anomaly":
        folded.state["partition"] = position.partition
        folded.state["applied_offset"] = position.offset
        if folded.baseline_changed and folded.state["baseline"] is not None:
            folded.state["baseline"]["offset"] = position.offset
            folded.state["baseline"]["partition"] = position.partition
    return folded


def _apply_run(state: dict[str, Any], run_id: str, events: Sequence[Mapping[str, Any]]) -> Folded:
    problem = message_problem(events)  # the run-chain rule (`preflight.chain`)
    if problem is not None:
        return _anomaly(
            state,
            f"{'broken hash chain' if problem[0] == 'broken_chain' else 'incomplete run'}: {problem[1]}",
            problem[0],
        )
    refused = run_problem(events)  # the contract's verdict, the projector's too (`preflight.verdict`)
    if refused is not None:
        return _refused(state, refused)
    closing = events[-1]
    prev = closing["hash"]

    known = state["recent"].get(run_id) or state["awaiting"].get(run_id)
    if known is not None:
        if known.get("close_hash") == closing["hash"]:
            state["counts"]["duplicates"] += 1
            return Folded(state, "duplicate", "run already applied (same hashes)")
        return _anomaly(state, f"run {run_id} seen before with different content", "run_id_conflict")
    reused = _reused_event_id(state, events)
    if reused is not None:
        return _anomaly(state, reused, "event_id_reused")

    decision = closing.get("decision")
    if decision not in DECISIONS:
        return _anomaly(state, f"run_closed decision {decision!r} is not a decision", "incomplete_run")
    state["counts"]["runs"] += 1
    state["counts"][decision] += 1
    entry = {"decision": decision, "close_hash": closing["hash"], "last_seq": closing["seq"], "last_hash": prev}
    _remember_event_ids(state, events)
    if decision == "execute":
        _remember(state["awaiting"], run_id, {**entry, "events": [dict(e) for e in events]}, AWAITING_RUNS_PER_KEY)
    else:
        _remember(state["recent"], run_id, entry, RECENT_RUNS_PER_KEY)
    return Folded(state, "applied")


def _reused_event_id(state: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> str | None:
    """Why `events` (a new run or outcome) cannot be applied: one reuses an event_id this key has seen."""
    seen = set(state.get("event_ids") or ())
    for event in events:
        if event["event_id"] in seen:
            return f"event_id {event['event_id']} reused by run {event['run_id']} for different content"
    return None


def _remember_event_ids(state: dict[str, Any], events: Sequence[Mapping[str, Any]]) -> None:
    """Keep the key's last EVENT_IDS_PER_KEY event ids (a new list: states are copied shallowly)."""
    state["event_ids"] = [*(state.get("event_ids") or ()), *(e["event_id"] for e in events)][-EVENT_IDS_PER_KEY:]


def _decision_problem(
    run_events: Sequence[Mapping[str, Any]], tail: Mapping[str, Any], verifier: DecisionVerifier | None
) -> str | None:
    """Why `tail` is not an outcome of its run's approved decision (None if it is)."""
    outcome = tail["event_type"]
    approved = [e for e in run_events if e.get("event_type") == "execution_approved"]
    if len(approved) != 1:
        return f"{outcome} for a run with {len(approved)} execution_approved events"
    decision = approved[0]
    for name in ("decision_id", "tool_name", "arguments_digest"):
        if tail.get(name) != decision.get(name):
            return (
                f"{outcome} {name} {tail.get(name)!r:.80} does not match the approved decision's "
                f"{decision.get(name)!r:.80}"
            )
    if verifier is None:
        return None
    signed = SignedDecision.from_approved(decision)
    if signed is None:
        what = "no signature" if decision.get("signature") is None else "an unreadable signature"
        return f"{outcome} for decision {decision.get('decision_id')!r:.80}, which carries {what}"
    problem = verifier.check_signature(signed)
    if problem is not None:
        return f"{outcome} for decision {signed.decision_id!r:.80} with an invalid signature: {problem}"
    happened = parse_time(tail["occurred_at"])
    if happened is None:
        return f"{outcome} has no readable occurred_at to compare with the decision's expiry"
    problem = verifier.check_times(signed, happened)
    if problem is not None:
        return f"{outcome} at {tail['occurred_at']:.40} for decision {signed.decision_id!r:.80}: {problem}"
    return None


def _apply_tail(
    state: dict[str, Any], run_id: str, events: Sequence[Mapping[str, Any]], verifier: DecisionVerifier | None = None
) -> Folded:
    if len(events) != 1:
        return _anomaly(state, "a tail message carries exactly one executed/execution_failed event", "incomplete_run")
    tail = events[0]
    refused = event_problem(tail, "event 0")  # the contract's verdict, the projector's too
    if refused is not None:
        return _refused(state, refused)
    waiting = state["awaiting"].get(run_id)
    if waiting is None:
        seen = state["recent"].get(run_id)
        if seen is not None and seen.get("tail_hash") == tail["hash"]:
            state["counts"]["duplicates"] += 1
            return Folded(state, "duplicate", "tail already applied (same hash)")
        if seen is not None and seen["decision"] != "execute":
            return _anomaly(
                state,
                f"{tail['event_type']} for a run whose decision was {seen['decision']}",
                "outcome_for_non_execute",
            )
        if seen is not None:
            return _anomaly(state, f"second outcome for run {run_id} (replayed decision)", "second_outcome")
        return _anomaly(
            state, f"{tail['event_type']} for a run without a recorded execute decision", "outcome_without_run"
        )
    linked = message_problem(events, after=(waiting["last_seq"], waiting["last_hash"]))
    if linked is not None:
        return _anomaly(state, f"broken hash chain: {linked[1]}", "broken_chain")
    problem = _decision_problem(waiting["events"], tail, verifier) or _reused_event_id(state, events)
    if problem is not None:
        return _anomaly(state, problem)

    executed = tail["event_type"] == "executed"
    baseline_changed = False
    if executed:
        try:
            # The run's chain, each hash and the tail's link were verified as they arrived.
            events_in = [decode_event(e, hashed=True) for e in [*waiting["events"], tail]]
            record = rebuild_record(events_in, verify=False)
        except (EventDecodeError, ChainError, ValueError) as exc:  # ValueError: pydantic's ValidationError
            return _anomaly(state, f"executed run cannot be rebuilt: {exc}", "unrebuildable_run")
        if record.execution_decision != "executed":
            return _anomaly(state, "executed run did not rebuild to an executed record", "unrebuildable_run")
        if record.fields is None:  # the verdict refuses such a run before; never an empty baseline
            return _anomaly(state, "executed run cannot be rebuilt: its record has no fields", "unrebuildable_run")
        state["baseline"] = {
            "run_id": run_id,
            "decision_id": tail.get("decision_id"),
            "record": record.model_dump(mode="json"),
            "last_hash": tail["hash"],
            "next_seq": tail["seq"] + 1,
        }
        baseline_changed = True
    del state["awaiting"][run_id]
    _remember_event_ids(state, events)
    state["counts"]["executed" if executed else "failed"] += 1
    entry = {
        "decision": "execute",
        "close_hash": waiting["close_hash"],
        "last_seq": tail["seq"],
        "last_hash": tail["hash"],
        "tail_hash": tail["hash"],
        "outcome": "executed" if executed else "failed",
    }
    _remember(state["recent"], run_id, entry, RECENT_RUNS_PER_KEY)
    return Folded(state, "applied", baseline_changed=baseline_changed)


def baseline_record(state: Mapping[str, Any] | None) -> ExecutionRecord | None:
    """The baseline of a folded state as an `ExecutionRecord` carrying its run reference, or None."""
    if not state or not state.get("baseline"):
        return None
    base = state["baseline"]
    ref = RunRef(run_id=base["run_id"], last_hash=base["last_hash"], next_seq=base["next_seq"])
    return ExecutionRecord.model_validate(base["record"]).with_run_ref(ref)
