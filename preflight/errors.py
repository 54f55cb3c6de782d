"""The package's exceptions: one root, a subclass per area.

A denial (ask, hold, refusal to execute) is a decision value, never an exception. Exceptions are for
programming and operating faults: a preflight built without its hooks, an event log that cannot be
written, an event that cannot be decoded. Each docstring says what an operator should do.
"""

from __future__ import annotations


class PreflightError(Exception):
    """Root of every error this package raises on purpose."""


class ConstructionError(PreflightError, ValueError):
    """`create_preflight` was given hooks or ports it cannot work with.

    Fix the wiring: supply every required hook as a callable, spell hook names as the specification
    does, pass a storage with `persist` and `load`, and with `strict=True` supply the three hooks
    whose defaults verify nothing.
    """


class RecordingError(PreflightError):
    """A run's record or events could not be made durable.

    No record, no execution: the caller must treat the run as not decided. Check that the event log
    (broker) and the storage are reachable, then run the preflight again. When the tool was already
    called, `outcome` holds what happened: it must be reconciled by hand, never retried blindly.
    """

    def __init__(self, message: str, outcome: object | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome


class OutcomeNotRecorded(RecordingError):
    """A call's outcome, recorded after its answer (a read's, `Preflight.execute_if_ready` with
    ``await_outcome=False``), could not be made durable even after retries: the tool was called (`outcome`
    says how it ended) and its run stays open in the log, never counted executed. Check the event log
    (broker); the call is never retried for it.
    """


class EventDecodeError(PreflightError, ValueError):
    """Bytes or a mapping could not be read as a preflight event of a supported type and version.

    The event is not applied; route it to the dead-letter topic with this message as the reason.
    """


class ChainError(PreflightError):
    """A run's events do not form an intact hash chain (missing, altered or reordered event)."""


class SigningKeyError(PreflightError, ValueError):
    """A decision-signing or verification key could not be loaded or used.

    Supply an Ed25519 key: a PKCS#8 PEM private key for the signer, SubjectPublicKeyInfo PEM public keys
    for verifiers (with the right password if the private key is encrypted), and install the
    `cryptography` package (the `crypto` extra).
    """


class ProtectionError(PreflightError):
    """A protected value could not be sealed or opened."""


class KeyStoreError(ProtectionError):
    """The key store cannot be read or written, so no value of this subject can be sealed or opened.

    Nothing was decided or recorded. Check that the key directory exists, belongs to this process's
    user, is mode 0700 and its key files 0600, and that the disk is writable; then run again.
    """


class ValueErased(ProtectionError):
    """The subject's key was erased (crypto-shredding): this value can never be opened again.

    Expected after ``preflight-audit erase``, not an integrity fault. Its token still compares with other
    tokens sealed under the same key.
    """


class UnknownKey(ProtectionError):
    """No key of this id was ever issued by this key store.

    Terminal until fixed: the value was sealed with another key store (check the key directory the
    process is configured with) or the store's files were lost or restored from an older copy.
    """


class TamperedValue(ProtectionError):
    """A sealed value does not open under its key, run and slot: it was altered, moved to another slot
    or run, or is not a sealed value at all. An integrity fault: keep the event and investigate."""


class EffectUnknownError(PreflightError):
    """A tool call ended without an answer that says what it did: it timed out (`cause` ``timeout``) or its
    connection closed first (``connection_closed``). It may have acted: `execute_if_ready` records
    ``effect_unknown`` (never ``failed``), and the action key holds until a read-back settles it
    (`Preflight.settle_effect`). Raised by the adapter that makes the call (`preflight.adapters.mcp`)."""

    def __init__(self, message: str, cause: str = "timeout") -> None:
        super().__init__(message)
        self.cause = cause if cause in ("timeout", "connection_closed") else "timeout"


def effect_unknown_cause(error: BaseException | None) -> str | None:
    """``timeout`` or ``connection_closed`` when `error` leaves a call's effect unknown, else None."""
    if isinstance(error, EffectUnknownError):
        return error.cause
    if isinstance(error, TimeoutError):
        return "timeout"
    return None
