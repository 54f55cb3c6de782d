"""The intent fingerprint: a digest of the trusted text of an instruction, normalised.

Identity only ("the same utterance"), never meaning: NFKC, lower case, and every whitespace,
punctuation and symbol character removed before hashing, so "Send it!" and "send   it" agree.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Sequence

from preflight.inputs import Segment

_DROPPED_CATEGORIES = ("P", "S", "Z")


def _dropped(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch).startswith(_DROPPED_CATEGORIES)


#: The ASCII characters `normalise` drops, as bytes for `bytes.translate`: ASCII text, the common case, is
#: then normalised in one call instead of a look-up per character (and a third of `str.translate`'s time
#: with a table, which looks each character up in a dict; bench/README.md, engine).
_ASCII_DROPPED = bytes(code for code in range(128) if _dropped(chr(code)))


def normalise(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).lower()
    if folded.isascii():
        return folded.encode("ascii").translate(None, _ASCII_DROPPED).decode("ascii")
    return "".join(
        ch for ch in folded if not ch.isspace() and not unicodedata.category(ch).startswith(_DROPPED_CATEGORIES)
    )


def intent_fingerprint(instruction: Sequence[Segment] | str) -> str:
    """`sha256:<hex>` over the normalised trusted segments (a plain string has none)."""
    trusted = [] if isinstance(instruction, str) else [s.text for s in instruction if s.trust == "user"]
    return trusted_fingerprint(trusted)


def trusted_fingerprint(trusted: Sequence[str]) -> str:
    """`intent_fingerprint` of the trusted segments' texts `trusted`, in order (the run's start reads them in its
    own walk of the segments: `preflight.engine.started_summary`)."""
    # One segment (the usual instruction) is its own join; more are joined from `map`, not a comprehension (no
    # frame of its own).
    joined = normalise(trusted[0]) if len(trusted) == 1 else "\x00".join(map(normalise, trusted))
    return "sha256:" + hashlib.sha256(joined.encode("utf-8", "surrogatepass")).hexdigest()
