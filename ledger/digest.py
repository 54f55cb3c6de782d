"""Signed digests over the archive: what each one covers, how it is hashed, signed and chained (pure).

In the manner of CloudTrail log-file validation. The archive is read as one stream per Kafka
partition, ``(topic, partition)``, in log order: by ``(offset, message_index)`` -- a message carries a
whole run, so one offset holds several events. A **digest** covers a span of consecutive archived
events of one stream and is the signed statement "these events, exactly, were archived here":

- the span's rows are hashed column by column (`rows_hash`, `RowsHasher`): every archive column but
  ``ingested_at`` (the projector's clock at write time, which states nothing about the event) --
  position, envelope columns, and the event text, bound through its verified chain hash -- so that
  a verifier hashes whole columns straight from Arrow buffers, with no hashing work per event
  beyond the chain check it does anyway; a byte changed, an event moved, added or dropped anywhere
  in the span changes ``rows_hash`` or fails that event's chain hash;
- each event also becomes an **entry**: its position, its ``event_id`` and its **row hash**, the
  SHA-256 of an unambiguous encoding of the same row (`row_encoding`); the entries are packed
  (`ENTRY`, 60 bytes each) and stored with the digest, like the per-file hashes a CloudTrail digest
  lists, and ``span_hash`` is the SHA-256 of that packed list. They are read only when a span's
  ``rows_hash`` does not match: then they locate the bad event exactly (this event changed, this one
  is missing, this one is in no digest) instead of "somewhere in these 10,000";
- the body -- ``digest_seq`` (0, 1, ... per stream), the stream, the first and last position, the
  event count, ``rows_hash``, ``span_hash``, ``prev_digest_hash`` (the SHA-256 of the previous
  digest's body; 64 zeros for the first), ``created_at`` and the signer's ``key_id`` -- is canonical
  JSON (`preflight.events.canonical_json`), signed with Ed25519; its SHA-256 is the digest's hash.

The chain of digests makes the deletion, insertion, reordering or replacement of whole digests
detectable (a gap in ``digest_seq``, a broken link); spans are contiguous (digest N+1 starts at the
first event after digest N's last), so an event between two digests was inserted; the last digest
anchors the end: the archive must hold every event its entries list. Events after it are "not yet
covered" -- not tampered, but not protected either, until the next ``digest`` run; a verifier may
demand full coverage, or pin the newest digest it knows of (an anchor) to detect the truncation of
the digest chain itself.

This module decides; `ledger.store` reads and writes DuckDB and `ledger.verify` compares.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import struct
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ledger.keys import SigningKey, VerifyKey
from preflight.events import canonical_json

__all__ = [
    "ARCHIVE_COLUMNS",
    "ENTRY",
    "FORMAT",
    "GENESIS_DIGEST_HASH",
    "ROW_COLUMNS",
    "ArchivedEvent",
    "AuthenticDigest",
    "ChainCheck",
    "DigestBody",
    "DigestProblem",
    "Position",
    "RowsHasher",
    "StoredDigest",
    "authenticate",
    "check_chain",
    "encode_int",
    "encode_text",
    "hash_member",
    "new_digest",
    "pack_entry",
    "row_encoding",
    "row_hash",
    "rows_hash",
]

FORMAT: Final = "preflight-audit.ledger.digest/1"
GENESIS_DIGEST_HASH: Final = "0" * 64
#: One entry: offset (int64), message_index (int32), event_id (16 UUID bytes), row hash (32 bytes), big-endian.
ENTRY: Final = struct.Struct(">qi16s32s")

#: Bytes, or a view of an Arrow buffer.
Buffer = bytes | memoryview
#: Where an event sits in its stream: (offset, message_index).
Position = tuple[int, int]


# ---- one archived event -------------------------------------------------------------------------------


def hash_member(claimed: str) -> bytes:
    """The top-level ``"hash":"<claimed>",`` member of a canonical event text, as bytes."""
    return b'"hash":"' + claimed.encode() + b'",'


@dataclass(frozen=True, slots=True)
class ArchivedEvent:
    """One ``archive`` row as the ledger hashes it: ``occurred_at`` as microseconds since the epoch,
    the event as its exact stored bytes."""

    offset: int
    message_index: int
    event_id: str
    run_id: str
    seq: int
    event_type: str
    schema_version: int
    action_key: str | None
    user_id: str | None
    agent_id: str | None
    occurred_at_us: int | None
    hash: str
    prev_hash: str
    event: bytes

    @property
    def position(self) -> Position:
        return (self.offset, self.message_index)

    @property
    def hash_at(self) -> int:
        """Byte offset of the text's first `hash_member` (-1: none), as the chain check finds it."""
        return self.event.find(hash_member(self.hash))

    @property
    def event_bytes(self) -> int:
        return len(self.event)


