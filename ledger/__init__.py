"""Tamper evidence for the archive: a chain of signed digests over it, and ``verify``.

In the manner of CloudTrail log-file validation: ``digest`` signs (Ed25519) a digest over each span of
newly archived events of each Kafka partition, listing every event's hash and linked to the digest
before it; ``verify`` checks every run's own hash chain, the digests' signatures and links, and every
archived event against the digest that covers it, and reports the first bad event. An untouched
archive always verifies; a byte edited, an event deleted, inserted, moved, or the archive truncated,
is found and located.

    python -m ledger keygen ledger.key                  # once: ledger.key and ledger.key.pub
    python -m ledger digest projections.duckdb --key ledger.key [--final]
    python -m ledger verify projections.duckdb --public-key ledger.key.pub [--require-full-coverage]

Modules: `ledger.keys` (keys), `ledger.digest` (what a digest is: pure), `ledger.chains` (run chains:
pure), `ledger.columns` (Arrow), `ledger.store` (DuckDB, and the digest operation), `ledger.verify`
(the checks and the report: ``ledger.verify.verify(db_path, public_keys)``), `ledger.cli` (the command).
The package does not re-export the function `verify`, which would hide the module of that name.
"""

from typing import TYPE_CHECKING, Any

from ledger.digest import ArchivedEvent, DigestBody, StoredDigest, row_hash
from ledger.errors import (
    ArchiveCorruptError,
    KeyExistsError,
    KeyFormatError,
    KeyMissingError,
    LedgerDatabaseError,
    LedgerError,
    LedgerKeyError,
    LedgerRefusedError,
)
from ledger.keys import SigningKey, VerifyKey, generate_key, load_signing_key, load_verify_key

if TYPE_CHECKING:
    from ledger.store import DEFAULT_SPAN_EVENTS, DigestResult, StreamDigest, digest_archive, digest_file
    from ledger.verify import Anchor, Finding, VerifyReport, parse_anchor, verify_connection

#: Names imported on first use: they bring DuckDB and Arrow, which the pure modules (`ledger.digest`,
#: `ledger.chains`, `ledger.keys`) and whoever imports only them do without.
_LAZY = {
    "DEFAULT_SPAN_EVENTS": "ledger.store",
    "DigestResult": "ledger.store",
    "StreamDigest": "ledger.store",
    "digest_archive": "ledger.store",
    "digest_file": "ledger.store",
    "Anchor": "ledger.verify",
    "Finding": "ledger.verify",
    "VerifyReport": "ledger.verify",
    "parse_anchor": "ledger.verify",
    "verify_connection": "ledger.verify",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ledger' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT_SPAN_EVENTS",
    "Anchor",
    "ArchiveCorruptError",
    "ArchivedEvent",
    "DigestBody",
    "DigestResult",
    "Finding",
    "KeyExistsError",
    "KeyFormatError",
    "KeyMissingError",
    "LedgerDatabaseError",
    "LedgerError",
    "LedgerKeyError",
    "LedgerRefusedError",
    "SigningKey",
    "StoredDigest",
    "StreamDigest",
    "VerifyKey",
    "VerifyReport",
    "digest_archive",
    "digest_file",
    "generate_key",
    "load_signing_key",
    "load_verify_key",
    "parse_anchor",
    "row_hash",
    "verify_connection",
]
