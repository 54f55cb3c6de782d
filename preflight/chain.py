"""The run-chain rule (SPEC §3, tamper evidence), defined once: the engine, the fold, the projector and the
ledger's `verify` all apply it from here.

**The hash.** An event's `hash` is the lower-case hex SHA-256 of its `prev_hash`, a newline, and the
canonical JSON of every member but `hash`. From event schema version 3 that form is RFC 8785 (JSON
Canonicalization Scheme, `jcs`): keys sorted by UTF-16 code units, no whitespace, UTF-8, numbers as
ECMAScript writes them, no NaN -- so a verifier in any language with a JCS library recomputes it.
Versions 1 and 2 were hashed over `canonical_json` (Python's `json.dumps` with sorted keys: keys by code
point, floats as `repr`, integers of any size; still the form of the arguments and result digests and of
the other signed or sealed texts) and still verify by it; `event_canonical_json` picks the form by the
event's `schema_version`. The two forms spell every string, every integer and every key below U+E000
the same (`spelled_alike`). `content_hash` computes it; `hash_matches` checks a decoded event, on the exact text it was
read from when that text is canonical (no re-serialisation), else by computing it. The compiled check of
the projector (`native/`) is an optional accelerator of `hash_matches` over canonical texts, held to it by
property tests (`tests/unit/test_native_decode.py`).

**The chain.** A run's events, in `seq` order, are numbered 0, 1, ... (`seq_gap`); each links to the one
before by its `prev_hash` (the first to 64 zeros; `broken_link`); one `run_closed` states the run's event
count and its own `prev_hash` as the last hash (`close_mismatch`); after it comes at most one outcome,
`executed`, `execution_failed` or `effect_unknown`, and after an `effect_unknown` at most its
`effect_read_back` (`event_after_close`); a run without a `run_closed` is truncated
(`unclosed_run`). `RunCursor` follows one run event by event and names each fault where the chain breaks;
everything else is built on it: `verify_run` (raises `ChainError` at the first fault, hashes included) and
`message_problem` (the transport's rule for one Kafka message: a whole run, `run_started` to `run_closed`,
or one outcome continuing its closed run).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from preflight.errors import ChainError

_native_jcs: Callable[[Any], bytes | None] | None
try:  # the compiled writer of `native/`, where it is built (see `jcs`)
    from preflight_audit_native import jcs as _native_jcs
except ImportError:  # pragma: no cover - a machine without the Rust toolchain
    _native_jcs = None
_native_jcs_sealed: Callable[[dict[str, Any], str], tuple[str, bytes] | None] | None
try:  # ... and its one-pass seal of an event (`preflight.events.sealed`)
    from preflight_audit_native import jcs_sealed as _native_jcs_sealed
except ImportError:  # pragma: no cover - a machine without the Rust toolchain, or an older build
    _native_jcs_sealed = None
_native_jcs_digest: Callable[[Any], str | None] | None
try:  # ... and its one-pass digest (`preflight.events.digest`)
    from preflight_audit_native import jcs_digest as _native_jcs_digest
except ImportError:  # pragma: no cover - a machine without the Rust toolchain, or an older build
    _native_jcs_digest = None
_native_plain: Callable[..., bool | None] | None
try:  # ... and its walk of `plain_json` (~0.2 us where `_plain` takes ~1-2 on a record's part; bench/README.md)
    from preflight_audit_native import plain_json as _native_plain
except ImportError:  # pragma: no cover - a machine without the Rust toolchain, or an older build
    _native_plain = None

__all__ = [
    "GENESIS_HASH",
    "LEGACY_HASH_VERSIONS",
    "OUTCOME_EVENT_TYPES",
    "READ_BACK_EVENT_TYPE",
    "TAIL_EVENT_TYPES",
    "ChainFault",
    "Fault",
    "RunCursor",
    "canonical_json",
    "content_hash",
    "es_number",
    "event_canonical_json",
    "hash_matches",
    "jcs",
    "message_problem",
    "plain_json",
    "spelled_alike",
    "verify_run",
]

GENESIS_HASH = "0" * 64
#: What may follow a run's close: one outcome ...
OUTCOME_EVENT_TYPES = frozenset({"executed", "execution_failed", "effect_unknown"})
#: ... and, after an `effect_unknown` outcome only, the read-back that settles it.
READ_BACK_EVENT_TYPE = "effect_read_back"
TAIL_EVENT_TYPES = OUTCOME_EVENT_TYPES | {READ_BACK_EVENT_TYPE}

ChainFault = Literal["seq_gap", "broken_link", "close_mismatch", "event_after_close", "unclosed_run"]


#: Event schema versions hashed over `canonical_json`; every later one is hashed over RFC 8785.
LEGACY_HASH_VERSIONS = frozenset({1, 2})


def canonical_json(data: Any, *, plain: bool = False) -> bytes:
    """The form events of versions 1 and 2 were hashed over (and digests and signed texts are taken over):
    sorted keys (by code point), no spaces, UTF-8, no NaN, floats as Python's `repr`, integers of any size.

    orjson writes the same bytes for strings, booleans, null and 64-bit integers (keys by code point, the
    same escapes) about ten times faster than the standard library (bench/README.md, engine); anything
    else (`_plain`) is written by `json.dumps`. The compiled writer of `native/` (see `jcs`) writes the same
    bytes again where they hold no character from U+E000 up: then every key sorts alike by code point and
    by UTF-16, and the two forms escape and write strings and 64-bit integers alike.

    With `plain`, the caller vouches that `data` is plain JSON (`plain_json`, as its writer knew it): orjson's
    bytes are written at once, without the compiled writer's walk or `_plain`'s."""
    if not plain and _native_jcs is not None:
        out = _native_jcs(data)
        if out is not None and (out.isascii() or _HIGH_BYTES.search(out) is None):
            return out
    if plain or plain_json(data):
        try:
            return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # a lone surrogate: json.dumps below names it as before
            pass
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


_INT64 = 2**63 - 1
#: UTF-8 lead bytes of the characters from U+E000 up: where key order by code point and by UTF-16 code
#: unit can differ (between U+E000-U+FFFF and U+10000 up).
_HIGH_BYTES = re.compile(rb"[\xee-\xf4]")


def _plain(data: Any, limit: int, *, keys_checked: bool = False) -> bool:
    """True if `data` holds only dicts with str keys, lists, str, bool, None and ints within +-`limit`:
    values both canonical forms and orjson spell alike (exact types: a subclass is not plain). With
    `keys_checked`, each dict's keys must also sort alike by code point and by UTF-16 (`_orders_agree`)."""
    stack = [data]
    pop, push = stack.pop, stack.append
    while stack:
        value = pop()
        kind = type(value)
        if kind is str or value is None or kind is bool:
            continue
        if kind is dict:
            for key, item in value.items():
                if type(key) is not str:
                    return False
                push(item)
            if keys_checked and not _orders_agree(value):
                return False
        elif kind is list:
            stack.extend(value)
        elif kind is int:
            if not -limit <= value <= limit:
                return False
        else:
            return False
    return True


