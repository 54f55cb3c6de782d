"""`preflight-audit contract check`: the verdict the consumers would give on a producer's events, offline.

Events arrive as JSON lines (one event per line, as the producer writes it). They are grouped into the
messages a producer publishes (`messages`): a run's events from its first to its `run_closed`, and each
outcome (`executed` / `execution_failed`) on its own, keyed by the `action_key`. Each message then goes,
in order, through the consumers' own pure code -- the fold worker's (`streams.batch.fold_partition`, around
`preflight.fold.evolve`) and the projector's (`projections.signatures.prepare_checked`, then
`projections.rows.plan_batch` against the runs accepted so far) -- so the verdict is theirs, with their
dead-letter codes (both call `preflight.verdict`). No broker, no database.

Beside the verdict, which names the first defect as a consumer does, the check lists every failure it
finds: each event's violations of the contract (`preflight/contract/events.schema.json`, all of them),
each fault of the chain (seq, links, closing count and last hash, each hash), and the verdict's. With
trusted public keys (`DecisionTrust`), an outcome also needs a decision validly signed by one of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from preflight.chain import TAIL_EVENT_TYPES, RunCursor, hash_matches
from preflight.contract import load
from preflight.records import UNKEYED_RECORD_KEY
from preflight.signing import DecisionVerifier
from projections.decode import Incoming
from projections.rows import StoredRun, plan_batch, rows_as_dicts
from projections.signatures import DecisionTrust, prepare_checked
from streams.batch import Incoming as WorkerIncoming
from streams.batch import Progress, fold_partition

__all__ = ["Message", "Verdict", "check", "check_messages", "messages"]

_TOPIC = "contract-check"


@dataclass(frozen=True)
class Message:
    """What a producer would publish: the key, the value, and the input lines its events came from."""

    key: bytes | None
    value: bytes | None
    lines: tuple[int, ...]
    events: tuple[Any, ...]

    @classmethod
    def wire(cls, key: bytes | None, value: bytes | None) -> Message:
        """A message as read from the topic (its events, when its value is a JSON array, for the report)."""
        try:
            events = json.loads(value) if value is not None else None
        except ValueError:
            events = None
        return cls(key, value, (), tuple(events) if isinstance(events, list) else ())

    @property
    def run_id(self) -> str | None:
        first = self.events[0] if self.events else None
        run_id = first.get("run_id") if isinstance(first, dict) else None
        return run_id if isinstance(run_id, str) else None

    @property
    def kind(self) -> str:
        first = self.events[0] if self.events else None
        return "outcome" if isinstance(first, dict) and first.get("event_type") in TAIL_EVENT_TYPES else "run"


@dataclass
class Verdict:
    """The consumers' verdict on one message, and every failure found in it."""

    message: Message
    #: (code, reason) of each consumer's dead letter; None: accepted (applied, or a duplicate).
    worker: tuple[str, str] | None
    projector: tuple[str, str] | None
    problems: list[str] = field(default_factory=list)

    @property
    def accepted(self) -> bool:
        return self.worker is None and self.projector is None

    @property
    def agreed(self) -> bool:
        """Both consumers accept it, or both dead-letter it under the same code."""
        return (self.worker is None) == (self.projector is None) and (
            self.worker is None or self.projector is None or self.worker[0] == self.projector[0]
        )

    def to_json(self) -> dict[str, Any]:
        def side(verdict: tuple[str, str] | None) -> dict[str, str] | None:
            return None if verdict is None else {"code": verdict[0], "reason": verdict[1]}

        return {
            "run_id": self.message.run_id,
            "key": self.message.key.decode("utf-8", "replace") if self.message.key is not None else None,
            "kind": self.message.kind,
            "lines": list(self.message.lines),
            "verdict": "accepted" if self.accepted else "dead_letter",
            "worker": side(self.worker),
            "projector": side(self.projector),
            "agreed": self.agreed,
            "problems": self.problems,
        }


def messages(lines: Iterable[str]) -> list[Message]:
    """The messages a producer publishes for these JSON lines (blank lines skipped; numbered from 1).

    A line that is not a JSON object, or an event without a string `run_id`, is a message of its own (the
    consumers dead-letter it); a run not closed by the end of the input is published as it stands."""
    out: list[Message] = []
    open_runs: dict[str, list[tuple[int, str, Any]]] = {}

    def emit(parts: Sequence[tuple[int, str, Any]]) -> None:
        first = parts[0][2]
        action_key = first.get("action_key") if isinstance(first, dict) else None
        key = (action_key if isinstance(action_key, str) else UNKEYED_RECORD_KEY).encode("utf-8", "surrogatepass")
        value = ("[" + ",".join(text for _, text, _ in parts) + "]").encode("utf-8", "surrogatepass")
        out.append(Message(key, value, tuple(n for n, _, _ in parts), tuple(e for _, _, e in parts)))

    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            event: Any = json.loads(text)
        except ValueError:
            event = None
        run_id = event.get("run_id") if isinstance(event, dict) else None
        if not isinstance(run_id, str):
            emit([(number, text, event)])
            continue
        if event.get("event_type") in TAIL_EVENT_TYPES and run_id not in open_runs:
            emit([(number, text, event)])
            continue
        open_runs.setdefault(run_id, []).append((number, text, event))
        if event.get("event_type") == "run_closed":
            emit(open_runs.pop(run_id))
    for parts in open_runs.values():
        emit(parts)
    return out


