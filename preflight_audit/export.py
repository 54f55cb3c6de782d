"""Export the projection tables of a DuckDB file to Parquet, one file per table, with DuckDB's COPY.

Without a time range every base table is written whole. With one, the runs started in ``[since,
until)`` are written with what belongs to them -- their fields, checklist items, gates, outcomes and
archived events -- and the dead letters of that time; the bookkeeping tables (read positions, schema
versions, the ledger's digests) are left out.

The table names come from the database's own catalog (never from input) and are quoted as
identifiers; the range's bounds and the target paths are bound parameters.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import duckdb

from projections import DatabaseError

__all__ = ["Exported", "export_parquet"]

_TABLES = """
SELECT table_name
FROM information_schema.tables
WHERE table_schema = 'main' AND table_type = 'BASE TABLE'
ORDER BY table_name
"""

_IN_RANGE = (
    "started_at >= coalesce(CAST($since AS TIMESTAMPTZ), started_at)"
    " AND started_at < coalesce(CAST($until AS TIMESTAMPTZ), started_at + INTERVAL 1 DAY)"
)
_OF_RUNS_IN_RANGE = f"run_id IN (SELECT run_id FROM runs WHERE {_IN_RANGE})"
#: For an export of a time range: each table's rows that belong to it (fixed text, no value in it).
_RANGED: dict[str, str] = {
    "runs": _IN_RANGE,
    "field_provenance": _OF_RUNS_IN_RANGE,
    "checklist_results": _OF_RUNS_IN_RANGE,
    "gate_decisions": _OF_RUNS_IN_RANGE,
    "executions": _OF_RUNS_IN_RANGE,
    "archive": _OF_RUNS_IN_RANGE,
    "dead_letters": "dead_lettered_at >= coalesce(CAST($since AS TIMESTAMPTZ), dead_lettered_at)"
    " AND dead_lettered_at < coalesce(CAST($until AS TIMESTAMPTZ), dead_lettered_at + INTERVAL 1 DAY)",
}


@dataclass(frozen=True)
class Exported:
    table: str
    rows: int
    path: Path


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def export_parquet(
    con: duckdb.DuckDBPyConnection,
    out_dir: Path,
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> list[Exported]:
    """Write each base table of `con` to ``out_dir/<table>.parquet`` (overwriting) -- with a range, only the
    rows of the runs started in ``[since, until)`` (module doc); what was written.

    :raises DatabaseError: when DuckDB cannot read a table or write a file.
    """
    ranged = since is not None or until is not None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseError(f"cannot write the export to {out_dir}: {exc.strerror or exc}") from exc
    written: list[Exported] = []
    try:
        tables = [str(name) for (name,) in con.execute(_TABLES).fetchall()]
        for table in tables:
            if ranged and table not in _RANGED:
                continue
            path = out_dir / f"{table}.parquet"
            where = f" WHERE {_RANGED[table]}" if ranged else ""
            copy = f"COPY (FROM {_identifier(table)}{where}) TO $path (FORMAT parquet, COMPRESSION zstd)"
            params = {"path": str(path)} | ({"since": since, "until": until} if ranged else {})
            counted = con.execute(copy, params).fetchone()
            written.append(Exported(table, int(counted[0]) if counted else 0, path))
    except duckdb.Error as exc:
        raise DatabaseError(f"exporting to {out_dir} failed: {exc}") from exc
    return written
