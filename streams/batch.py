"""Fold a batch of one partition: pure code around `preflight.fold.evolve`, no Faust, no I/O.

The worker hands `fold_partition` the messages of one source partition in offset order, contiguous
from the partition's watermark + 1 (it reads back any offsets the consumer skipped first; a range the
log no longer holds arrives as `Missing`). For each message it decodes the value, folds it into the
key's state with `evolve`, and turns every anomaly -- undecodable bytes, a tombstone, a missing or
non-UTF-8 key, anything `evolve` refuses, an exception inside it, offsets the log lost -- into a
`DeadLetter` carrying the original bytes and the reason. A message at or below the watermark is a
redelivery and is skipped before it is even decoded.

The result says which keys' states changed, the changelog records that store those changes (only the
parts of a state each message changed, `preflight.fold.stored_parts`), the dead letters to publish, and
the partition's new `Progress` (watermark and counts), which the worker stores in the same changelog
partition *after* the states' records: a recovered watermark therefore never claims more than the
recovered states hold, and the per-key `applied_offset` (inside each state) covers the other direction.
Correctness depends on neither the consumer's offset commits nor exactly-once delivery.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from preflight.errors import EventDecodeError
from preflight.events import WireEvents, decode_message
from preflight.fold import CORE, Position, evolve, restore_part
from preflight.intake import VouchedEvents, vouched
from preflight.signing import DecisionVerifier

#: Table keys: a key's state lives under STATE_PREFIX + action_key, a partition's progress under
#: PROGRESS_PREFIX + partition number, so the two can never collide whatever an action_key is. In the
#: changelog a state is stored as its parts (`preflight.fold.stored_parts`), each under
#: ``<part>:<action_key>`` (`part_key`): the core under the state's own key, ``b:`` the baseline,
#: ``r<slot>:`` a remembered run.
STATE_PREFIX = CORE + ":"
PROGRESS_PREFIX = "w:"

DEAD_LETTER_VERSION = 1


def state_key(action_key: str) -> str:
    return STATE_PREFIX + action_key


def progress_key(partition: int) -> str:
    return f"{PROGRESS_PREFIX}{partition}"


def part_key(part: str, action_key: str) -> str:
    """The changelog key of one part of `action_key`'s state."""
    return f"{part}:{action_key}"


def decode_value(value: bytes | None) -> VouchedEvents | WireEvents:
    """A message's events: vouched for by the consumers' shared intake check (`preflight.intake.vouched`, the
    projector's), or else decoded for `preflight.fold.evolve` to judge event by event (`decode_message`),
    which names the defect; `EventDecodeError` if the value is not JSON events at all."""
    checked = vouched(value)
    return checked if checked is not None else decode_message(value)


def encode_changelog_value(value: Any) -> bytes:
    """A changelog record's value as JSON (what Faust's json codec writes, read back by it alike): orjson,
    or the standard library for what orjson cannot write (an integer beyond 64 bits in an event)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def decode_changelog_value(value: bytes | None) -> Any:
    """A changelog record's value read back (`encode_changelog_value`); None for a tombstone."""
    if value is None:
        return None
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:  # an integer beyond 64 bits
        return json.loads(value)


def restore_record(table: MutableMapping[str, Any], key: str, value: Any) -> str | None:
    """Apply one changelog record to `table` (a recovering table's data, in log order); the table key it
    changed (a state's or a progress's), or None for a key this worker never writes."""
    if key.startswith(PROGRESS_PREFIX):
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
        return key
    part, colon, action_key = key.partition(":")
    if not colon:
        return None
    target = state_key(action_key)
    current = table.get(target)
    table[target] = restore_part(current if isinstance(current, dict) else None, action_key, part, value)
    return target


