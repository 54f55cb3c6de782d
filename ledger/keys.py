"""Ed25519 keys for the ledger: generate once, load the private key to sign, the public key to verify.

A digest is signed with the operator's private key; anyone holding the public key can verify the
archive, and nobody without the private key can re-sign a forged one. The private key therefore
belongs with whoever runs ``digest`` (the projector's host, a secrets store), never next to the
database, and the public key with whoever audits it.

Forms read (either kind): PEM -- PKCS#8 ``PRIVATE KEY`` or SubjectPublicKeyInfo ``PUBLIC KEY``,
unencrypted -- or the raw 32 key bytes, or those 32 bytes as hex or base64 text. ``generate_key``
writes PEM: the private key readable by its owner only, the public key beside it as ``PATH.pub``.

Every digest names the key that signed it by `key_id` (``ed25519:`` + the first 16 hex digits of
the SHA-256 of the raw public key), so a verifier given several public keys (a rotation) picks the
right one, and a digest signed by a key it was not given is a finding, not a guess.

Where the command line finds keys (`signing_key_from_config`, `verify_keys_from_config`): an
explicit path first, then ``PREFLIGHT_LEDGER_KEY_FILE`` / ``PREFLIGHT_LEDGER_PUBLIC_KEY_FILE`` (a
path; several public keys separated by the platform's path separator), then ``PREFLIGHT_LEDGER_KEY``
/ ``PREFLIGHT_LEDGER_PUBLIC_KEY`` (the key itself, PEM or hex/base64) -- the settings ``ledger_key_file``,
``ledger_public_key_file``, ``ledger_key`` and ``ledger_public_key`` of the deployment's one settings model
(`preflight_settings`), which reads the variables. `signing_key_from` and `verify_keys_from` take
those values as arguments; the library API takes key objects and reads no environment.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ledger.errors import KeyExistsError, KeyFormatError, KeyMissingError
from preflight_settings import env_var, given_settings

__all__ = [
    "KEY_ENV",
    "KEY_FILE_ENV",
    "PUBLIC_KEY_ENV",
    "PUBLIC_KEY_FILE_ENV",
    "SigningKey",
    "VerifyKey",
    "generate_key",
    "key_id_of",
    "load_signing_key",
    "load_verify_key",
    "signing_key_from",
    "signing_key_from_bytes",
    "signing_key_from_config",
    "verify_key_from_bytes",
    "verify_keys_from",
    "verify_keys_from_config",
]

KEY_FILE_ENV = env_var("ledger_key_file")
KEY_ENV = env_var("ledger_key")
PUBLIC_KEY_FILE_ENV = env_var("ledger_public_key_file")
PUBLIC_KEY_ENV = env_var("ledger_public_key")
_RAW_SIZE = 32


def key_id_of(public_raw: bytes) -> str:
    """The id digests carry for the key whose raw public bytes are `public_raw`."""
    return "ed25519:" + hashlib.sha256(public_raw).hexdigest()[:16]


@dataclass(frozen=True)
class VerifyKey:
    """A public key that checks digest signatures."""

    public: Ed25519PublicKey

    @property
    def key_id(self) -> str:
        return key_id_of(self.public.public_bytes_raw())

    def verify(self, signature: bytes, data: bytes) -> bool:
        """True if `signature` is this key's signature over `data`."""
        try:
            self.public.verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def pem(self) -> bytes:
        """The public key as PEM (SubjectPublicKeyInfo), what verifiers are given."""
        return self.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True)
class SigningKey:
    """A private key that signs digests."""

    private: Ed25519PrivateKey

    @property
    def verify_key(self) -> VerifyKey:
        return VerifyKey(self.private.public_key())

    @property
    def key_id(self) -> str:
        return self.verify_key.key_id

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)

    def pem(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())


def generate_key(path: str | Path) -> SigningKey:
    """Create a new key: the private key at `path` (mode 0600), the public key at `path` + ``.pub``.

    :raises KeyExistsError: either file exists already (nothing is overwritten).
    """
    path = Path(path)
    public_path = path.with_name(path.name + ".pub")
    for target in (path, public_path):
        if target.exists():
            raise KeyExistsError(f"{target} exists: a key is never overwritten; pick another path")
    key = SigningKey.generate()
    _write_new(path, key.pem(), 0o600)
    _write_new(public_path, key.verify_key.pem(), 0o644)
    return key