def _plain_within(data: Any, max_depth: int) -> bool:
    """`_plain(data, _INT64)` and nested no deeper than `max_depth` (the top level is depth 0). The depth is
    walked first, so that a value holding itself ends too."""
    stack = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            return False
        kind = type(value)
        if kind is dict or kind is list:
            stack.extend((item, depth + 1) for item in (value.values() if kind is dict else value))
    return _plain(data, _INT64)


def plain_json(data: Any, max_depth: int | None = None) -> bool:
    """True if `data` is made only of str-keyed dicts, lists, str, bool, None and 64-bit ints (exact types):
    values every JSON writer here (the two canonical forms, orjson, json) spells alike; with `max_depth`, also
    nested no deeper than it (the top level is depth 0).

    Walked by the compiled walk of `native/` where it is built (~0.1-0.3 us on a record's part where `_plain`
    takes ~1-2; bench/README.md, engine, fourteenth pass; a test holds the two alike), and without `max_depth`
    where `data` nests no deeper than 128; else by `_plain` or `_plain_within`."""
    if _native_plain is not None:
        answer = _native_plain(data, max_depth)
        if answer is not None:
            return answer
    if max_depth is None:
        return _plain(data, _INT64)
    return _plain_within(data, max_depth)


def jcs(data: Any) -> bytes:
    """The RFC 8785 (JCS) bytes of `data` (JSON values: dict with str keys, list, str, int, float, bool,
    None). Raises ValueError for NaN, infinities and lone surrogates, TypeError for anything that is not
    JSON. One extension: an integer beyond +-(2**53 - 1), which RFC 8785 (I-JSON) leaves out, is written
    in full, as `canonical_json` writes it -- an event holding one verifies with a parser that keeps big
    integers (Python's, Go's json.Number, JavaScript's JSON.parse with a reviver), not with plain doubles.

    Three writers, one result (tests hold each to the `rfc8785` package and to each other):

    - the compiled writer of `native/` (`preflight_audit_native.jcs`), where it is installed: it writes
      dicts with str keys, lists, str, 64-bit int, bool and None of their exact types, keys sorted by
      UTF-16 code units, and answers None for anything else;
    - orjson's sorted bytes, for `_plain` data whose keys `_orders_agree`: orjson escapes strings as
      ECMAScript does and writes 64-bit integers in full; it sorts keys by code point, which is RFC 8785's
      UTF-16 order for every pair of keys but one whose first differing characters are one from
      U+E000-U+FFFF and one from U+10000 up (the latter's surrogates sort below U+E000);
    - the exact writer (`_jcs`) for the rest: floats, larger integers, tuples, subclasses, such keys."""
    if _native_jcs is not None:
        out = _native_jcs(data)
        if out is not None:
            return out
    if _plain(data, _INT64, keys_checked=True):
        try:
            return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # a lone surrogate: the exact writer names it
            pass
    parts: list[str] = []
    _jcs(data, parts)
    return "".join(parts).encode()