@dataclass(frozen=True)
class Incoming:
    """One message as read from the events topic (key and value as raw bytes)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class Missing:
    """Offsets `start` .. `end - 1` of a partition that the log no longer holds (retention, truncation)."""

    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class DeadLetter:
    """A message the fold did not apply, and why. Published to the dead-letter topic as JSON, with its code
    (`dead_letter_code`, the projector's for the same defect) in the header ``dead_letter_code``."""

    reason: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    end_offset: int | None = None
    code: str = ""

    @property
    def dead_letter_code(self) -> str:
        """The letter's code: the one it was given, else the one its reason reads as."""
        return self.code or dead_letter_code(self.reason)

    def headers(self) -> list[tuple[str, bytes]]:
        return [("dead_letter_code", self.dead_letter_code.encode())]

    def record(self) -> dict[str, Any]:
        """The dead-letter topic's JSON record: the original bytes in base64, the reason (which starts with
        its code, ``<code>: ...``, as the projector's), the source."""
        key_text: str | None
        try:
            key_text = self.key.decode("utf-8") if self.key is not None else None
        except UnicodeDecodeError:
            key_text = None
        code = self.dead_letter_code
        return {
            "dead_letter_version": DEAD_LETTER_VERSION,
            "reason": self.reason if self.reason.startswith(f"{code}: ") else f"{code}: {self.reason}",
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "end_offset": self.end_offset,
            "key": key_text,
            "key_b64": base64.b64encode(self.key).decode("ascii") if self.key is not None else None,
            "value_b64": base64.b64encode(self.value).decode("ascii") if self.value is not None else None,
        }

    def encode(self) -> bytes:
        return json.dumps(self.record(), sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Progress:
    """How far a partition is folded (`offset`, inclusive; -1 before the first message) and what it saw.

    The counts are exact: each offset is counted once, however often it is delivered or read again.
    `applied` counts the messages folded into a key's state (new runs and outcomes, and the duplicates
    the state recognises: a key's own `counts` tell these apart); `dead_letters` the messages that went
    to the dead-letter topic instead, also by `dead_letter_code` in `dead_letter_codes`; `missing` the
    offsets the log no longer held (one dead letter spans each such range).
    """

    offset: int = -1
    messages: int = 0
    applied: int = 0
    dead_letters: int = 0
    missing: int = 0
    dead_letter_codes: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "dead_letter_codes": dict(self.dead_letter_codes)}

    @classmethod
    def from_json(cls, data: Any) -> Progress:
        if not isinstance(data, Mapping):
            return cls()
        counts = {name: int(data.get(name, default)) for name, default in _PROGRESS_COUNTS.items()}
        codes = data.get("dead_letter_codes")
        by_code = {str(k): int(v) for k, v in codes.items()} if isinstance(codes, Mapping) else {}
        return cls(**counts, dead_letter_codes=by_code)


_PROGRESS_COUNTS = {"offset": -1, "messages": 0, "applied": 0, "dead_letters": 0, "missing": 0}

#: A dead letter's reason, as `fold_partition` and `preflight.fold.evolve` word it, mapped to a short code
#: (the first pattern found in the reason wins): the label of the dead-letter counters, a bounded set. The
#: codes are the projector's for the same defect (`projections.decode`, `projections.rows`); where the fold
#: names the code itself (`preflight.fold.Folded.code`), that one is taken.
DEAD_LETTER_CODES: tuple[tuple[str, str], ...] = (
    ("no longer in the log", "missing_offsets"),
    ("internal error while folding", "internal_error"),
    ("message has no key", "no_key"),
    ("message key is not UTF-8", "undecodable"),
    ("tombstone", "tombstone"),
    ("undecodable", "undecodable"),
    ("unknown event_type", "unknown_event_type"),
    ("unsupported schema_version", "unsupported_schema_version"),
    ("broken hash chain", "broken_chain"),
    (" seq: expected ", "broken_chain"),
    ("does not match the message key", "key_mismatch"),
    ("mixes events of several runs", "mixed_runs"),
    ("seen before with different content", "run_id_conflict"),
    ("reused by run", "event_id_reused"),
    ("for a run whose decision was", "outcome_for_non_execute"),
    ("without a recorded execute decision", "outcome_without_run"),
    ("second outcome", "second_outcome"),
    ("whose effect is not unknown", "read_back_without_unknown"),
    ("whose effect is unknown", "second_outcome"),
    # An outcome's decision, by the projector's codes (`projections.signatures`): unsigned is not badly signed.
    ("which carries no signature", "unsigned_decision"),
    ("which carries an unreadable signature", "unsigned_decision"),
    ("signed by an untrusted key", "untrusted_decision_key"),
    ("signature", "bad_decision_signature"),
    ("validity period", "invalid_decision_period"),
    ("not valid before", "decision_not_yet_valid"),
    ("expired", "expired_decision"),
    ("no readable occurred_at", "undated_outcome"),
    ("does not match the approved decision", "outcome_mismatch"),
    ("execution_approved events", "outcome_mismatch"),
    ("cannot be rebuilt", "unrebuildable_run"),
    ("did not rebuild", "unrebuildable_run"),
    ("incomplete run", "incomplete_run"),
    ("a tail message carries", "incomplete_run"),
    ("empty array", "not_an_event_array"),
    ("not a non-empty list", "not_an_event_array"),
    ("is a JSON", "not_an_event_array"),
    ("is not a UUID", "event_id_not_uuid"),
    ("malformed", "malformed_event"),
    ("mistyped", "malformed_event"),
)


def dead_letter_code(reason: str) -> str:
    """The short code of a dead letter's `reason` (``other`` when no pattern matches)."""
    for pattern, code in DEAD_LETTER_CODES:
        if pattern in reason:
            return code
    return "other"


@dataclass
class PartitionFold:
    """The outcome of folding one batch of one partition."""

    topic: str
    partition: int
    progress: Progress
    writes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The changelog records (key, value) that store what the batch changed, in the order to write them.
    records: list[tuple[str, Any]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: Delivered at or below the watermark: skipped before decoding.
    redelivered: int = 0
    #: Beyond the watermark but already in its key's state (`applied_offset`): the state was stored and
    #: the watermark that covers it was not (a restart between the two writes). Folded again, unchanged.
    re_read: int = 0
    baselines_changed: int = 0


StateLoader = Callable[[str], Mapping[str, Any] | None]


def _key_text(key: bytes | None) -> tuple[str | None, str | None]:
    """(action_key, None) or (None, reason)."""
    if key is None:
        return None, "message has no key (every preflight message is keyed by action_key)"
    try:
        return key.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"message key is not UTF-8: {exc}"


def fold_partition(
    topic: str,
    partition: int,
    items: Iterable[Incoming | Missing],
    progress: Progress,
    load: StateLoader,
    decode: Callable[[bytes | None], list[Any]] = decode_value,
    *,
    verifier: DecisionVerifier | None = None,
) -> PartitionFold:
    """Fold `items` (one partition, offset order) on top of `progress`; never raises for bad input.

    With `verifier`, an `executed`/`execution_failed` counts only for a decision signed by a trusted key.
    Items at or below `progress.offset` are redeliveries and are skipped. Every other item must start
    exactly at the next offset: a hole is the caller's bug (it must read skipped offsets back first),
    so it raises `ValueError` rather than fold past it.
    """
    result = PartitionFold(topic, partition, progress)
    states: dict[str, dict[str, Any]] = {}
    offset, messages = progress.offset, progress.messages
    applied, dead, missing = progress.applied, progress.dead_letters, progress.missing
    codes = Counter(progress.dead_letter_codes)

    for item in items:
        if item.partition != partition:
            raise ValueError(f"item of partition {item.partition} in a batch of partition {partition}")
        if isinstance(item, Missing):
            if item.end <= offset + 1:
                continue
            if item.start > offset + 1:
                raise ValueError(f"partition {partition}: offsets {offset + 1}..{item.start - 1} were not given")
            result.dead_letters.append(
                DeadLetter(
                    reason=f"offsets {offset + 1}..{item.end - 1} are no longer in the log: not folded",
                    topic=topic,
                    partition=partition,
                    offset=offset + 1,
                    key=None,
                    value=None,
                    end_offset=item.end - 1,
                )
            )
            missing += item.end - 1 - offset
            dead += 1
            codes["missing_offsets"] += 1
            offset = item.end - 1
            continue
        if item.offset <= offset:
            result.redelivered += 1
            continue
        if item.offset != offset + 1:
            raise ValueError(f"partition {partition}: offsets {offset + 1}..{item.offset - 1} were not given")
        offset = item.offset
        messages += 1

        def reject(reason: str, item: Incoming = item, code: str | None = None) -> None:
            letter = DeadLetter(reason, topic, partition, item.offset, item.key, item.value, code=code or "")
            result.dead_letters.append(letter)
            codes[letter.dead_letter_code] += 1

        action_key, problem = _key_text(item.key)
        if action_key is None:
            reject(problem or "unreadable key")
            dead += 1
            continue
        try:
            events = decode(item.value)
        except EventDecodeError as exc:
            reject(str(exc))
            dead += 1
            continue
        state: Mapping[str, Any] | None = states.get(action_key)
        if state is None:
            state = load(state_key(action_key))
        try:
            folded = evolve(state, events, Position(topic, partition, item.offset), action_key, verifier=verifier)
        except Exception as exc:  # the fold is pure and total; should it ever raise, the message is dead-lettered
            reject(f"internal error while folding: {type(exc).__name__}: {exc}")
            dead += 1
            continue
        if folded.outcome == "anomaly":
            reject(folded.reason or "anomaly", code=folded.code)
            dead += 1
            continue
        applied += 1
        if folded.outcome == "duplicate" and folded.reason == "offset already applied":
            result.re_read += 1
            continue  # the state already holds this message: nothing changes
        if folded.baseline_changed:
            result.baselines_changed += 1
        states[action_key] = folded.state
        result.writes[action_key] = folded.state
        result.records.extend((part_key(part, action_key), value) for part, value in folded.parts)

    result.progress = Progress(offset, messages, applied, dead, missing, dict(sorted(codes.items())))
    return result
