"""From one Kafka message to verified events, or to the reason it cannot be projected (pure).

A message carries a whole run (seq 0 .. `run_closed`) or one tail event (`executed` /
`execution_failed`), as a JSON array (`preflight.events.encode_message`). `decode_incoming` checks,
in this order, everything that can be judged from the message alone: it has a value and a key, it
is a non-empty JSON array, every event is of a known type and supported version and validates
strictly against its model, every `event_id` is a UUID, every hash matches its content, and a run
message is one intact chain (contiguous `seq` from 0, each `prev_hash` linked, closed by a single
`run_closed` whose count and last hash match, under the Kafka key of its `action_key`), and the verdict
the fold worker gives too (`preflight.verdict`: each member the contract narrows, the one decision event
its close announces, distinct field names and item indexes, an execute run's fields computed). Anything
else becomes a `Rejected` with a code and a reason, destined for `dead_letters`. What needs the stored
projection (is this run new? does this outcome link to its run's stored last hash?) is judged later, in
`projections.rows.plan_batch`.

The chain rules are those of `preflight.events.verify_run` (the unit tests compare the two on
altered runs), plus the transport's (one run per message, the outcome in a message of its own).

Two paths, one verdict. The fast path decodes and validates the whole message strictly in one msgspec
call, against structs made from the event models (`_shape`), and hashes each event's msgspec encoding
with sorted keys, which is byte for byte `preflight.events.canonical_json` for every string and integer
(a unit test compares them); msgspec spells some floats differently (1e16 for 1e+16), so a message
holding a float (or anything the fast path does not accept) takes the reference path: read with the
standard library, validated event by event with `preflight.events.decode_event`, hashed with
`preflight.events.content_hash` itself, which also names the precise defect.

The fast path is the consumers' shared intake check (`preflight.intake`: the fold worker asks it too). It
has a compiled part (`native/`, the `preflight_audit_native` module, built by `make` wherever there is a
Rust toolchain). The producer writes each event in canonical form, so it checks on the
message's own bytes that every event is in that form, its event_id a UUID and its hash a lower-case digest
that matches, and answers their texts (appending their archive rows to the chunk's `ArchiveColumns`) --
or nothing, for anything it cannot vouch for (a float, an escaped key, whitespace, a hash that does not
match, ...), and then the Python above decides as it would without it. With it, the message is decoded
by shapes without the event_id and hash patterns (`_RELAXED_SHAPES`), which it checks instead. Property
tests hold it to all that (tests/unit/test_native_decode.py); `PREFLIGHT_NATIVE_DECODE=0` leaves it unused.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from preflight.chain import LEGACY_HASH_VERSIONS, message_problem, spelled_alike
from preflight.errors import EventDecodeError
from preflight.events import (
    EVENT_TYPES,
    SUPPORTED_EVENT_VERSIONS,
    TAIL_EVENT_TYPES,
    content_hash,
    decode_event,
    event_canonical_json,
)
from preflight.intake import (
    CANONICAL,
    MESSAGE,
    NATIVE_CHECK,
    RELAXED,
    RELAXED_SHAPES,
    EventJson,
    as_dicts,
    decoded,
    fast_path,
    shaped,
)
from preflight.intake import NATIVE as NATIVE
from preflight.intake import NATIVE_ENV as NATIVE_ENV
from preflight.records import UNKEYED_RECORD_KEY
from preflight.shapes import UUID_PATTERN as _UUID_PATTERN
from preflight.shapes import has_float as _has_float
from preflight.verdict import event_problem, run_problem

__all__ = [
    "Decoded",
    "EventJson",
    "Incoming",
    "Rejected",
    "VerifiedRun",
    "VerifiedTail",
    "decode_incoming",
]

_SORTED: Final = orjson.OPT_SORT_KEYS
#: The fast path's parts (`preflight.intake`), under the names they had here.
_CANONICAL, _MESSAGE, _RELAXED, _RELAXED_SHAPES = CANONICAL, MESSAGE, RELAXED, RELAXED_SHAPES
_as_dicts, _decoded, _shaped = as_dicts, decoded, shaped
#: The compiled check (`preflight.intake.NATIVE_CHECK`), or None; `_fast_path` reads it here at each call.
_NATIVE: Callable[..., list[bytes] | None] | None = NATIVE_CHECK

#: Integers that go to an INTEGER column (a tail's `seq`, a checklist item's index) lie below this.
_INTEGER_LIMIT: Final = 2**31


_UUID = re.compile(_UUID_PATTERN)


@dataclass(frozen=True, slots=True)
class Incoming:
    """One consumed Kafka message, as the projector needs it (a plain value: no client objects)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message that cannot be projected: it goes to `dead_letters` with `code` and `reason`."""

    incoming: Incoming
    code: str
    reason: str
    run_id: str | None = None


@dataclass(frozen=True, slots=True)
class VerifiedRun:
    """A whole run, intact: its events in `seq` order, each as the JSON object it was hashed as
    (`EventJson`), and the canonical JSON of each (UTF-8)."""

    incoming: Incoming
    run_id: str
    events: tuple[EventJson, ...]
    encoded: tuple[bytes, ...]

    @property
    def close(self) -> EventJson:
        """The `run_closed` event."""
        return self.events[-1]


@dataclass(frozen=True, slots=True)
class VerifiedTail:
    """One `executed` / `execution_failed` event whose own hash is intact (its link is checked later)."""

    incoming: Incoming
    run_id: str
    event: EventJson
    encoded: bytes


Decoded = VerifiedRun | VerifiedTail | Rejected


class _Reject(Exception):
    def __init__(self, code: str, reason: str, run_id: str | None = None) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.run_id = run_id


def decode_incoming(incoming: Incoming, columns: Any = None) -> Decoded:
    """Judge one message on its own: a verified run, a tail whose hash is intact, or a rejection.

    `columns`: a chunk's `preflight_audit_native.ArchiveColumns`, to which the compiled check appends the
    archive rows of a message it vouches for (`projections.rows.prepare_all` takes them back if the
    message is refused after all)."""
    try:
        return _decode(incoming, columns)
    except _Reject as rejection:
        return Rejected(incoming, rejection.code, rejection.reason, rejection.run_id)


def _decode(incoming: Incoming, columns: Any = None) -> Decoded:
    if incoming.value is None:
        raise _Reject("tombstone", "tombstone: the message has no value")
    if incoming.key is None:
        raise _Reject("no_key", "the message has no key (events are keyed by action_key)")
    try:
        key = incoming.key.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Reject("undecodable", f"the message key is not UTF-8: {exc}") from exc

    fast = _fast_path(incoming.value, columns)
    if fast is not None:
        events, encoded = fast
    else:
        events, encoded = _reference_path(incoming.value)
    run_id: str = events[0]["run_id"]

    if any(e["run_id"] != run_id for e in events):
        raise _Reject("mixed_runs", "the message mixes events of several runs", run_id)
    for event in events:
        action_key = event["action_key"]
        if (action_key if action_key is not None else UNKEYED_RECORD_KEY) != key:
            raise _Reject(
                "key_mismatch",
                f"seq {event['seq']} has action_key {action_key!r} but the message key is {key!r}",
                run_id,
            )

    if events[0]["event_type"] in TAIL_EVENT_TYPES:
        if len(events) != 1:
            raise _Reject("incomplete_run", "a tail message carries exactly one outcome event", run_id)
        if events[0]["seq"] >= _INTEGER_LIMIT:
            raise _Reject("unprojectable", f"seq {events[0]['seq']} is beyond the archive's INTEGER column", run_id)
        refused = event_problem(events[0], "event 0")  # the contract's verdict, the fold's too
        if refused is not None:
            raise _Reject(refused.code, refused.reason, run_id)
        return VerifiedTail(incoming, run_id, events[0], encoded[0])
    _check_run(events, run_id)
    return VerifiedRun(incoming, run_id, tuple(events), tuple(encoded))


def _fast_path(value: bytes, columns: Any = None) -> tuple[list[EventJson], list[bytes]] | None:
    """The consumers' shared fast path (`preflight.intake.fast_path`), with this module's compiled check."""
    return fast_path(value, columns, _NATIVE)


def _reference_path(value: bytes) -> tuple[list[EventJson], list[bytes]]:
    """Every event read, validated and hashed one by one; raises `_Reject` naming the first defect.

    Each event is returned as its canonical JSON reads back with the standard library (exact for
    floats and integers of any size): the object that was hashed."""
    raw, exact = _parse(value)
    if not isinstance(raw, list) or not raw:
        raise _Reject("not_an_event_array", f"the message is a JSON {type(raw).__name__}, not a non-empty array")
    run_id = _run_id_of(raw)
    events: list[EventJson] = []
    encoded: list[bytes] = []
    for index, item in enumerate(raw):
        text = _verified_event(item, index, exact, run_id)
        events.append(json.loads(text))
        encoded.append(text)
    return events, encoded


def _parse(value: bytes) -> tuple[Any, bool]:
    """The message's JSON, and whether orjson read it exactly (no floats, no out-of-range integers)."""
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        pass
    else:
        if not _has_float(raw):
            return raw, True
    try:
        return json.loads(bytes(value).decode("utf-8")), False
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError, nesting
        raise _Reject("undecodable", f"undecodable bytes: {type(exc).__name__}: {exc}") from exc


