"""The command line's exceptions: one root, a subclass per way a command fails, each with its exit code.

The CLI turns every one of them -- and the named errors of the packages it drives, translated by
`translate` -- into one line on stderr and the exit code, never a traceback. Exit codes: 1 an
operating failure (broker, worker, database), 2 a usage or configuration error, 130 interrupted.
"""

from __future__ import annotations

import duckdb

from infra.errors import BrokerConfigError, InfraError
from ledger.errors import LedgerError, LedgerKeyError
from preflight.errors import PreflightError
from projections.errors import ProjectionError
from queries import QueryParameterError, UnknownQueryError
from streams.errors import SettingsError as WorkerSettingsError
from streams.errors import StreamsError

#: Exit codes, as documented in the README.
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class AuditCliError(Exception):
    """Root of every error the `preflight-audit` command raises on purpose."""

    exit_code: int = EXIT_FAILURE


class ConfigurationError(AuditCliError):
    """The settings are not usable: fix the named setting in ``preflight-audit.toml`` (or the file named by
    ``PREFLIGHT_SETTINGS_FILE``) or its ``PREFLIGHT_*`` variable."""

    exit_code = EXIT_USAGE


class UsageError(AuditCliError):
    """A command was given arguments it cannot use (an unknown query, a malformed ``--param``): the
    message says which; ``--help`` lists what the command takes."""

    exit_code = EXIT_USAGE


class DatabaseNotFoundError(AuditCliError):
    """There is no projection database at the path given. Run ``preflight-audit serve`` or
    ``preflight-audit demo`` to fill one, or pass ``--db``."""


class DatabaseBusyError(AuditCliError):
    """Another process holds the projection database open for writing (DuckDB allows one writer per
    file, and no reader beside it): a running ``preflight-audit serve``. Ask its HTTP API, or stop it."""


class ServiceError(AuditCliError):
    """Something ``serve`` or ``demo`` started stopped working (the worker exited, the API could not bind
    its port, the log was not projected in time). The message names the log to read."""


class Interrupted(AuditCliError):
    """Ctrl-C or SIGTERM: everything started was stopped."""

    exit_code = EXIT_INTERRUPTED


def translate(exc: BaseException) -> AuditCliError | None:
    """The CLI error for an exception another package raised on purpose, or None for anything else.

    An exception group (concurrent sessions, say) is judged by its first exception."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, AuditCliError):
        return exc
    if isinstance(exc, (UnknownQueryError, QueryParameterError)):
        return UsageError(_first_line(exc))
    if isinstance(exc, (BrokerConfigError, WorkerSettingsError, LedgerKeyError)):
        return ConfigurationError(_first_line(exc))
    if isinstance(exc, ProjectionError) and _is_lock_conflict(exc):
        return DatabaseBusyError(
            "the projection database is open for writing in another process (a running `preflight-audit serve`?):"
            " query its HTTP API instead, or stop it first"
        )
    if isinstance(exc, (InfraError, ProjectionError, StreamsError, PreflightError, LedgerError)):
        return AuditCliError(_first_line(exc))
    if isinstance(exc, duckdb.Error):
        return AuditCliError(f"database error: {_first_line(exc)}")
    return None


def _is_lock_conflict(exc: BaseException) -> bool:
    text = str(exc)
    return "lock" in text.lower() and "conflicting" in text.lower()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0]  # KeyError's str() quotes its message
    return text.splitlines()[0]
