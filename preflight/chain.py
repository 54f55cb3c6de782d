"""The run-chain rule (SPEC §3, tamper evidence), defined once: the engine, the fold, the projector and the
ledger's `verify` all apply it from here.

**The hash.** An event's `hash` is the lower-case hex SHA-256 of its `prev_hash`, a newline, and the
canonical JSON of every member but `hash` (`canonical_json`: keys sorted by code point, no whitespace,
UTF-8, no NaN). `content_hash` computes it; `hash_matches` checks a decoded event, on the exact text it was
read from when that text is canonical (no re-serialisation), else by computing it. The compiled check of
the projector (`native/`) is an optional accelerator of `hash_matches` over canonical texts, held to it by
property tests (`tests/unit/test_native_decode.py`).

**The chain.** A run's events, in `seq` order, are numbered 0, 1, ... (`seq_gap`); each links to the one
before by its `prev_hash` (the first to 64 zeros; `broken_link`); one `run_closed` states the run's event
count and its own `prev_hash` as the last hash (`close_mismatch`); after it comes at most one outcome,
`executed` or `execution_failed` (`event_after_close`); a run without a `run_closed` is truncated
(`unclosed_run`). `RunCursor` follows one run event by event and names each fault where the chain breaks;
everything else is built on it: `verify_run` (raises `ChainError` at the first fault, hashes included) and
`message_problem` (the transport's rule for one Kafka message: a whole run, `run_started` to `run_closed`,
or one outcome continuing its closed run).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from preflight.errors import ChainError

__all__ = [
    "GENESIS_HASH",
    "TAIL_EVENT_TYPES",
    "ChainFault",
    "Fault",
    "RunCursor",
    "canonical_json",
    "content_hash",
    "hash_matches",
    "message_problem",
    "verify_run",
]

GENESIS_HASH = "0" * 64
TAIL_EVENT_TYPES = frozenset({"executed", "execution_failed"})

ChainFault = Literal["seq_gap", "broken_link", "close_mismatch", "event_after_close", "unclosed_run"]


def canonical_json(data: Any) -> bytes:
    """One byte form per value: sorted keys, no spaces, UTF-8, no NaN."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def content_hash(prev_hash: str, body: Mapping[str, Any]) -> str:
    """The chain hash of an event whose fields other than `hash` are `body`."""
    h = hashlib.sha256()
    h.update(prev_hash.encode())
    h.update(b"\n")
    h.update(canonical_json({k: v for k, v in body.items() if k != "hash"}))
    return h.hexdigest()


_HEX64 = re.compile(r"[0-9a-f]{64}")


def hash_member(text: bytes, claimed: str) -> int:
    """Where an event's canonical `text` holds its top-level ``"hash":"<claimed>",`` member (-1: nowhere).
    Keys are sorted, so a canonical event's hash member comes before the members that sort after it."""
    return text.find(b'"hash":"' + claimed.encode() + b'",')


def text_hash_matches(text: bytes, at: int, claimed: str, prev: str) -> bool:
    """True if `text` without its hash member (at `at`, `hash_member`) hashes, after `prev`, to `claimed`:
    the hash rule read off a canonical text, with no re-serialisation."""
    if at < 0:
        return False
    end = at + len(claimed) + 10  # '"hash":"' + claimed + '",'
    h = hashlib.sha256(prev.encode())
    h.update(b"\n")
    h.update(text[:at])
    h.update(text[end:])
    return h.hexdigest() == claimed


def hash_matches(event: Mapping[str, Any], text: str | None = None) -> bool:
    """True if `event`'s hash matches its content and `prev_hash`.

    With the exact `text` the event was read from, a canonical event is checked on its text (no
    re-serialisation); anything else (no text, non-canonical text) falls back to recomputing the
    canonical form, so the answer never depends on how the producer spaced its JSON.
    """
    expected, prev = event.get("hash"), event.get("prev_hash")
    if not isinstance(expected, str) or not isinstance(prev, str):
        return False
    # The fast path only for text without `\u` escapes: canonical text has none (bar control
    # characters), and an escaped lone surrogate must not pass as encodable (see `decode_event`).
    if text is not None and "\\u" not in text and _HEX64.fullmatch(expected):
        try:
            encoded = text.encode()
        except UnicodeEncodeError:
            return False
        if text_hash_matches(encoded, hash_member(encoded, expected), expected, prev):
            return True
    try:
        return bool(expected == content_hash(prev, event))
    except (TypeError, ValueError, RecursionError):
        return False


@dataclass(frozen=True)
class Fault:
    """Where and how a run's chain breaks."""

    kind: ChainFault
    seq: Any
    event_type: Any
    detail: str

    def __str__(self) -> str:
        return f"seq {self.seq} ({self.event_type}): {self.detail}"


