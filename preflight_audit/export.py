"""Export every projection table of a DuckDB file to Parquet, one file per table, with DuckDB's COPY.

The table names come from the database's own catalog (never from input) and are quoted as
identifiers; the target path is a bound parameter.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Exported:
    table: str
    rows: int
    path: Path


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def export_parquet(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Exported]:
    """Write each base table of `con` to ``out_dir/<table>.parquet`` (overwriting); what was written.

    :raises DatabaseError: when DuckDB cannot read a table or write a file.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Exported] = []
    try:
        tables = [str(name) for (name,) in con.execute(_TABLES).fetchall()]
        for table in tables:
            path = out_dir / f"{table}.parquet"
            copy = f"COPY (FROM {_identifier(table)}) TO $path (FORMAT parquet, COMPRESSION zstd)"
            counted = con.execute(copy, {"path": str(path)}).fetchone()
            written.append(Exported(table, int(counted[0]) if counted else 0, path))
    except duckdb.Error as exc:
        raise DatabaseError(f"exporting to {out_dir} failed: {exc}") from exc
    return written
