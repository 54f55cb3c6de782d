"""The DuckDB side of the projections: open and migrate a database file, write a planned batch and
its read positions in one transaction, read back what the planner needs, compare two databases.

Migrations are the numbered files `projections/migrations/NNN_name.sql`, applied in order, each in
its own transaction with its row in `schema_migrations` (version, name, checksum). Opening a database
applies the missing ones; one already applied whose file has changed since is refused. Every other
statement lives in `projections/sql/NAME.sql` and takes values only as bound parameters; batch rows
arrive as Arrow tables registered under `batch_<table>` for the length of one statement.

DuckDB errors are translated into `DatabaseError` here, at the boundary.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final

import duckdb
import pyarrow as pa

from projections.dlq import DeadLetter
from projections.errors import DatabaseError, MigrationError, ProjectionError
from projections.rows import (
    ARCHIVE,
    CHECKLIST,
    DEAD_LETTERS,
    EXECUTIONS,
    FIELDS,
    GATES,
    OFFSETS,
    RUN_OUTCOMES,
    RUNS,
    STORED_RUN_COLUMNS,
    TABLES,
    StoredRun,
)

__all__ = [
    "Comparison",
    "EventIdConflict",
    "Migration",
    "append_batch",
    "compare_projections",
    "load_offsets",
    "lookup_runs",
    "migrate",
    "migrations",
    "open_database",
    "reset_offsets",
    "rollback",
    "taken_event_ids",
    "write_batch",
]

_MIGRATION_FILE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")

#: The statement that writes each batch table.
_WRITES = {
    ARCHIVE.name: "insert_archive",
    RUNS.name: "insert_runs",
    RUN_OUTCOMES.name: "update_run_outcomes",
    FIELDS.name: "insert_field_provenance",
    CHECKLIST.name: "insert_checklist_results",
    GATES.name: "insert_gate_decisions",
    EXECUTIONS.name: "insert_executions",
    DEAD_LETTERS.name: "insert_dead_letters",
    OFFSETS.name: "upsert_consumer_offsets",
}
assert set(_WRITES) == {spec.name for spec in TABLES}


@cache
def sql(name: str) -> str:
    """The text of `projections/sql/<name>.sql`."""
    return (resources.files("projections") / "sql" / f"{name}.sql").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Migration:
    """One numbered migration file."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def migrations() -> list[Migration]:
    """The migration files in order. Raises `MigrationError` for a misnamed file or a repeated number."""
    found: list[Migration] = []
    for entry in (resources.files("projections") / "migrations").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _MIGRATION_FILE.match(entry.name)
        if match is None:
            raise MigrationError(f"migration file {entry.name!r} is not named NNN_lower_snake.sql")
        found.append(Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    numbers = [m.version for m in found]
    # A number may be left unused (numbers are handed out to changes made side by side), never used twice.
    if len(set(numbers)) != len(numbers) or (numbers and numbers[0] != 1):
        raise MigrationError(f"migrations must be numbered from 001 up without repeats, found {numbers}")
    return found


def migrate(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Apply the missing migrations in order; return the names applied (empty when up to date).

    :raises MigrationError: when a migration fails (it is rolled back), when an applied one was edited,
        or when the database knows migrations this code does not.
    """
    known = migrations()
    try:
        con.execute(sql("schema_migrations"))
        applied = {int(v): (str(n), str(c)) for v, n, c in con.execute(sql("applied_migrations")).fetchall()}
    except duckdb.Error as exc:
        raise MigrationError(f"cannot read schema_migrations: {exc}") from exc
    newer = sorted(set(applied) - {m.version for m in known})
    if newer:
        raise MigrationError(
            f"the database has migrations {newer} that this code does not know: it was migrated by newer code"
        )
    done: list[str] = []
    for migration in known:
        if migration.version in applied:
            name, checksum = applied[migration.version]
            if checksum != migration.checksum:
                raise MigrationError(
                    f"migration {migration.name} was edited after it was applied (as {name}):"
                    " restore it and put the change in a new migration"
                )
            continue
        try:
            con.begin()
            con.execute(migration.sql)
            con.execute(
                sql("record_migration"),
                {"version": migration.version, "name": migration.name, "checksum": migration.checksum},
            )
            con.commit()
        except duckdb.Error as exc:
            rollback(con)
            raise MigrationError(f"migration {migration.name} failed and was rolled back: {exc}") from exc
        done.append(migration.name)
    return done


def open_database(path: str | Path, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the projection database at `path`, migrated to the current schema.

    Read-only: nothing is migrated, and a database that is not at the current schema is refused. A file
    created here is made readable by its owner only (0600, like the keys) before anything is written
    into it: it holds the audit (DuckDB writes its ``.wal`` beside it with the process's umask).

    :raises DatabaseError: when the file cannot be opened (e.g. another process writes it).
    :raises MigrationError: see `migrate`.
    """
    created = not read_only and str(path) != ":memory:" and not Path(path).exists()
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as exc:
        raise DatabaseError(f"cannot open the projection database {path}: {exc}") from exc
    try:
        if created:
            try:
                os.chmod(path, 0o600)  # DuckDB created it with the umask; only its header is written yet
            except OSError as exc:
                raise DatabaseError(f"cannot make {path} private (0600): {exc.strerror or exc}") from exc
        if read_only:
            _check_current(con, path)
        else:
            migrate(con)
    except BaseException:
        con.close()
        raise
    return con


def _check_current(con: duckdb.DuckDBPyConnection, path: str | Path) -> None:
    known = {(m.version, m.checksum) for m in migrations()}
    try:
        present = con.execute(sql("has_schema_migrations")).fetchone()
        rows = con.execute(sql("applied_migrations")).fetchall() if present and present[0] else []
    except duckdb.Error as exc:
        raise MigrationError(f"cannot read the schema version of {path}: {exc}") from exc
    if {(int(v), str(c)) for v, _, c in rows} != known:
        raise MigrationError(f"{path} is not at the current schema: open it once read-write to migrate it")


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction, if any (quietly: after a failure, there may be none)."""
    with contextlib.suppress(duckdb.Error):  # no transaction open (BEGIN failed): nothing to undo
        con.rollback()


class EventIdConflict(ProjectionError):
    """The archive refused some of a batch's events because their event_id is already archived.

    Internal to the projector, which rolls the batch back, asks `taken_event_ids`, and plans the
    batch again with those messages dead-lettered. Nothing for an operator to do.
    """


def write_batch(
    con: duckdb.DuckDBPyConnection,
    tables: Mapping[str, Any],
    *,
    expected_events: int,
    before_commit: Callable[[], None] | None = None,
    publish: Callable[[list[DeadLetter]], None] | None = None,
) -> None:
    """Write a planned batch -- every table's rows and the new read positions -- in ONE transaction.

    `tables`, `expected_events` and `publish` as for `append_batch`. `before_commit` is called inside
    the transaction, after the last write (a test uses it to kill the process there).

    :raises EventIdConflict: the archive took fewer than `expected_events` rows (rolled back).
    :raises DatabaseError: any DuckDB failure (rolled back: nothing of the batch is written).
    """
    try:
        con.begin()
        append_batch(con, tables, expected_events=expected_events, publish=publish)
        if before_commit is not None:
            before_commit()
        con.commit()
    except duckdb.Error as exc:
        rollback(con)
        raise DatabaseError(f"writing a batch failed and was rolled back: {exc}") from exc
    except BaseException:
        rollback(con)
        raise


def append_batch(
    con: duckdb.DuckDBPyConnection,
    tables: Mapping[str, Any],
    *,
    expected_events: int,
    publish: Callable[[list[DeadLetter]], None] | None = None,
) -> None:
    """Write a planned batch's rows and read positions inside the transaction the caller has open.

    `tables` maps batch table names (`projections.rows.TABLES`) to Arrow tables. `publish` is called
    with the dead letters the table did not hold yet, before the offsets are written: it must return
    only once they are safely elsewhere (the dead-letter topic acknowledged them). On any exception
    the caller must roll the transaction back (`rollback`): part of the batch may be written.

    :raises EventIdConflict: the archive took fewer than `expected_events` rows.
    :raises duckdb.Error: any DuckDB failure.
    """
    for spec in TABLES:
        table = tables.get(spec.name)
        if table is None:
            continue
        if spec is DEAD_LETTERS:
            letters = [
                DeadLetter(*row) for row in _fetch_with(con, f"batch_{spec.name}", table, sql(_WRITES[spec.name]))
            ]
            if publish is not None and letters:
                publish(letters)
            continue
        changed = _run_with(con, f"batch_{spec.name}", table, sql(_WRITES[spec.name]))
        if spec is ARCHIVE and changed != expected_events:
            raise EventIdConflict(f"the archive took {changed} of {expected_events} events")
        if spec is RUN_OUTCOMES and changed != table.num_rows:
            raise DatabaseError(
                f"{table.num_rows - changed} outcome(s) found their run changed under the projector:"
                " is another process writing this database?"
            )


def _run_with(con: duckdb.DuckDBPyConnection, view: str, table: Any, statement: str) -> int:
    rows = _fetch_with(con, view, table, statement)
    return int(rows[0][0]) if rows else 0


def _fetch_with(con: duckdb.DuckDBPyConnection, view: str, table: Any, statement: str) -> list[tuple[Any, ...]]:
    con.register(view, table)
    try:
        rows = con.execute(statement).fetchall()
    except BaseException:
        # The statement's own error, not the aborted transaction's refusal to unregister after it.
        with contextlib.suppress(duckdb.Error):
            con.unregister(view)
        raise
    con.unregister(view)
    return rows


def load_offsets(con: duckdb.DuckDBPyConnection, projection: str, topic: str) -> dict[int, int]:
    """The stored next offset of each partition of `topic` for `projection` (absent: never read)."""
    try:
        rows = con.execute(sql("load_offsets"), {"projection": projection, "topic": topic}).fetchall()
    except duckdb.Error as exc:
        raise DatabaseError(f"cannot read the stored offsets: {exc}") from exc
    return {int(partition): int(offset) for partition, offset in rows}


def record_start(con: duckdb.DuckDBPyConnection, projection: str) -> int:
    """Record that a projector of `projection` starts on this database (migration 009); how many starts
    the projection has had, this one included."""
    con.execute(sql("record_start"), {"projection": projection, "pid": os.getpid()})
    row = con.execute(sql("count_starts"), {"projection": projection}).fetchone()
    return int(row[0]) if row else 0


def reset_offsets(con: duckdb.DuckDBPyConnection, projection: str, topic: str) -> None:
    """Forget `projection`'s stored offsets on `topic`: it reads from offset 0 next time, adding nothing
    it already holds (a check of idempotence, or a re-read after a fix to the dead-letter rules)."""
    try:
        con.execute(sql("reset_offsets"), {"projection": projection, "topic": topic})
    except duckdb.Error as exc:
        raise DatabaseError(f"cannot reset the stored offsets: {exc}") from exc


#: The most run ids `lookup_runs` looks up through the key of `runs`, each an index probe (~20-40 µs on
#: a file, whatever the archive's size); a scan of `runs` costs with its size instead. Measured on files
#: (lookups of n ids, half of them stored): at 1.2M runs (a 10M-event archive) 100 ids take 6.6 ms by
#: key against 40.8 ms by scan, 2,000 ids 57 ms against 36 ms; at 24k runs (bench/projector.py's
#: archive) 100 ids take 4.4 against 4.7 ms, 512 ids 14 against 4.5 ms. A steady stream (freshness:
#: 5k events/s, batches of ~100 messages) thus stays off the scan; a backlog's large batches scan.
KEY_LOOKUP_MAX: Final = 128


def lookup_runs(
    con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], *, probe_at_most: int = KEY_LOOKUP_MAX
) -> dict[str, StoredRun]:
    """What the projection holds of the given runs (absent ones are new).

    Up to `probe_at_most` ids are looked up through the key of `runs` (``run_id IN (?, ...)``, which
    DuckDB answers by probing the index: the cost follows the batch, not the archive); more are joined
    against a scan of `runs`, cheaper for a large batch (see `KEY_LOOKUP_MAX`).
    """
    if not run_ids:
        return {}
    wanted = list(dict.fromkeys(run_ids))
    try:
        if len(wanted) <= probe_at_most:
            where = f"WHERE run_id IN ({', '.join('?' * len(wanted))})"
            rows = con.execute(f"{sql('lookup_runs')}{where}", wanted).fetchall()
        else:
            con.register("batch_run_ids", pa.table({"run_id": pa.array(wanted, type=pa.string())}))
            try:
                rows = con.execute(f"{sql('lookup_runs')}WHERE run_id IN (SELECT run_id FROM batch_run_ids)").fetchall()
            finally:
                con.unregister("batch_run_ids")
    except duckdb.Error as exc:
        raise DatabaseError(f"cannot read stored runs: {exc}") from exc
    found = (StoredRun(**dict(zip(STORED_RUN_COLUMNS, row, strict=True))) for row in rows)
    return {run.run_id: run for run in found}


def taken_event_ids(con: duckdb.DuckDBPyConnection, event_ids: Sequence[str]) -> frozenset[str]:
    """Which of `event_ids` the archive already holds (lower case)."""
    if not event_ids:
        return frozenset()
    ids = pa.table({"event_id": pa.array(list(event_ids), type=pa.string())})
    try:
        con.register("batch_event_ids", ids)
        try:
            rows = con.execute(sql("taken_event_ids")).fetchall()
        finally:
            con.unregister("batch_event_ids")
    except duckdb.Error as exc:
        raise DatabaseError(f"cannot read archived event ids: {exc}") from exc
    return frozenset(str(row[0]) for row in rows)


@dataclass(frozen=True)
class Comparison:
    """Per table, how many rows only the left and only the right database hold (ingest times ignored)."""

    differences: dict[str, tuple[int, int]]

    @property
    def equal(self) -> bool:
        return all(left == 0 and right == 0 for left, right in self.differences.values())

    def __str__(self) -> str:
        if self.equal:
            return "equal"
        return "; ".join(
            f"{table}: {left} row(s) only left, {right} only right"
            for table, (left, right) in self.differences.items()
            if left or right
        )


def compare_projections(left: str | Path, right: str | Path) -> Comparison:
    """Compare two projection databases (e.g. live and rebuilt by `replay`), table by table.

    Both files must be closed by other processes (DuckDB lets one process write a file at a time).

    :raises DatabaseError: when either cannot be attached or read.
    """
    con = duckdb.connect(":memory:")
    try:
        con.execute(sql("attach_left"), {"path": str(left)})
        con.execute(sql("attach_right"), {"path": str(right)})
        rows = con.execute(sql("compare_projections")).fetchall()
    except duckdb.Error as exc:
        raise DatabaseError(f"cannot compare {left} with {right}: {exc}") from exc
    finally:
        con.close()
    return Comparison({str(table): (int(only_left), int(only_right)) for table, only_left, only_right in rows})
