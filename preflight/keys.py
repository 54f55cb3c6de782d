"""Per-subject keys (`preflight.protect`): a key's id and secret, and how a key store names a subject.

Pure: the key stores themselves live in `preflight.adapters.keystore` (files) and `preflight.testing`
(memory), behind the `preflight.ports.KeyStore` port.
"""

from __future__ import annotations

import hashlib
import re

from preflight.errors import ProtectionError, UnknownKey

__all__ = ["KEY_BYTES", "SubjectKey", "make_kid", "parse_kid", "subject_handle"]

_KID = re.compile(r"([0-9a-f]{32})\.([1-9][0-9]{0,9})")
KEY_BYTES = 32
_KEY_BYTES = KEY_BYTES


class SubjectKey:
    """One generation of one subject's key: its id and 32 secret bytes. `wipe()` zeroes the secret.

    Key stores hand out copies: a caller wipes its copy when done without touching the store's.
    """

    __slots__ = ("_secret", "kid")

    def __init__(self, kid: str, secret: bytes | bytearray | memoryview) -> None:
        if _KID.fullmatch(kid) is None:
            raise ValueError("a key id is '<32 hex digits>.<generation>'")
        if len(secret) != _KEY_BYTES:
            raise ValueError(f"a subject key is {_KEY_BYTES} bytes")
        self.kid = kid
        self._secret = bytearray(secret)

    @property
    def secret(self) -> bytearray:
        if not any(self._secret):
            raise ProtectionError(f"key {self.kid} was wiped")
        return self._secret

    def wipe(self) -> None:
        for i in range(len(self._secret)):
            self._secret[i] = 0

    def __repr__(self) -> str:
        return f"SubjectKey({self.kid!r}, secret=<{_KEY_BYTES} bytes>)"


def subject_handle(subject: str | None) -> str:
    """The name a key store gives a subject: 32 hex digits of a SHA-256 of its user id (None: runs
    without a user id share the subject "anonymous"). It keeps raw user ids (often e-mail addresses)
    out of file names and key ids; it is not a secret, as every event carries its user id in clear."""
    raw = b"anonymous" if subject is None else b"user\x00" + subject.encode("utf-8", "surrogatepass")
    return hashlib.sha256(b"preflight-audit/subject/v1\x00" + raw).hexdigest()[:32]


def make_kid(handle: str, generation: int) -> str:
    return f"{handle}.{generation}"


def parse_kid(kid: str) -> tuple[str, int]:
    """(subject handle, generation) of a key id; `UnknownKey` for anything that is not one."""
    match = _KID.fullmatch(kid) if isinstance(kid, str) else None
    if match is None:
        raise UnknownKey(f"not a key id: {kid!r:.80}")
    return match.group(1), int(match.group(2))
