"""The projector's compiled check of events already in canonical form and of their chain hashes."""

from typing import Any

MAX_DEPTH: int
ARCHIVE_FIELDS: list[str]

_Buffers = tuple[bytes | None, bytes, bytes]

class ArchiveColumns:
    """The archive's columns of a chunk of messages, built while their events are checked."""

    @property
    def rows(self) -> int: ...
    def truncate(self, rows: int) -> None:
        """Keep the first `rows` rows only (a message refused after its rows were appended)."""
    def push(self, values: list[Any], text: bytes, index: int) -> None:
        """Append one verified event's row: `values` in `ARCHIVE_FIELDS` order (a string column takes any
        other value as NULL; event_id is lower-cased), its canonical text, its index in its message."""
    def finish(self) -> tuple[list[_Buffers], list[bytes], _Buffers, bytes]:
        """Arrow buffers: (validity or None, 32-bit offsets, data) per string field, little-endian int32
        values per integer field, the texts' buffers, the indexes' values."""

def canonical_texts(message: bytes, columns: ArchiveColumns | None = None) -> list[bytes] | None:
    """The text of each event in `message` (a JSON array) if every one is already in canonical form, its
    event_id spells a UUID and its hash (64 lower-case hex digits) matches; else None: the caller judges
    the message itself. With `columns`, the events' archive rows are appended to them (none where a value
    cannot be read as its column wants it: the caller then pushes them)."""