def _write_new(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError as exc:
        raise KeyExistsError(f"{path} exists: a key is never overwritten; pick another path") from exc
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise KeyMissingError(
            f"no {what} at {path}: create one with `python -m ledger keygen PATH` (the public key is PATH.pub)"
        ) from exc
    except OSError as exc:
        raise KeyFormatError(f"cannot read the {what} at {path}: {exc}") from exc


def _raw_bytes(data: bytes) -> bytes | None:
    """The 32 key bytes if `data` is them, or their hex or base64 text; else None."""
    if len(data) == _RAW_SIZE:
        return data
    text = data.strip()
    if len(text) == 2 * _RAW_SIZE:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return decoded if len(decoded) == _RAW_SIZE else None


def signing_key_from_bytes(data: bytes, source: str = "the key") -> SigningKey:
    """Read a private key (PEM PKCS#8, raw, hex or base64). :raises KeyFormatError: anything else."""
    stripped = data.strip()
    if stripped.startswith(b"-----BEGIN"):
        if b"PUBLIC KEY-----" in stripped.split(b"\n", 1)[0]:
            raise KeyFormatError(f"{source} is a public key: signing needs the private key (the file without .pub)")
        try:
            key = serialization.load_pem_private_key(stripped, password=None)
        except TypeError as exc:
            raise KeyFormatError(f"{source} is encrypted: give the ledger an unencrypted PKCS#8 key") from exc
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise KeyFormatError(f"{source} is not a readable PEM private key: {exc}") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFormatError(f"{source} is a {type(key).__name__}, not an Ed25519 key")
        return SigningKey(key)
    raw = _raw_bytes(data)
    if raw is None:
        raise KeyFormatError(f"{source} is neither PEM nor 32 raw key bytes (or their hex or base64)")
    return SigningKey(Ed25519PrivateKey.from_private_bytes(raw))


def verify_key_from_bytes(data: bytes, source: str = "the key") -> VerifyKey:
    """Read a public key (PEM SubjectPublicKeyInfo, raw, hex or base64). :raises KeyFormatError: else."""
    stripped = data.strip()
    if stripped.startswith(b"-----BEGIN"):
        if b"PRIVATE KEY-----" in stripped.split(b"\n", 1)[0]:
            raise KeyFormatError(
                f"{source} is a private key: give verifiers the public key (PATH.pub, or `python -m ledger pubkey`)"
            )
        try:
            key = serialization.load_pem_public_key(stripped)
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise KeyFormatError(f"{source} is not a readable PEM public key: {exc}") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise KeyFormatError(f"{source} is a {type(key).__name__}, not an Ed25519 key")
        return VerifyKey(key)
    raw = _raw_bytes(data)
    if raw is None:
        raise KeyFormatError(f"{source} is neither PEM nor 32 raw key bytes (or their hex or base64)")
    try:
        return VerifyKey(Ed25519PublicKey.from_public_bytes(raw))
    except ValueError as exc:
        raise KeyFormatError(f"{source} is not an Ed25519 public key: {exc}") from exc


def load_signing_key(path: str | Path) -> SigningKey:
    """The private key in the file at `path`."""
    return signing_key_from_bytes(_read(path, "signing key"), str(path))


def load_verify_key(path: str | Path) -> VerifyKey:
    """The public key in the file at `path`."""
    return verify_key_from_bytes(_read(path, "public key"), str(path))


def signing_key_from(path: str | Path | None, key: str | None = None) -> SigningKey:
    """The signing key: the file at `path`, else `key` itself (the setting ``ledger_key``).

    :raises KeyMissingError: neither is given. :raises KeyFormatError: the one given is unreadable.
    """
    if path is not None:
        return load_signing_key(path)
    if key:
        return signing_key_from_bytes(key.encode(), f"${KEY_ENV}")
    raise KeyMissingError(
        f"no signing key: pass --key PATH or set {KEY_FILE_ENV}; create one with `python -m ledger keygen PATH`"
    )


def verify_keys_from(
    paths: Iterable[str | Path], key_files: str | None = None, key: str | None = None
) -> list[VerifyKey]:
    """The public keys: the files at `paths`, else those `key_files` lists (path-separated: the setting
    ``ledger_public_key_file``), else `key` itself (the setting ``ledger_public_key``).

    :raises KeyMissingError: none given. :raises KeyFormatError: one found is unreadable.
    """
    given = list(paths)
    if given:
        return [load_verify_key(p) for p in given]
    if key_files:
        return [load_verify_key(p) for p in key_files.split(os.pathsep) if p]
    if key:
        return [verify_key_from_bytes(key.encode(), f"${PUBLIC_KEY_ENV}")]
    raise KeyMissingError(
        f"no public key to verify with: pass --public-key PATH.pub or set {PUBLIC_KEY_FILE_ENV}"
        " (the .pub file `python -m ledger keygen` wrote beside the private key)"
    )


def signing_key_from_config(path: str | Path | None, environ: Mapping[str, str] | None = None) -> SigningKey:
    """The signing key: `path`, else ``$PREFLIGHT_LEDGER_KEY_FILE``, else ``$PREFLIGHT_LEDGER_KEY``, as
    `environ` (default: the process environment) sets them.

    :raises KeyMissingError: none of them is set. :raises KeyFormatError: the one found is unreadable.
    """
    if path is not None:
        return load_signing_key(path)
    given = given_settings(environ, "ledger_key_file", "ledger_key")
    secret = given.get("ledger_key")
    return signing_key_from(given.get("ledger_key_file"), secret.get_secret_value() if secret is not None else None)


def verify_keys_from_config(paths: Iterable[str | Path], environ: Mapping[str, str] | None = None) -> list[VerifyKey]:
    """The public keys: `paths`, else ``$PREFLIGHT_LEDGER_PUBLIC_KEY_FILE`` (path-separated list), else
    ``$PREFLIGHT_LEDGER_PUBLIC_KEY``, as `environ` (default: the process environment) sets them.

    :raises KeyMissingError: none given. :raises KeyFormatError: one found is unreadable.
    """
    given = list(paths)
    if given:
        return verify_keys_from(given)
    settings = given_settings(environ, "ledger_public_key_file", "ledger_public_key")
    return verify_keys_from((), settings.get("ledger_public_key_file"), settings.get("ledger_public_key"))