def encode_text(value: str | bytes | None) -> bytes:
    """A text field: ``<byte length>:<UTF-8 bytes>``, or ``~`` for NULL. Self-delimiting."""
    if value is None:
        return b"~"
    data = value.encode("utf-8") if isinstance(value, str) else value
    return b"%d:%s" % (len(data), data)


def encode_int(value: int | None) -> bytes:
    """An integer field: ``<decimal>;``, or ``~`` for NULL. Self-delimiting."""
    return b"~" if value is None else b"%d;" % value


#: The archive columns, in order, and their kind ("int" or "text"): what a row hash covers.
ARCHIVE_COLUMNS: Final = (
    ("offset", "int"),
    ("message_index", "int"),
    ("event_id", "text"),
    ("run_id", "text"),
    ("seq", "int"),
    ("event_type", "text"),
    ("schema_version", "int"),
    ("action_key", "text"),
    ("user_id", "text"),
    ("agent_id", "text"),
    ("occurred_at_us", "int"),
    ("hash", "text"),
    ("prev_hash", "text"),
    ("event", "text"),
)


def row_encoding(row: ArchivedEvent) -> bytes:
    """The bytes a row hash covers: every `ARCHIVE_COLUMNS` field, self-delimited, in that order."""
    return b"".join(
        (
            encode_int(row.offset),
            encode_int(row.message_index),
            encode_text(row.event_id),
            encode_text(row.run_id),
            encode_int(row.seq),
            encode_text(row.event_type),
            encode_int(row.schema_version),
            encode_text(row.action_key),
            encode_text(row.user_id),
            encode_text(row.agent_id),
            encode_int(row.occurred_at_us),
            encode_text(row.hash),
            encode_text(row.prev_hash),
            encode_text(row.event),
        )
    )


def row_hash(row: ArchivedEvent) -> bytes:
    """SHA-256 of `row_encoding` (32 bytes): the row hash an entry holds."""
    return hashlib.sha256(row_encoding(row)).digest()


#: The columns a span's ``rows_hash`` covers, in order: every archive column but the event text,
#: which is bound instead by where its hash member sits and how long it is (see `RowsHasher`).
ROW_COLUMNS: Final = (
    *ARCHIVE_COLUMNS[:-1],
    ("hash_at", "int"),
    ("event_bytes", "int"),
)
_ROWS_FORMAT: Final = b"preflight-audit.ledger.rows/1\n"


class RowsHasher:
    """``rows_hash`` of a span, fed column by column in chunks of rows (any chunking, same result).

    Per column of `ROW_COLUMNS`, three streams are hashed: its NULLs (one byte per row, 1 for NULL),
    its values as little-endian int64 (an integer column's value, a text column's UTF-8 byte length;
    0 for NULL), and, for a text column, its non-NULL values' bytes back to back. ``rows_hash`` is
    the SHA-256 of a format tag, the row count (8 bytes, big-endian) and the stream digests in column
    order. The lengths make the bytes unambiguous; chunk boundaries change nothing.

    The event text itself is not hashed again: ``hash_at`` (the byte offset of its top-level hash
    member) and ``event_bytes`` (its length) are, beside the ``hash`` and ``prev_hash`` columns. For an
    event whose chain hash verifies -- SHA-256(prev_hash, newline, the text without that member) equal
    to ``hash``, which `ledger.chains` checks for every event anyway -- those determine the text byte
    for byte: the text without the member is fixed by its SHA-256, and the member and its place by
    ``hash`` and ``hash_at``. So a matching ``rows_hash`` and a verified chain hash together prove the
    event's exact stored bytes, at the cost of hashing ~250 bytes per event instead of ~1,000; an
    event whose chain hash does not verify is a finding on its own, and sends the span to the
    event-by-event comparison with the entries, whose row hashes cover the text itself.
    """

    __slots__ = ("_count", "_streams")

    def __init__(self) -> None:
        self._streams = [(hashlib.sha256(), hashlib.sha256(), hashlib.sha256()) for _ in ROW_COLUMNS]
        self._count = 0

    def add_rows(self, count: int) -> None:
        self._count += count

    def update(self, column: int, nulls: Buffer, values: Buffer, data: Buffer) -> None:
        """Feed column number `column` (index in `ROW_COLUMNS`) for the next rows."""
        null_stream, value_stream, data_stream = self._streams[column]
        null_stream.update(nulls)
        value_stream.update(values)
        data_stream.update(data)

    def hexdigest(self) -> str:
        h = hashlib.sha256(_ROWS_FORMAT)
        h.update(self._count.to_bytes(8, "big"))
        for streams in self._streams:
            for stream in streams:
                h.update(stream.digest())
        return h.hexdigest()


