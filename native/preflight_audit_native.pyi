"""The projector's compiled check of events already in canonical form and of their chain hashes."""

MAX_DEPTH: int

def canonical_texts(message: bytes) -> list[bytes] | None:
    """The text of each event in `message` (a JSON array) if every one is already in canonical form, its
    event_id spells a UUID and its hash (64 lower-case hex digits) matches; else None: the caller judges
    the message itself."""