def _run_id_of(raw: list[Any]) -> str | None:
    first = raw[0]
    if isinstance(first, dict) and isinstance(first.get("run_id"), str):
        run_id: str = first["run_id"]
        return run_id
    return None


def _verified_event(item: Any, index: int, exact: bool, run_id: str | None) -> bytes:
    """The canonical JSON of one event that validates strictly and whose hash matches its content."""
    where = f"event {index}"
    if not isinstance(item, dict):
        raise _Reject("malformed_event", f"{where} is a JSON {type(item).__name__}, not an object", run_id)
    event_type = item.get("event_type")
    if not isinstance(event_type, str) or event_type not in EVENT_TYPES:
        raise _Reject("unknown_event_type", f"{where}: unknown event_type {event_type!r:.80}", run_id)
    version = item.get("schema_version")
    if type(version) is not int or version not in SUPPORTED_EVENT_VERSIONS:
        reason = f"{where}: unsupported schema_version {version!r:.80} for {event_type}"
        raise _Reject("unsupported_schema_version", reason, run_id)
    try:
        event = decode_event(item)
    except EventDecodeError as exc:
        raise _Reject("malformed_event", f"{where}: {exc}", run_id) from exc
    if not _UUID.fullmatch(event.event_id):
        raise _Reject("event_id_not_uuid", f"{where}: event_id {event.event_id!r:.80} is not a UUID", run_id)
    text = _hashed_text(item, exact)
    if text is None:
        raise _Reject(
            "broken_chain", f"{where} (seq {event.seq}, {event_type}): hash does not match its content", event.run_id
        )
    return text