def rows_hash(rows: Sequence[ArchivedEvent]) -> str:
    """``rows_hash`` of `rows` (in position order), computed row by row: the reference that the Arrow
    implementation (`ledger.columns.feed`) must equal."""
    hasher = RowsHasher()
    hasher.add_rows(len(rows))
    for number, (name, kind) in enumerate(ROW_COLUMNS):
        values = [getattr(row, name) for row in rows]
        nulls = bytes(1 if v is None else 0 for v in values)
        if kind == "int":
            packed = struct.pack(f"<{len(values)}q", *(0 if v is None else v for v in values))
            hasher.update(number, nulls, packed, b"")
        else:
            encoded = [b"" if v is None else v.encode("utf-8") for v in values]
            lengths = struct.pack(f"<{len(values)}q", *(len(e) for e in encoded))
            hasher.update(number, nulls, lengths, b"".join(encoded))
    return hasher.hexdigest()


def pack_entry(offset: int, message_index: int, event_id: str, hashed: bytes) -> bytes:
    """One packed entry (`ENTRY`)."""
    return ENTRY.pack(offset, message_index, uuid.UUID(event_id).bytes, hashed)


# ---- the digest ------------------------------------------------------------------------------------------


class MalformedDigest(ValueError):
    """A stored digest body is not one this code signs (internal: `check_chain` makes it a problem)."""


_BODY_FIELDS: Final = {
    "format": str,
    "topic": str,
    "partition": int,
    "digest_seq": int,
    "first_offset": int,
    "first_index": int,
    "last_offset": int,
    "last_index": int,
    "event_count": int,
    "rows_hash": str,
    "span_hash": str,
    "prev_digest_hash": str,
    "created_at": str,
    "key_id": str,
}


@dataclass(frozen=True, slots=True)
class DigestBody:
    """What a digest states (and its signature covers)."""

    topic: str
    partition: int
    digest_seq: int
    first_offset: int
    first_index: int
    last_offset: int
    last_index: int
    event_count: int
    rows_hash: str
    span_hash: str
    prev_digest_hash: str
    created_at: str
    key_id: str
    format: str = FORMAT

    @property
    def first(self) -> Position:
        return (self.first_offset, self.first_index)

    @property
    def last(self) -> Position:
        return (self.last_offset, self.last_index)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _BODY_FIELDS}

    def canonical(self) -> bytes:
        """The signed bytes: canonical JSON of the body."""
        return canonical_json(self.to_json())

    @property
    def digest_hash(self) -> str:
        """SHA-256 hex of the signed bytes: what the next digest's ``prev_digest_hash`` names."""
        return hashlib.sha256(self.canonical()).hexdigest()

    @classmethod
    def parse(cls, text: str) -> DigestBody:
        """The body stored as `text`, which must be exactly its canonical JSON. :raises MalformedDigest:"""
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise MalformedDigest(f"body is not JSON: {exc}") from exc
        if not isinstance(raw, dict) or set(raw) != set(_BODY_FIELDS):
            raise MalformedDigest("body does not have exactly the digest fields")
        for name, kind in _BODY_FIELDS.items():
            value = raw[name]
            if type(value) is not kind:
                raise MalformedDigest(f"body field {name} is not a{'n int' if kind is int else ' string'}")
        if raw["format"] != FORMAT:
            raise MalformedDigest(f"unknown digest format {raw['format']!r:.80}")
        body = cls(**raw)
        if body.canonical().decode("utf-8") != text:
            raise MalformedDigest("body is not in canonical form (it was rewritten)")
        return body


