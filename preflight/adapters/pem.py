"""Reading PEM key files for signed decisions (`preflight.signing`): the file I/O of the signing keys.

`DecisionSigner.from_pem_file` and `DecisionVerifier.from_pem_files` call these; the signing module
itself only turns PEM bytes into keys.
"""

from __future__ import annotations

from pathlib import Path

from preflight.errors import SigningKeyError

__all__ = ["read_private_key_file", "read_public_key_files"]


def read_private_key_file(path: str | Path) -> bytes:
    """The bytes of a PEM private key file.

    :raises SigningKeyError: the file cannot be read.
    """
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"the private key file could not be read: {exc}") from exc


def read_public_key_files(*paths: str | Path) -> tuple[bytes, ...]:
    """The bytes of each PEM public key file.

    :raises SigningKeyError: a file cannot be read.
    """
    pems = []
    for path in paths:
        try:
            pems.append(Path(path).read_bytes())
        except OSError as exc:
            raise SigningKeyError(f"a public key file could not be read: {exc}") from exc
    return tuple(pems)
