"""The projector's compiled check of events already in canonical form and of their chain hashes."""

MAX_DEPTH: int

def canonical_texts(message: bytes) -> list[bytes] | None:
    """The text of each event in `message` (a JSON array) if every one is already in canonical form and
    its chain hash matches; else None: the caller judges the message itself."""

STRING_FIELDS: list[str]
INTEGER_FIELDS: list[str]

_Buffers = tuple[bytes | None, bytes, bytes]

def archive_buffers(texts: list[bytes]) -> tuple[list[_Buffers], list[bytes], _Buffers] | None:
    """The archive's columns of verified events (canonical JSON texts) as Arrow buffers: (validity or None,
    32-bit offsets, UTF-8 data) per `STRING_FIELDS` field (`event_id` lower-cased), little-endian int32
    values per `INTEGER_FIELDS` field, and the texts' own buffers; None for anything else in them (the
    caller builds the columns itself)."""