class RunCursor:
    """One run's chain, followed event by event in `seq` order (see the module doc)."""

    __slots__ = ("closed_at", "last_hash", "last_seq", "last_type", "outcome", "position")

    def __init__(self) -> None:
        self.position = 0  # events seen
        self.last_hash = GENESIS_HASH
        self.closed_at = -1  # position of its run_closed, -1 before it
        self.outcome = False  # an outcome followed the close
        self.last_seq: Any = None
        self.last_type: Any = None

    @property
    def closed(self) -> bool:
        return self.closed_at != -1

    def step(
        self,
        seq: Any,
        event_type: Any,
        prev_hash: Any,
        hash_: Any,
        event_count: Any = None,
        close_last_hash: Any = None,
    ) -> list[Fault]:
        """Take the run's next event (`event_count` and `close_last_hash`: a `run_closed`'s); its faults."""
        position = self.position
        faults: list[Fault] = []
        if seq != position or isinstance(seq, bool):
            kind = "repeated" if isinstance(seq, int) and seq < position else "gap in"
            faults.append(Fault("seq_gap", seq, event_type, f"{kind} seq: expected seq {position}, got {seq}"))
        if prev_hash != self.last_hash:
            faults.append(Fault("broken_link", seq, event_type, "prev_hash does not link to the previous event"))
        if self.closed:
            if position != self.closed_at + 1 or event_type not in TAIL_EVENT_TYPES or self.outcome:
                faults.append(Fault("event_after_close", seq, event_type, "event after run_closed"))
            self.outcome = True
        elif event_type == "run_closed":
            self.closed_at = position
            count_ok = event_count == position + 1 and not isinstance(event_count, bool)
            if not count_ok or close_last_hash != prev_hash:
                faults.append(
                    Fault("close_mismatch", seq, event_type, "closing count or last hash does not match the run")
                )
        self.position = position + 1
        self.last_hash = hash_
        self.last_seq, self.last_type = seq, event_type
        return faults

    def end(self) -> Fault | None:
        """The fault of a run that ends here without its `run_closed` (None if it closed)."""
        if self.closed:
            return None
        return Fault("unclosed_run", self.last_seq, self.last_type, "no run_closed event (truncated)")

    def take(self, event: Mapping[str, Any]) -> list[Fault]:
        """`step` for a decoded event (a mapping)."""
        return self.step(
            event.get("seq"),
            event.get("event_type"),
            event.get("prev_hash"),
            event.get("hash"),
            event.get("event_count"),
            event.get("last_hash"),
        )


def _body(event: Any) -> Mapping[str, Any]:
    if isinstance(event, Mapping):
        return event
    dumped: Mapping[str, Any] = event.model_dump(mode="json")
    return dumped


def verify_run(events: Iterable[Any], *, require_closed: bool = True) -> None:
    """Check one run's chain -- every hash, every link, the numbering and the close -- in the order given.

    `events` are event models or decoded events (mappings). Raises `ChainError` naming the first bad event.
    """
    ordered = [_body(e) for e in events]
    if not ordered:
        raise ChainError("run has no events")
    run_id = ordered[0].get("run_id")
    cursor = RunCursor()
    for event in ordered:
        where = f"run {run_id} seq {event.get('seq')} ({event.get('event_type', '?')})"
        if event.get("run_id") != run_id:
            raise ChainError(f"{where}: belongs to run {event.get('run_id')}")
        faults = cursor.take(event)
        for fault in faults:
            if fault.kind in ("seq_gap", "broken_link"):
                raise ChainError(f"{where}: {fault.detail}")
        if not hash_matches(event):
            raise ChainError(f"{where}: hash does not match its content")
        if faults:
            raise ChainError(f"{where}: {faults[0].detail}")
    unclosed = cursor.end()
    if require_closed and unclosed is not None:
        raise ChainError(f"run {run_id}: {unclosed.detail}")


def message_problem(
    events: Sequence[Mapping[str, Any]], after: tuple[int, str] | None = None
) -> tuple[Literal["broken_chain", "incomplete_run"], str] | None:
    """Why one transport message is not a whole run or one outcome of a closed run (None if it is one):
    ``broken_chain`` (numbering, links, close) or ``incomplete_run`` (its shape). `after` is, for an
    outcome, the (seq, hash) of its run's `run_closed`. Each event's own hash is checked by the caller
    (`hash_matches`), on the text it read."""
    if not events:
        return "incomplete_run", "a message carries at least one event"
    types = [e.get("event_type") for e in events]
    if types[0] in TAIL_EVENT_TYPES:
        if len(events) != 1:
            return "incomplete_run", "a tail message carries exactly one outcome event"
        if after is not None:
            tail = events[0]
            if tail.get("seq") != after[0] + 1 or tail.get("prev_hash") != after[1]:
                return "broken_chain", "the outcome does not link to its run's close"
        return None
    cursor = RunCursor()
    for event in events:
        faults = cursor.take(event)
        if faults:
            if faults[0].kind == "event_after_close":
                return "incomplete_run", str(faults[0])
            return "broken_chain", str(faults[0])
    if types[-1] != "run_closed" or "run_closed" in types[:-1]:
        return "incomplete_run", "a run message ends with its single run_closed event (truncated?)"
    if types[0] != "run_started" or "run_started" in types[1:]:
        return "incomplete_run", "a run message starts with its single run_started event"
    if any(t in TAIL_EVENT_TYPES for t in types):
        return "incomplete_run", "an outcome travels in its own message, after its run"
    return None