def check(
    lines: Iterable[str], *, trust: DecisionTrust | None = None, verifier: DecisionVerifier | None = None
) -> list[Verdict]:
    """Each message's verdict, in input order (see the module doc). `trust` checks decisions' signatures as
    the projector does; `verifier` as the worker does (default: the trust's own)."""
    return check_messages(messages(lines), trust=trust, verifier=verifier)


def check_messages(
    published: Sequence[Message], *, trust: DecisionTrust | None = None, verifier: DecisionVerifier | None = None
) -> list[Verdict]:
    """`check` of messages as published, in log order (`Message.wire` for a topic's records)."""
    if verifier is None and trust is not None:
        verifier = trust.verifier()
    validator = _Validators()
    states: dict[str, Mapping[str, Any]] = {}
    progress = Progress()
    stored: dict[str, StoredRun] = {}
    taken: set[str] = set()
    verdicts: list[Verdict] = []
    for offset, message in enumerate(published):
        key = message.key
        folded = fold_partition(
            _TOPIC, 0, [WorkerIncoming(0, offset, key, message.value)], progress, states.get, verifier=verifier
        )
        progress = folded.progress
        for action_key, state in folded.writes.items():
            states[f"k:{action_key}"] = state
        worker = None
        if folded.dead_letters:
            (letter,) = folded.dead_letters
            worker = (letter.dead_letter_code, letter.reason)

        chunk = prepare_checked([Incoming(_TOPIC, 0, offset, key, message.value)], trust)
        plan = plan_batch(
            [chunk],
            stored,
            projection="contract-check",
            next_offsets={},
            taken_event_ids=frozenset(taken),
            decision_trust=trust,
        )
        stored.update(plan.states)
        taken.update(plan.event_ids)
        letters = rows_as_dicts(plan, "dead_letters")
        projector = (letters[0]["code"], letters[0]["reason"]) if letters else None
        verdicts.append(Verdict(message, worker, projector, _problems(message, validator)))
    return verdicts


class _Validators:
    """The contract's validator of each event type's own definition (its errors name the member at fault,
    where the whole schema's `oneOf` says only that no definition matched), and the whole schema's."""

    def __init__(self) -> None:
        contract = load()
        self.whole = Draft202012Validator(contract)
        self.by_type: dict[str, Draft202012Validator] = {}
        for name, definition in contract["$defs"].items():
            event_type = definition.get("properties", {}).get("event_type", {}).get("const")
            if isinstance(event_type, str):
                own = {"$schema": contract["$schema"], "$defs": contract["$defs"], "$ref": f"#/$defs/{name}"}
                self.by_type[event_type] = Draft202012Validator(own)

    def iter_errors(self, event: Any) -> Iterable[Any]:
        event_type = event.get("event_type") if isinstance(event, dict) else None
        chosen = self.by_type.get(event_type) if isinstance(event_type, str) else None
        return (chosen or self.whole).iter_errors(event)


def _problems(message: Message, validator: _Validators) -> list[str]:
    """Every violation of the contract by each event, and every fault of the message's chain."""
    problems: list[str] = []
    for line, event in zip(message.lines or range(1, len(message.events) + 1), message.events, strict=True):
        if event is None:
            problems.append(f"line {line}: not JSON")
            continue
        for error in sorted(validator.iter_errors(event), key=lambda e: list(e.absolute_path)):
            where = "/".join(str(p) for p in error.absolute_path) or "<event>"
            problems.append(f"line {line}: schema: {where}: {_short(error.message)}")
        if isinstance(event, dict) and not hash_matches(event):
            problems.append(f"line {line}: chain: hash does not match the event's content")
    numbers = message.lines or tuple(range(1, len(message.events) + 1))
    if message.events and message.kind == "run" and all(isinstance(e, dict) for e in message.events):
        cursor = RunCursor()
        for line, event in zip(numbers, message.events, strict=True):
            for fault in cursor.step(
                event.get("seq"),
                event.get("event_type"),
                event.get("prev_hash"),
                event.get("hash"),
                event.get("event_count"),
                event.get("last_hash"),
            ):
                problems.append(f"line {line}: chain: {fault.kind}: {fault.detail}")
        if not cursor.closed:
            problems.append(f"line {numbers[-1]}: chain: unclosed_run: the run has no run_closed")
    return problems


def _short(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."