@dataclass(frozen=True, slots=True)
class StoredDigest:
    """A ``ledger_digests`` row: the stream and number it is filed under, body, signature, entries."""

    topic: str
    partition: int
    digest_seq: int
    body: str
    signature: str
    entries: bytes


def new_digest(
    *,
    topic: str,
    partition: int,
    digest_seq: int,
    entries: bytes,
    rows_hash: str,
    prev_digest_hash: str,
    created_at: str,
    key: SigningKey,
) -> StoredDigest:
    """Sign a digest over a span: its `entries` (packed, in position order, at least one) and the
    `rows_hash` of the same rows."""
    if not entries or len(entries) % ENTRY.size:
        raise ValueError("a digest covers a whole number of entries, at least one")
    first_offset, first_index, _, _ = ENTRY.unpack_from(entries, 0)
    last_offset, last_index, _, _ = ENTRY.unpack_from(entries, len(entries) - ENTRY.size)
    body = DigestBody(
        topic=topic,
        partition=partition,
        digest_seq=digest_seq,
        first_offset=first_offset,
        first_index=first_index,
        last_offset=last_offset,
        last_index=last_index,
        event_count=len(entries) // ENTRY.size,
        rows_hash=rows_hash,
        span_hash=hashlib.sha256(entries).hexdigest(),
        prev_digest_hash=prev_digest_hash,
        created_at=created_at,
        key_id=key.key_id,
    )
    signed = body.canonical()
    signature = base64.b64encode(key.sign(signed)).decode("ascii")
    return StoredDigest(topic, partition, digest_seq, signed.decode("utf-8"), signature, entries)


# ---- checking a stream's digests -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DigestProblem:
    """A digest that does not verify, or a break in the chain of digests.

    `position` is where in the stream the problem starts (the digest's first event, or just after the
    last good digest), for ordering it among event findings.
    """

    kind: str  # "digest_invalid": the digest itself does not verify; "digest_chain": the chain is broken
    digest_seq: int | None
    position: Position
    detail: str


@dataclass(frozen=True, slots=True)
class AuthenticDigest:
    """A digest whose signature, body and entries verify: its entries may be trusted."""

    body: DigestBody
    entries: bytes

    def unpacked(self) -> list[tuple[int, int, bytes, bytes]]:
        return list(ENTRY.iter_unpack(self.entries))


@dataclass(slots=True)
class ChainCheck:
    """One stream's digests, checked.

    `authentic` are the digests to compare the archive against, in order. Events in `unverifiable`
    ranges (``(after, up_to)``: after one position, up to and including another, None for "no
    bound") lie where a digest is missing or does not verify: they are not compared one by one, the
    problem is reported once. `covered_to` is the last position any digest claims.
    """

    authentic: list[AuthenticDigest] = field(default_factory=list)
    problems: list[DigestProblem] = field(default_factory=list)
    unverifiable: list[tuple[Position | None, Position | None]] = field(default_factory=list)
    covered_to: Position | None = None
    head: DigestBody | None = None

    def is_unverifiable(self, position: Position) -> bool:
        return any(
            (after is None or position > after) and (up_to is None or position <= up_to)
            for after, up_to in self.unverifiable
        )