def _hashed_text(item: dict[str, Any], exact: bool) -> bytes | None:
    """The event's canonical JSON if its `hash` matches its content and `prev_hash`, else None."""
    claimed = item["hash"]
    prev = item["prev_hash"]
    if exact:
        full = orjson.dumps(item, option=_SORTED)
        # orjson's sorted form is the canonical form of versions 1 and 2, and of version 3 when spelled alike.
        legacy = item.get("schema_version") in LEGACY_HASH_VERSIONS
        body = _without_hash(full, claimed) if legacy or spelled_alike(full) else None
        if body is not None:
            digest = hashlib.sha256(prev.encode() + b"\n" + body).hexdigest()
            if digest == claimed:
                return full
    # The reference computation: floats, integers orjson cannot hold, or a fast-path miss.
    try:
        if claimed != content_hash(prev, item):
            return None
        return event_canonical_json(item)
    except (TypeError, ValueError):  # NaN / Infinity, or a lone surrogate: no canonical form
        return None


def _without_hash(full: bytes, claimed: str) -> bytes | None:
    """`full` without its top-level `"hash"` member (the hashed body), or None if it is not found.

    Keys are sorted, so the member is found by its exact bytes; a nested object holding the same
    member first only makes the digest differ, and the reference computation then decides.
    """
    member = b'"hash":' + orjson.dumps(claimed)
    at = full.find(b"," + member)
    if at >= 0:
        return full[:at] + full[at + 1 + len(member) :]
    if full.startswith(b"{" + member + b","):
        return b"{" + full[len(member) + 2 :]
    return None


def _check_run(events: Sequence[EventJson], run_id: str) -> None:
    """A run message's chain and the consumers' verdict on it (see the module doc); raises `_Reject` naming
    the first defect."""
    problem = message_problem(events)  # the run-chain rule (`preflight.chain`)
    if problem is not None:
        raise _Reject(problem[0], problem[1], run_id)
    refused = run_problem(events)  # the contract's verdict, the fold's too (`preflight.verdict`)
    if refused is not None:
        raise _Reject(refused.code, refused.reason, run_id)
