"""`PostgresReplayStore`: claims on signed decisions in one PostgreSQL table, for engines on many hosts.

The table has the nonce as its primary key. A claim is one autocommitted
``INSERT ... ON CONFLICT (nonce) DO NOTHING RETURNING nonce``: the database's unique index decides which
of any number of concurrent claims -- from any engine, on any host, that reaches this database -- gets
the row, and only that one gets it back. The claim counts once the insert has committed, so it is as
durable as a commit: with the server's default ``synchronous_commit = on`` it survives a crash of the
server; across a failover to a replica only with synchronous replication
(``synchronous_standby_names``), which an operator who runs one should set.

Connections: one per store, opened on the first claim (or by `start`), re-opened after a failure; a
store that cannot reach its database raises `ReplayStoreError` and the engine calls nothing. Needs the
``postgres`` extra (``psycopg``).

A busy store is waited for, within bounds: each statement waits at most ``lock_timeout_s`` for a lock
(the session's ``lock_timeout``; without it a claim behind a long-held lock would wait for ever), and a
claim that the server refuses *because it is busy* -- a lock wait that timed out, a statement cancelled
by a timeout, a deadlock or serialization failure (`BUSY_SQLSTATES`) -- is tried again, with a growing
pause, until ``busy_timeout_s`` has passed since the claim began; then it fails closed
(`ReplayStoreError`). Those refusals are the server's word that the statement did not take
effect, so trying it again cannot claim twice. Anything else -- a refused, timed-out or lost connection,
an unknown error -- fails closed at once: a connection lost after the insert was sent leaves it unknown
whether the claim was written, and only a fresh decision may be tried then.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from datetime import datetime
from typing import Any, Final

from preflight.adapters.replay_file import ReplayStoreError
from preflight.replay import DecisionClaim, refused

__all__ = ["BUSY_SQLSTATES", "PostgresReplayStore"]

DEFAULT_TABLE = "preflight_decision_claims"
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: The SQLSTATEs of a server that is alive but busy, whose statement did not take effect: lock_not_available
#: (``lock_timeout``), query_canceled (``statement_timeout``), serialization_failure, deadlock_detected.
#: (A connection the server turns away carries no SQLSTATE in psycopg, so it is not among them.)
BUSY_SQLSTATES: Final = frozenset({"55P03", "57014", "40001", "40P01"})
_FIRST_PAUSE_S = 0.02
_LONGEST_PAUSE_S = 0.5


class PostgresReplayStore:
    """Claims in the table `table` of the database `conninfo` names (a libpq connection string or URL).

    The table is created if it does not exist; the connecting role needs CREATE on the schema then, and
    INSERT, SELECT and DELETE on the table always.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = DEFAULT_TABLE,
        busy_timeout_s: float = 10.0,
        lock_timeout_s: float = 2.0,
    ) -> None:
        if not _IDENTIFIER.fullmatch(table):
            raise ValueError(f"the claims table must be a plain lower-case identifier, not {table!r:.80}")
        if not (0 <= busy_timeout_s <= 600 and 0.001 <= lock_timeout_s <= 600):
            raise ValueError("busy_timeout_s must be within 0..600 s and lock_timeout_s within 0.001..600 s")
        self._conninfo = conninfo
        self._table = table
        self._busy_timeout_s = busy_timeout_s
        self._lock_timeout_ms = max(1, round(lock_timeout_s * 1000))
        self._connection: Any = None
        self._lock = asyncio.Lock()
        #: How many times a claim found the store busy and tried again (for operators and tests).
        self.busy_retries = 0

    def __repr__(self) -> str:
        return f"PostgresReplayStore(table={self._table!r})"

    async def start(self) -> None:
        """Connect and create the table (a first claim does it too)."""
        async with self._lock:
            await self._connect()

    async def close(self) -> None:
        async with self._lock:
            if self._connection is not None:
                await self._connection.close()
                self._connection = None

    async def _connect(self) -> Any:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - the test environment has the extra
            raise ReplayStoreError("PostgresReplayStore needs psycopg: install preflight-audit[postgres]") from exc
        try:
            self._connection = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            await self._connection.execute(
                "SELECT set_config('lock_timeout', %s, false)", (f"{self._lock_timeout_ms}ms",)
            )
            await self._create_table(psycopg)
        except psycopg.Error as exc:
            await self._drop()
            raise ReplayStoreError(f"the replay store's database cannot be used: {type(exc).__name__}") from exc
        return self._connection

    async def _create_table(self, psycopg: Any) -> None:
        # Two engines creating the table at once can both pass IF NOT EXISTS; the loser's error says the
        # table now exists, which is all that was wanted.
        with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            await self._connection.execute(
                f"""CREATE TABLE IF NOT EXISTS {self._table} (
                    nonce        text PRIMARY KEY,
                    decision_id  text NOT NULL,
                    run_id       text NOT NULL,
                    action_key   text,
                    key_id       text NOT NULL,
                    issued_at    timestamptz NOT NULL,
                    expires_at   timestamptz NOT NULL,
                    claimant     text NOT NULL,
                    claimed_at   timestamptz NOT NULL DEFAULT now()
                )"""
            )

    async def claim(self, claim: DecisionClaim) -> str | None:
        """None when this claim won the nonce; else the refusal naming the claim that did.

        :raises ReplayStoreError: the store cannot be reached, or stayed busy for ``busy_timeout_s``.
        """
        deadline = time.monotonic() + self._busy_timeout_s
        pause = _FIRST_PAUSE_S
        while True:
            try:
                return await self._claim_once(claim)
            except ReplayStoreError as exc:
                busy = _sqlstate(exc.__cause__) in BUSY_SQLSTATES
                if not busy or time.monotonic() + pause > deadline:
                    if busy:
                        raise ReplayStoreError(
                            f"the replay store stayed busy for {self._busy_timeout_s:g} s: {exc}"
                        ) from exc.__cause__
                    raise
            self.busy_retries += 1
            await asyncio.sleep(pause)  # a pause before trying a busy store again, bounded by the deadline
            pause = min(pause * 2, _LONGEST_PAUSE_S)

    async def _claim_once(self, claim: DecisionClaim) -> str | None:
        import psycopg

        async with self._lock:
            connection = await self._connect()
            try:
                cursor = await connection.execute(
                    f"""INSERT INTO {self._table}
                        (nonce, decision_id, run_id, action_key, key_id, issued_at, expires_at, claimant)
                        VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                        ON CONFLICT (nonce) DO NOTHING RETURNING nonce""",
                    (
                        claim.nonce,
                        claim.decision_id,
                        claim.run_id,
                        claim.action_key,
                        claim.key_id,
                        claim.issued_at,
                        claim.expires_at,
                        claim.claimant,
                    ),
                )
                if await cursor.fetchone() is not None:
                    return None
                cursor = await connection.execute(
                    f"SELECT decision_id, claimant, claimed_at FROM {self._table} WHERE nonce = %s", (claim.nonce,)
                )
                row = await cursor.fetchone()
            except psycopg.Error as exc:
                if _sqlstate(exc) not in BUSY_SQLSTATES:  # a busy server's connection is still good
                    await self._drop()
                raise ReplayStoreError(f"a claim could not be written: {type(exc).__name__}") from exc
        if row is None:  # pragma: no cover - the row that refused the insert was deleted since (pruned)
            return refused(None)
        decision_id, claimant, claimed_at = row
        return refused({"decision_id": decision_id, "claimant": claimant}, claimed_at.isoformat())

    async def prune(self, before: datetime) -> int:
        """Delete the claims of decisions that expired before `before`; returns how many."""
        async with self._lock:
            connection = await self._connect()
            cursor = await connection.execute(f"DELETE FROM {self._table} WHERE expires_at < %s", (before,))
            return int(cursor.rowcount)

    async def _drop(self) -> None:
        if self._connection is not None:
            try:
                await self._connection.close()
            finally:
                self._connection = None


def _sqlstate(error: BaseException | None) -> str | None:
    """The SQLSTATE the server gave for `error` (a psycopg error), or None (no server answer)."""
    return getattr(error, "sqlstate", None)