def authenticate(row: StoredDigest, keys: Mapping[str, VerifyKey]) -> tuple[DigestBody | None, str | None]:
    """The row's body (None if unreadable) and what is wrong with the digest (None if it verifies): its
    body, the stream and number it is filed under, its key, its signature, and its entries."""
    try:
        body = DigestBody.parse(row.body)
    except MalformedDigest as exc:
        return None, str(exc)
    if (body.topic, body.partition, body.digest_seq) != (row.topic, row.partition, row.digest_seq):
        return body, "filed under another stream or number than its body states"
    key = keys.get(body.key_id)
    if key is None:
        return body, f"signed by key {body.key_id}, which the verifier was not given"
    try:
        signature = base64.b64decode(row.signature, validate=True)
    except (binascii.Error, ValueError):
        return body, "signature is not base64"
    if base64.b64encode(signature).decode("ascii") != row.signature:
        # Base64's last character carries unused bits: an edit there decodes to the same signature.
        # Only the one canonical text of a signature is accepted, so every edit of the row is seen.
        return body, "signature is not in canonical base64"
    if not key.verify(signature, row.body.encode("utf-8")):
        return body, "signature does not verify"
    if hashlib.sha256(row.entries).hexdigest() != body.span_hash:
        return body, "its entries do not hash to its span_hash (the entry list was altered)"
    if len(row.entries) != body.event_count * ENTRY.size or body.event_count < 1:
        return body, "its entries are not event_count entries"
    first, last = (
        ENTRY.unpack_from(row.entries, 0)[:2],
        ENTRY.unpack_from(row.entries, len(row.entries) - ENTRY.size)[:2],
    )
    if first != body.first or last != body.last:
        return body, "its entries do not start and end where its body says"
    return body, None


def _after(position: Position) -> Position:
    return (position[0], position[1] + 1)


def check_chain(rows: Sequence[StoredDigest], keys: Iterable[VerifyKey] | Mapping[str, VerifyKey]) -> ChainCheck:
    """Check one stream's digests (`rows` in ``digest_seq`` order): each one's body, key, signature and
    entries (`authenticate`), then the chain -- numbers 0, 1, ... without gaps, each linked to the one
    before, each span after the previous one.

    A problem is placed where it starts in the stream: a digest that does not verify at its first
    event, digests missing just after the last good digest. Events between the last good digest before
    a problem and the next good one after it are `unverifiable`.
    """
    by_id = dict(keys) if isinstance(keys, Mapping) else {k.key_id: k for k in keys}
    check = ChainCheck()
    expected_seq = 0
    prev_hash = GENESIS_DIGEST_HASH  # the hash of the previous row's body, as stored
    prev_last: Position | None = None  # the last position of the previous authentic digest
    gap_after: Position | None = None
    in_gap = False
    for row in rows:
        body, problem = authenticate(row, by_id)
        start = _after(prev_last) if prev_last is not None else (0, 0)
        # a digest that does not verify is placed by the chain, not by what its untrusted body claims
        here = body.first if body is not None and problem is None else start
        problems: list[tuple[str, Position, str]] = []
        if row.digest_seq > expected_seq:
            missing = (
                str(expected_seq) if row.digest_seq == expected_seq + 1 else f"{expected_seq}..{row.digest_seq - 1}"
            )
            problems.append(
                ("digest_chain", start, f"digest(s) {missing} missing before it (deleted, or the chain cut)")
            )
        elif row.digest_seq < expected_seq:
            problems.append(("digest_chain", here, f"numbered {row.digest_seq} where {expected_seq} was expected"))
        if problem is not None:
            problems.append(("digest_invalid", here, problem))
        elif body is not None:
            if body.prev_digest_hash != prev_hash:
                problems.append(("digest_chain", here, "does not link to the digest before it (prev_digest_hash)"))
            if prev_last is not None and body.first <= prev_last:
                problems.append(("digest_chain", here, "its span overlaps the digest before it"))
        if body is not None:
            check.covered_to = body.last if check.covered_to is None else max(check.covered_to, body.last)
        check.problems.extend(DigestProblem(kind, row.digest_seq, at, detail) for kind, at, detail in problems)
        if problems and not in_gap:
            gap_after, in_gap = prev_last, True
        if problem is None and body is not None:
            if in_gap:  # from the last good digest to the start of this one, nothing can be compared
                check.unverifiable.append((gap_after, _before(body.first)))
                in_gap = False
            check.authentic.append(AuthenticDigest(body, row.entries))
            prev_last = body.last
            check.head = body
        prev_hash = hashlib.sha256(row.body.encode("utf-8")).hexdigest()
        expected_seq = max(expected_seq, row.digest_seq + 1)
    if in_gap:
        check.unverifiable.append((gap_after, check.covered_to if check.covered_to != prev_last else None))
    return check


def _before(position: Position) -> Position:
    """The greatest position before `position` that an ``(after, up_to]`` range can name."""
    offset, index = position
    return (offset, index - 1) if index > 0 else (offset - 1, 2**31 - 1)
