"""The projector's compiled check of events already in canonical form and of their chain hashes."""

from typing import Any

MAX_DEPTH: int
ARCHIVE_FIELDS: list[str]

_Buffers = tuple[bytes | None, bytes, bytes]

class ArchiveColumns:
    """The archive's columns of a chunk of messages, built while their events are checked. Each event's
    text is an Arrow string view: into its message's value (data buffer `message`) when
    `canonical_texts` appended it, else into the pushed texts (data buffer `messages`)."""

    def __init__(self, messages: int) -> None:
        """The columns of a chunk of `messages` messages."""
    @property
    def rows(self) -> int: ...
    @property
    def message(self) -> int:
        """The position in the chunk of the message whose rows `canonical_texts` appends next."""
    @message.setter
    def message(self, message: int) -> None: ...
    def truncate(self, rows: int) -> None:
        """Keep the first `rows` rows only (a message refused after its rows were appended)."""
    def push(self, values: list[Any], text: bytes, index: int) -> None:
        """Append one verified event's row: `values` in `ARCHIVE_FIELDS` order (a string column takes any
        other value as NULL; event_id is lower-cased), its canonical text, its index in its message."""
    def finish(self) -> tuple[list[_Buffers], list[bytes], tuple[bytes, bytes], bytes]:
        """Arrow buffers: (validity or None, 32-bit offsets, data) per string field, little-endian int32
        values per integer field, (the texts' 16-byte views, the pushed texts), the indexes' values."""

def canonical_texts(message: bytes, columns: ArchiveColumns | None = None) -> list[bytes] | None:
    """The text of each event in `message` (a JSON array) if every one is already in canonical form, its
    event_id spells a UUID and its hash (64 lower-case hex digits) matches; else None: the caller judges
    the message itself. With `columns`, the events' archive rows are appended to them (none where a value
    cannot be read as its column wants it: the caller then pushes them)."""

def jcs(value: Any) -> bytes | None:
    """The RFC 8785 bytes of `value` if it is made only of dicts with str keys, lists, str, 64-bit int, bool
    and None (exact types, nested at most 128 deep); else None: the caller writes it exactly."""

def jcs_sealed(fields: dict[str, Any], prev: str) -> tuple[str, bytes] | None:
    """An event sealed in one pass: given its members `fields` (holding a `hash` member, whose value is
    ignored) and the hash `prev` of the event before it, its chain hash (hex SHA-256 of `prev`, a newline
    and the RFC 8785 bytes of the members but `hash`) and its RFC 8785 bytes with that hash. None where
    `jcs` would not vouch for the members, there is no `hash` member or no member sorts after it."""

def jcs_digest(value: Any) -> str | None:
    """``sha256:`` and the hex SHA-256 of `value`'s RFC 8785 bytes, where `jcs` vouches for them and they hold no
    character from U+E000 up (then they are `preflight.chain.canonical_json`'s bytes); else None: the caller
    digests it itself."""

def plain_json(value: Any, max_depth: int | None = None) -> bool | None:
    """Whether `value` is made only of dicts with str keys, lists, str, bool, None and ints within
    +-(2**63 - 1), of their exact types (`preflight.chain.plain_json`); with `max_depth`, also nested no
    deeper than it (the top level is depth 0). Without, None where it nests deeper than 128: the caller walks
    it."""
