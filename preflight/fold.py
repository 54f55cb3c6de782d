"""The fold: per-`action_key` state from the event log, and the executed-only baseline (SPEC §6).

`evolve(state, message, position)` is a pure function. A message is what the transport carries: a
whole run (its events from seq 0 to `run_closed`) or a run's tail (`executed` / `execution_failed` /
`effect_unknown`, and after an `effect_unknown` its `effect_read_back`). Only an `executed` tail for a run
whose closed decision was `execute`, with an intact chain, moves the baseline -- or the read-back of an
`effect_unknown` that says the call took effect (the run then counts as executed, its origins kept). An
`effect_unknown` run waits, counted in ``effect_unknown`` until it is read back; it is never `failed`.
An unkeyed run (a read admitted without a preflight) is never a baseline. Each run and outcome gets the
consumers' shared verdict (`preflight.verdict`), which the projector applies too: what it refuses is an
anomaly under the same code (`Folded.code`). Everything else that is wrong is an anomaly too: the state
does not change and the caller routes the message to the dead-letter topic with the reason.

An outcome must also match the run's approved decision: the same `decision_id`, tool and arguments
digest. A fold given a `DecisionVerifier` (the trusted public keys of the engines that sign decisions)
further requires the approved decision's signature to verify and the outcome to have happened before
the decision expired; an outcome without a valid signed decision is an anomaly and never a baseline.

Idempotence does not depend on the consumer's offset commits: a message at or below the key's
applied offset is a redelivery, and a run seen before with the same hashes (a producer retry at a
new offset) is a duplicate. Either changes nothing.

A key's state is a plain JSON-compatible dict, stored as parts of its own (`stored_parts`): a small
core (offsets, counts), the baseline, and one part per remembered run (a slot of RECENT_RUNS_PER_KEY,
holding the run's event ids, and its events while it awaits an outcome). A message stores only the
parts it changed (`Folded.parts`), never the whole history; `restore_part` puts them back together.
The index of remembered run and event ids (``seen``) is derived from the runs and never stored.

The baseline keeps the executed run's events (as verified on arrival); its record is rebuilt from them when
it is read (`baseline_json`, remembered), never on the fold's path. A message the consumers' shared intake
check vouched for (`preflight.intake`) skips the per-event checks it has passed.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from preflight.chain import READ_BACK_EVENT_TYPE, TAIL_EVENT_TYPES, hash_matches, message_problem
from preflight.emit import rebuild_record
from preflight.errors import ChainError, EventDecodeError, PreflightError
from preflight.events import EVENT_TYPES, SUPPORTED_EVENT_VERSIONS, decode_event
from preflight.records import UNKEYED_RECORD_KEY, ExecutionRecord, RunRef
from preflight.shapes import conforms
from preflight.signing import DecisionVerifier, SignedDecision, parse_time
from preflight.verdict import Problem, event_problem, run_problem

#: Runs a key remembers (with their event ids): the runs still awaiting an outcome, and enough of the
#: past to recognise a retried run, a second outcome or a reused event id. A run takes the slot
#: ``runs_seen % RECENT_RUNS_PER_KEY``, evicting the run that held it -- never a run still awaiting its
#: outcome (or its read-back): then the next slot whose run does not await one (`_slot_for`).
RECENT_RUNS_PER_KEY = 64
#: The most runs one key holds awaiting their outcomes (reads in flight share the unkeyed key): beyond the
#: recent slots, a run takes a slot past them. A run that would be one more is an anomaly
#: (``too_many_awaiting``), never an eviction that would lose an awaited outcome.
AWAITING_PER_KEY = 1024
DECISIONS = ("execute", "ask_user", "hold", "deferred")
#: A state's parts, each stored on its own (`stored_parts`, `restore_part`): the core (offsets, counts),
#: the baseline, and one part per run slot (``r<slot>``).
CORE = "k"
BASELINE = "b"
RUN_PART = "r"
CORE_FIELDS = ("action_key", "partition", "applied_offset", "counts", "runs_seen")

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
    """What folding one message did: the new state, the outcome, and the parts of the state it changed,
    as ``(part, value)`` in the order to store them (`stored_parts`)."""

    state: dict[str, Any]
    outcome: Outcome
    reason: str | None = None
    baseline_changed: bool = False
    #: The run slot this message wrote, if any.
    slot: int | None = None
    parts: tuple[tuple[str, Any], ...] = ()
    #: An anomaly's dead-letter code where the fold names it: the projector's for the same defect.
    code: str | None = None


def initial_state(action_key: str) -> dict[str, Any]:
    return {
        "action_key": action_key,
        "partition": None,
        "applied_offset": -1,
        "counts": {
            "runs": 0,
            **{d: 0 for d in DECISIONS},
            "executed": 0,
            "failed": 0,
            "effect_unknown": 0,
            "duplicates": 0,
        },
        "runs_seen": 0,
        "baseline": None,
        "runs": {},
        "seen": {},
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
    """A copy `evolve` may change: the containers it changes are copied, their entries are only ever
    replaced, never changed in place (a state handed to `evolve` is never changed)."""
    copied = dict(state)
    for name in ("counts", "runs", "seen"):
        copied[name] = dict(state[name])
    return copied


def _known(state: Mapping[str, Any], run_id: str) -> dict[str, Any] | None:
    """The entry of run `run_id` if the key remembers it."""
    slot = state["seen"].get(run_id)
    return None if slot is None else state["runs"].get(slot)


def _store(state: dict[str, Any], slot: int, entry: dict[str, Any]) -> None:
    """Put `entry` in `slot`, forgetting the run (and its event ids) that held it before."""
    seen = state["seen"]
    old = state["runs"].get(slot)
    if old is not None and old is not entry:
        for name in (old["run_id"], *old["event_ids"]):
            if seen.get(name) == slot:
                del seen[name]
    state["runs"][slot] = entry
    seen[entry["run_id"]] = slot
    for event_id in entry["event_ids"]:
        seen[event_id] = slot


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
    base = dict(state) if state is not None else initial_state(key)  # copied further where it changes
    if not isinstance(message, Sequence) or isinstance(message, (str, bytes)) or not message:
        return _anomaly(base, "message is not a non-empty list of events", "not_an_event_array")
    # Event by event, each wholly (shape, model, id, hash) before the next, in the projector's order
    # (`projections.decode`), so that both name the same first defect.
    # A message the consumers' shared intake check vouched for (`preflight.intake.vouched`: each event valid
    # under its model, its event_id a UUID, its hash matching) has passed all of this already.
    if not getattr(message, "vouched", False):
        texts = getattr(message, "texts", None) or [None] * len(message)
        for index, (event, text) in enumerate(zip(message, texts, strict=True)):
            problem = check_shape(event)
            if problem is not None:
                return _anomaly(base, f"event {index}: {problem}", _shape_code(problem))
            # The whole model, strictly, as the projector reads it: an intact chain does not make a run well
            # formed. Its strict shape (`preflight.shapes`: the model, a UUID event_id) first, without pydantic;
            # the model itself judges (and names) whatever the shape does not accept. (`hashed`: the hash is
            # checked next; without it nothing of this event is used.)
            if not conforms(event, text):
                try:
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
        folded = _apply_tail(base, run_id, message, position, verifier)
    else:
        folded = _apply_run(base, run_id, message)
    if folded.outcome == "anomaly":
        return folded
    folded.state["partition"] = position.partition  # a changed state is a working copy of its own
    folded.state["applied_offset"] = position.offset
    return replace(folded, parts=stored_parts(folded))


def stored_parts(folded: Folded) -> tuple[tuple[str, Any], ...]:
    """The records that store what one message changed in its key's state, never the whole history: the
    baseline if it moved (``b``), then the run slot it wrote (``r<slot>``) carrying the key's core as of this
    message (``k``: offsets, counts), or the core alone. Stored in this order, message after message, any
    prefix of the records is a state that has folded exactly the messages whose last record it holds: the
    core is never ahead of the parts before it, and a baseline ahead of its core is written again, equal."""
    state = folded.state
    core = {name: state[name] for name in CORE_FIELDS}
    parts: list[tuple[str, Any]] = []
    if folded.baseline_changed:
        parts.append((BASELINE, state["baseline"]))
    if folded.slot is None:
        parts.append((CORE, core))
    else:
        parts.append((f"{RUN_PART}{folded.slot}", {**state["runs"][folded.slot], CORE: core}))
    return tuple(parts)


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
    decision = closing.get("decision")

    known = _known(state, run_id)
    if known is not None:
        if known.get("close_hash") != closing["hash"]:
            return _anomaly(state, f"run {run_id} seen before with different content", "run_id_conflict")
        state = _working_copy(state)
        state["counts"]["duplicates"] += 1
        return Folded(state, "duplicate", "run already applied (same hashes)")
    reused = _reused_event_id(state, events)
    if reused is not None:
        return _anomaly(state, reused, "event_id_reused")
    if decision not in DECISIONS:
        return _anomaly(state, f"run_closed decision {decision!r} is not a decision", "incomplete_run")
    entry: dict[str, Any] = {
        "run_id": run_id,
        "decision": decision,
        "close_hash": closing["hash"],
        "last_seq": closing["seq"],
        "last_hash": closing["hash"],
        "event_ids": [e["event_id"] for e in events],
    }
    if decision == "execute":  # what the outcome is checked against, and its record rebuilt from
        entry["events"] = [dict(e) for e in events]
    slot = _slot_for(state)
    if slot is None:
        reason = f"run {run_id}: its key already has {AWAITING_PER_KEY} runs awaiting their outcomes"
        return _anomaly(state, reason, "too_many_awaiting")
    state = _working_copy(state)
    _store(state, slot, entry)
    state["runs_seen"] += 1
    state["counts"]["runs"] += 1
    state["counts"][decision] += 1
    return Folded(state, "applied", slot=slot)


def _slot_for(state: Mapping[str, Any]) -> int | None:
    """The slot a new run takes: ``runs_seen % RECENT_RUNS_PER_KEY`` unless its run awaits an outcome (it
    keeps its events until then), else the next in turn that does not, else the first past the recent slots
    that does not (None: `AWAITING_PER_KEY` runs await theirs)."""
    runs = state["runs"]
    start: int = state["runs_seen"] % RECENT_RUNS_PER_KEY
    for step in range(RECENT_RUNS_PER_KEY):
        slot = (start + step) % RECENT_RUNS_PER_KEY
        if "events" not in runs.get(slot, ()):
            return slot
    for slot in range(RECENT_RUNS_PER_KEY, AWAITING_PER_KEY):
        if "events" not in runs.get(slot, ()):
            return slot
    return None


def _reused_event_id(state: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> str | None:
    """Why `events` (a new run or outcome) cannot be applied: one reuses an event_id this key remembers."""
    seen = state["seen"]
    for event in events:
        if event["event_id"] in seen:
            return f"event_id {event['event_id']} reused by run {event['run_id']} for different content"
    return None


def _decision_problem(
    run_events: Sequence[Mapping[str, Any]],
    tail: Mapping[str, Any],
    verifier: DecisionVerifier | None,
    occurred_at: str | None = None,
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
    happened = parse_time(occurred_at or tail["occurred_at"])
    if happened is None:
        return f"{outcome} has no readable occurred_at to compare with the decision's expiry"
    problem = verifier.check_times(signed, happened)
    if problem is not None:
        return f"{outcome} at {tail['occurred_at']:.40} for decision {signed.decision_id!r:.80}: {problem}"
    return None


def _apply_tail(
    state: dict[str, Any],
    run_id: str,
    events: Sequence[Mapping[str, Any]],
    position: Position,
    verifier: DecisionVerifier | None = None,
) -> Folded:
    if len(events) != 1:
        return _anomaly(state, "a tail message carries exactly one executed/execution_failed event", "incomplete_run")
    tail = events[0]
    refused = event_problem(tail, "event 0")  # the contract's verdict, the projector's too
    if refused is not None:
        return _refused(state, refused)
    waiting = _known(state, run_id)
    if waiting is None or "outcome" in waiting or waiting["decision"] != "execute":
        if waiting is not None and waiting.get("tail_hash") == tail["hash"]:
            state = _working_copy(state)
            state["counts"]["duplicates"] += 1
            return Folded(state, "duplicate", "tail already applied (same hash)")
        if waiting is not None and waiting["decision"] != "execute":
            return _anomaly(
                state,
                f"{tail['event_type']} for a run whose decision was {waiting['decision']}",
                "outcome_for_non_execute",
            )
        if waiting is not None:
            return _anomaly(state, f"second outcome for run {run_id} (replayed decision)", "second_outcome")
        return _anomaly(
            state, f"{tail['event_type']} for a run without a recorded execute decision", "outcome_without_run"
        )
    kind = tail["event_type"]
    unknown = waiting.get("effect_unknown") is True
    if unknown and waiting["last_hash"] == tail["hash"]:
        state = _working_copy(state)
        state["counts"]["duplicates"] += 1
        return Folded(state, "duplicate", "tail already applied (same hash)")
    if unknown != (kind == READ_BACK_EVENT_TYPE):
        if unknown:
            return _anomaly(
                state,
                f"{kind} for run {run_id}, whose effect is unknown: only its read-back may follow",
                "second_outcome",
            )
        return _anomaly(state, f"{kind} for run {run_id}, whose effect is not unknown", "read_back_without_unknown")
    linked = message_problem(events, after=(waiting["last_seq"], waiting["last_hash"]))
    if linked is not None:
        return _anomaly(state, f"broken hash chain: {linked[1]}", "broken_chain")
    # A read-back is judged against the decision as of the call (its `effect_unknown`), not as of its reading.
    when = waiting["events"][-1].get("occurred_at") if unknown else None
    problem = _decision_problem(waiting["events"], tail, verifier, when) or _reused_event_id(state, events)
    if problem is not None:
        return _anomaly(state, problem)
    slot = state["seen"][run_id]
    if kind == "effect_unknown":
        # Never a baseline, never failed: the run waits (its events kept) for its read-back, and the key's
        # next run holds.
        state = _working_copy(state)
        state["counts"]["effect_unknown"] = state["counts"].get("effect_unknown", 0) + 1
        waiting_entry = dict(waiting)
        waiting_entry.update(
            events=[*waiting["events"], dict(tail)],
            last_seq=tail["seq"],
            last_hash=tail["hash"],
            effect_unknown=True,
            event_ids=[*waiting["event_ids"], tail["event_id"]],
        )
        _store(state, slot, waiting_entry)
        return Folded(state, "applied", slot=slot)

    executed = kind == "executed" or (kind == READ_BACK_EVENT_TYPE and tail.get("took_effect") is True)
    baseline = None
    # An unkeyed run (a read admitted without a preflight, `preflight.reads`) is never a baseline: no run
    # loads one from the unkeyed key.
    if executed and state["action_key"] != UNKEYED_RECORD_KEY:
        # The run's events, as verified on arrival (chain, hashes, models, the verdict, the tail's link): its
        # record is rebuilt from them when it is read (`baseline_json`), not here, on every executed run.
        baseline = {
            "run_id": run_id,
            "decision_id": tail.get("decision_id"),
            "events": [*waiting["events"], dict(tail)],
            "last_hash": tail["hash"],
            "next_seq": tail["seq"] + 1,
            "offset": position.offset,
            "partition": position.partition,
        }
    state = _working_copy(state)
    if baseline is not None:
        state["baseline"] = baseline
    outcome = "executed" if executed else "failed"
    state["counts"][outcome] += 1
    if unknown:
        state["counts"]["effect_unknown"] = state["counts"].get("effect_unknown", 0) - 1  # settled now
    entry = {k: v for k, v in waiting.items() if k not in ("events", "effect_unknown")}
    entry.update(
        last_seq=tail["seq"],
        last_hash=tail["hash"],
        tail_hash=tail["hash"],
        outcome=outcome,
        event_ids=[*waiting["event_ids"], tail["event_id"]],
    )
    _store(state, slot, entry)
    return Folded(state, "applied", baseline_changed=baseline is not None, slot=slot)


def restore_part(state: dict[str, Any] | None, action_key: str, part: str, value: Any) -> dict[str, Any]:
    """Put one stored part (`stored_parts`) back into a key's state (made if None), in place: what a
    table recovering from its changelog does for every record, in log order. Of the cores it is given
    (alone, or carried by a run slot), the state keeps the one that has folded the furthest."""
    if state is None:
        state = initial_state(action_key)
    if part == CORE:
        if isinstance(value, Mapping):
            _restore_core(state, value)
            if "recent" in value or "awaiting" in value:
                _restore_whole(state, value)
    elif part == BASELINE:
        state["baseline"] = value if isinstance(value, Mapping) else None
    elif part.startswith(RUN_PART) and part[len(RUN_PART) :].isdigit():
        slot = int(part[len(RUN_PART) :])
        if isinstance(value, Mapping):
            entry = dict(value)
            core = entry.pop(CORE, None)
            _store(state, slot, entry)
            if isinstance(core, Mapping):
                _restore_core(state, core)
        else:
            old = state["runs"].pop(slot, None)
            if old is not None:
                for name in (old["run_id"], *old["event_ids"]):
                    if state["seen"].get(name) == slot:
                        del state["seen"][name]
    return state


def _restore_core(state: dict[str, Any], core: Mapping[str, Any]) -> None:
    """Take `core` (offsets, counts) unless the state's own has folded further in the same partition (a
    slot written before the latest core, read after it)."""
    offset = core.get("applied_offset")
    if state["partition"] == core.get("partition") and isinstance(offset, int) and offset < state["applied_offset"]:
        return
    state.update({name: core[name] for name in CORE_FIELDS if name in core})


def _restore_whole(state: dict[str, Any], value: Mapping[str, Any]) -> None:
    """A state stored whole (before states were stored as parts): its baseline, and its remembered
    runs in slots (the runs awaiting an outcome last, so that they are the last to be evicted)."""
    state["baseline"] = value.get("baseline")
    runs = [*(value.get("recent") or {}).items(), *(value.get("awaiting") or {}).items()][-RECENT_RUNS_PER_KEY:]
    for slot, (run_id, entry) in enumerate(runs):
        _store(state, slot, {**entry, "run_id": run_id, "event_ids": []})
    state["runs_seen"] = len(runs)


class UnrebuildableBaselineError(PreflightError):
    """A baseline's events do not rebuild to an executed record with fields. The fold verified them on arrival
    (models, hashes, chain, the consumers' verdict, which refuses an execute run without fields), so this
    should not happen: the reader gets no baseline ("unavailable"), never a wrong one. Report it with the run."""


#: Records rebuilt from baselines' events, by (run_id, last_hash): a baseline is rebuilt once, when first read.
_REBUILT: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
_REBUILT_KEPT = 4096


def baseline_json(base: Mapping[str, Any]) -> dict[str, Any]:
    """The executed record (its JSON) a folded state's baseline holds: rebuilt from the run's events on first
    read and remembered (a state stored before baselines kept their events holds the record itself).

    :raises UnrebuildableBaselineError: the events do not rebuild to an executed record with fields.
    """
    if "record" in base:
        record: dict[str, Any] = base["record"]
        return record
    key = (str(base["run_id"]), str(base["last_hash"]))
    known = _REBUILT.get(key)
    if known is not None:
        _REBUILT.move_to_end(key)
        return known
    try:
        rebuilt = rebuild_record([decode_event(e, hashed=True) for e in base["events"]], verify=False)
    except (EventDecodeError, ChainError, ValueError) as exc:  # ValueError: pydantic's ValidationError
        raise UnrebuildableBaselineError(f"executed run {key[0]} cannot be rebuilt: {exc}") from exc
    if rebuilt.execution_decision != "executed" or rebuilt.fields is None:
        raise UnrebuildableBaselineError(f"executed run {key[0]} does not rebuild to an executed record with fields")
    record = rebuilt.model_dump(mode="json")
    _REBUILT[key] = record
    if len(_REBUILT) > _REBUILT_KEPT:
        _REBUILT.popitem(last=False)
    return record


def baseline_record(state: Mapping[str, Any] | None) -> ExecutionRecord | None:
    """The baseline of a folded state as an `ExecutionRecord` carrying its run reference, or None.

    :raises UnrebuildableBaselineError: see `baseline_json`.
    """
    if not state or not state.get("baseline"):
        return None
    base = state["baseline"]
    ref = RunRef(run_id=base["run_id"], last_hash=base["last_hash"], next_seq=base["next_seq"])
    return ExecutionRecord.model_validate(baseline_json(base)).with_run_ref(ref)
