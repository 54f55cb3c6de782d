"""The ledger's exceptions: one root, `LedgerError`, and a subclass per area.

Tampering is not an exception: `ledger.verify` returns a `VerifyReport` whose findings say what is
wrong and where. Exceptions are for faults an operator must fix before anything can be checked or
signed -- a key that is missing or unreadable, a database that cannot be opened, a ledger the
`digest` operation refuses to extend. Each says whether retrying can help (`transient`) and, in its
docstring, what to do.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Root of every error the ledger raises on purpose."""

    #: True when the same call may succeed later without anybody changing anything.
    transient: bool = False


class LedgerKeyError(LedgerError):
    """A key could not be found, read or written."""


class KeyMissingError(LedgerKeyError):
    """No signing or verifying key was configured.

    To sign digests, create a key once with ``python -m ledger keygen PATH`` (it writes the private
    key to PATH, readable by its owner only, and the public key to PATH.pub), then pass
    ``--key PATH`` or set ``PREFLIGHT_LEDGER_KEY_FILE=PATH``. To verify, pass the public key with
    ``--public-key PATH.pub`` or set ``PREFLIGHT_LEDGER_PUBLIC_KEY_FILE``. Keep the private key
    away from the database: whoever holds it can re-sign a forged archive.
    """


class KeyFormatError(LedgerKeyError):
    """A key file or value could not be read as an Ed25519 key of the expected kind.

    Accepted forms: PEM (PKCS#8 private key, SubjectPublicKeyInfo public key, unencrypted), the raw
    32 key bytes, or those 32 bytes as hex or base64 text. A verifier takes the public key
    (PATH.pub from ``keygen``, or ``python -m ledger pubkey --key PATH``), never the private one.
    """


class KeyExistsError(LedgerKeyError):
    """``keygen`` was asked to write a key where a file already exists.

    A key is never overwritten: digests signed by the old key could no longer be verified by anyone
    who trusts only the new one. Pick another path, or move the old key away deliberately.
    """


class LedgerDatabaseError(LedgerError):
    """The projection database could not be opened or read.

    Check the path, that the file is a projection database (the projector or
    ``projections.open_database`` creates it), and that no other process holds it open for writing:
    DuckDB lets one process write a file at a time, so stop the projector (or run ``digest`` inside
    it) before signing, and verify a copy or a stopped database.
    """

    transient = True


class ArchiveCorruptError(LedgerError):
    """DuckDB found the database file damaged (a block's checksum does not match its bytes).

    An untouched file never does this: its bytes were changed outside DuckDB -- tampered with, or
    corrupted by the disk. ``verify`` reports it as a finding (exit 1), ``digest`` refuses to sign.
    Restore the file from a backup and verify the backup; keep the damaged copy as evidence.
    """


class LedgerRefusedError(LedgerError):
    """``digest`` refused to extend the ledger: what it would sign or build on does not hold.

    Either the newest digest does not verify (its signature, its link, or a key this signer does not
    know), or archived events it would cover fail their run's chain checks. Nothing was signed:
    run ``python -m ledger verify`` to see the first bad event and investigate before signing more.
    """