def _orders_agree(keys: Iterable[str]) -> bool:
    """True if sorting `keys` (one object's) by code point gives RFC 8785's order, by UTF-16 code units:
    unless some key holds a character from U+10000 up and some key one from U+E000-U+FFFF, every pair of
    keys compares alike both ways (see `jcs`). A sufficient test, exact for keys below U+E000."""
    supplementary = bmp_high = False
    for key in keys:
        if key.isascii():
            continue
        top = max(map(ord, key))
        if top >= 0x10000:
            supplementary = True
            bmp_high = bmp_high or any(0xE000 <= ord(c) <= 0xFFFF for c in key)
        elif top >= 0xE000:
            bmp_high = True
        if supplementary and bmp_high:
            return False
    return True


def _jcs(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(int(value)))  # beyond +-(2**53 - 1) in full: see `jcs`
    elif isinstance(value, float):
        out.append(es_number(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))  # escapes exactly as ECMAScript's JSON.stringify
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _jcs(item, out)
        out.append("]")
    elif isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"keys must be str, not {type(key).__name__}")
        out.append("{")
        for i, key in enumerate(sorted(value, key=lambda k: k.encode("utf-16-be", "surrogatepass"))):
            if i:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _jcs(value[key], out)
        out.append("}")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON")


def es_number(value: float) -> str:
    """`value` as ECMAScript's Number.prototype.toString writes it (RFC 8785 section 3.2.2.3): the shortest
    digits that read back as `value` (Python's `repr` finds the same), placed by ECMAScript's rules."""
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{value} is not a JSON number")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + (int(exponent) if exponent else 0)  # value = 0.<digits> * 10**point
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        text = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + text


#: A float, as a whole token of canonical (space-free) JSON.
_BYTES_FLOAT = re.compile(rb"[:,\[]-?\d+[.eE][-+\d.eE]*[,\]}]")


def spelled_alike(text: bytes, *, floats_refused: bool = False) -> bool:
    """True if UTF-8 canonical JSON `text` holds nothing that `canonical_json` and `jcs` spell or order
    apart: no character from U+E000 up, no float (unless the caller refuses floats already:
    `floats_refused`); such text inside a string only answers False. A check that sorts keys by code point
    is then exact for event version 3 too."""
    if not text.isascii() and _HIGH_BYTES.search(text) is not None:
        return False
    return floats_refused or _BYTES_FLOAT.search(text) is None


def event_canonical_json(body: Mapping[str, Any]) -> bytes:
    """The canonical form an event of `body`'s `schema_version` is hashed and written in: RFC 8785 from
    version 3 on, `canonical_json` for versions 1 and 2."""
    version = body.get("schema_version")
    if type(version) is int and version in LEGACY_HASH_VERSIONS:
        return canonical_json(body)
    return jcs(body)


def content_hash(prev_hash: str, body: Mapping[str, Any]) -> str:
    """The chain hash of an event whose fields other than `hash` are `body` (its form by `schema_version`)."""
    h = hashlib.sha256()
    h.update(prev_hash.encode())
    h.update(b"\n")
    h.update(event_canonical_json({k: v for k, v in body.items() if k != "hash"}))
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
            read_back = (
                event_type == READ_BACK_EVENT_TYPE
                and position == self.closed_at + 2
                and self.last_type == "effect_unknown"
            )
            first = position == self.closed_at + 1 and event_type in OUTCOME_EVENT_TYPES and not self.outcome
            if not (first or read_back):
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
