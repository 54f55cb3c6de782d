"""The keys `serve`, `demo`, `erase`, `digest` and `verify` use, and the glue to `preflight.protect` and
`ledger` (which do the work: nothing here seals, signs or verifies by itself).

* the decision signing key (Ed25519, PKCS#8 PEM) and its public key ``<key>.pub``, created on first
  use when the settings name none (`decision_key`);
* the key store of the per-user value keys (`key_store`, `erase_user`);
* the ledger's digest key (`ledger_signing_key`, `ledger_verify_keys`) and the ledger's two operations
  (`digest_database`, `verify_database`).

Private keys are written mode 0600, never printed, never put in an error message.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.keys import (
    SigningKey,
    VerifyKey,
    generate_key,
    load_verify_key,
    signing_key_from,
    verify_keys_from,
)
from ledger.store import DigestResult, digest_file
from ledger.verify import VerifyReport, verify
from preflight.adapters.keystore import FileKeyStore
from preflight.protect import Erasure, ValueProtector, erase, subject_handle
from preflight.signing import DecisionSigner
from preflight_audit.errors import AuditCliError, ConfigurationError
from preflight_audit.settings import Settings

__all__ = [
    "DecisionKey",
    "UnknownUserError",
    "decision_key",
    "digest_database",
    "erase_user",
    "key_store",
    "ledger_signing_key",
    "ledger_verify_keys",
    "protector",
    "settings_decision_key",
    "verify_database",
]


class UnknownUserError(AuditCliError):
    """The key store holds no key of this user, and never erased one: nothing was sealed for them with
    this key store. Check the user id and ``PREFLIGHT_KEY_DIR`` (``--settings``)."""


@dataclass(frozen=True)
class DecisionKey:
    """The decision signing key: its private PEM (for engines' `DecisionSigner`) and its public key file
    (for the fold worker's ``decision_public_keys``)."""

    private_pem: bytes
    public_path: Path
    key_id: str
    created: bool

    def signer(self, **options: Any) -> DecisionSigner:
        return DecisionSigner.from_pem(self.private_pem, **options)


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def decision_key(path: Path, *, create: bool) -> DecisionKey:
    """The decision key at `path`, created there (with ``<path>.pub``) when absent and `create`; the
    public key file is (re)written from the private key when it is missing.

    :raises ConfigurationError: the key is absent and not to be created, or unreadable.
    """
    public = path.with_name(path.name + ".pub")
    created = False
    if not path.exists():
        if not create:
            raise ConfigurationError(f"no decision signing key at {path} (PREFLIGHT_DECISION_KEY): create it or unset")
        _write_private(path, DecisionSigner.generate().private_pem())
        created = True
    try:
        signer = DecisionSigner.from_pem_file(path)
    except Exception as exc:  # SigningKeyError, or what cryptography raises for a foreign key
        raise ConfigurationError(f"the decision signing key {path} cannot be used: {type(exc).__name__}") from None
    if not public.exists():
        public.write_bytes(signer.public_pem())
    return DecisionKey(signer.private_pem(), public, signer.key_id, created)


def settings_decision_key(settings: Settings) -> DecisionKey:
    """The deployment's decision key: the one ``PREFLIGHT_DECISION_KEY`` names (which must exist), else
    ``<data_dir>/decision.key``, created on first use."""
    return decision_key(settings.decision_key_path, create=settings.decision_key is None)


def key_store(directory: Path) -> FileKeyStore:
    """The key store in `directory` (created mode 0700 if absent)."""
    return FileKeyStore(directory)


def protector(directory: Path) -> ValueProtector:
    """A protector over the key store in `directory`: seals and opens values."""
    return ValueProtector(FileKeyStore(directory))


def erase_user(directory: Path, user: str) -> tuple[Erasure, bool]:
    """Erase `user`'s keys in the key store at `directory` (`preflight.protect.erase`); returns what was
    erased and whether the user had been erased before (then nothing is left to destroy).

    :raises UnknownUserError: the store has no key of `user` and never had one erased (it is left as it
        was: no directory, no marker is created for an unknown user).
    """
    handle = subject_handle(user)
    known = directory.is_dir() and any((directory / f"{handle}{suffix}").exists() for suffix in (".key", ".erased"))
    if not known:
        raise UnknownUserError(
            f"no key of user {user!r} in {directory}: nothing was sealed for this user with this key store"
            " (check the user id and PREFLIGHT_KEY_DIR)"
        )
    before = (directory / f"{handle}.erased").exists()
    result = erase(FileKeyStore(directory), user)
    return result, before and not result.erased_kids


# ---- the ledger -------------------------------------------------------------------------------------------


def ledger_signing_key(settings: Settings, path: Path | None = None, *, create_at: Path | None = None) -> SigningKey:
    """The ledger's private digest key: `path`, else ``ledger_key_file``, else the key itself
    (``ledger_key``); with `create_at`, a key created there (``python -m ledger keygen``) when none is
    configured and none exists there yet."""
    chosen = path or settings.ledger_key_file
    inline = settings.ledger_key.get_secret_value() if settings.ledger_key is not None else None
    if chosen is None and create_at is not None:
        if not create_at.exists():
            create_at.parent.mkdir(parents=True, exist_ok=True)
            return generate_key(create_at)
        chosen = create_at
    return signing_key_from(chosen, inline)


def ledger_verify_keys(settings: Settings, given: Sequence[Path] = ()) -> list[VerifyKey]:
    """The ledger's public keys: `given`, else ``ledger_public_key_file`` (os.pathsep-separated), else
    ``<ledger_key_file>.pub``, else ``<data_dir>/ledger.key.pub`` when it exists, else the key itself
    (``ledger_public_key``)."""
    if given:
        return [load_verify_key(p) for p in given]
    if settings.ledger_public_key_file:
        return [load_verify_key(p) for p in settings.ledger_public_key_file.split(os.pathsep) if p.strip()]
    for private in (settings.ledger_key_file, settings.data_dir / "ledger.key"):
        if private is not None:
            public = private.with_name(private.name + ".pub")
            if public.is_file() or private == settings.ledger_key_file:
                return [load_verify_key(public)]
    return verify_keys_from((), None, settings.ledger_public_key)


def digest_database(database: Path, key: SigningKey, *, final: bool = True) -> DigestResult:
    """Extend the signed digest chain over the archive in `database` (`ledger.store.digest_file`)."""
    return digest_file(database, key, final=final)


def verify_database(database: Path, keys: Sequence[VerifyKey], *, require_complete: bool = False) -> VerifyReport:
    """Every run's chain and the signed digests over the archive in `database` (`ledger.verify.verify`)."""
    return verify(database, keys, require_full_coverage=require_complete)
