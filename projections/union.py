"""Several projectors' databases read as one: each file attached read-only into one DuckDB session.

With more than one projector, each owns a fixed set of the events topic's partitions (`Projector(...,
partitions=...)`, ``python -m projections run --partitions``) and writes them into a file of its own. A
key's messages are all on one partition, so every run -- its events, fields, checklist results, gate,
outcome, dead letters -- lives whole in exactly one file, and the files hold disjoint rows.

`open_union(paths)` opens an in-memory DuckDB session, attaches every file ``READ_ONLY``, and makes each
projection table a view of the ``UNION ALL BY NAME`` of that table in every file; the database's own views
(`analyst_field_provenance`, ...) are made again over those, from their definitions in the first file. The
named queries (`queries.run`) then run on the session unchanged, and since no row is in two files, every
answer is the answer the one file of a single projector over the same events would give
(`tests/integration/test_scale_out.py` compares them query by query).

DuckDB lets one process open a file it writes: the union reads the files of stopped projectors, or copies
of live ones (`Projector.checkpoint`, then copy the file).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import duckdb

from projections.errors import DatabaseError
from projections.store import migrations

__all__ = ["open_union"]

#: Not projections: kept from the first file only (the same in every file), or left out.
_NOT_UNIONED = frozenset({"schema_migrations"})


def open_union(paths: Sequence[str | Path]) -> duckdb.DuckDBPyConnection:
    """A read-only session over every projection database in `paths` (see the module doc).

    :raises DatabaseError: a file is missing, busy, not at the current schema, or the files' tables differ.
    """
    if not paths:
        raise DatabaseError("no projection database to read")
    con = duckdb.connect(":memory:")
    try:
        aliases = []
        for index, path in enumerate(paths):
            if not Path(path).is_file():
                raise DatabaseError(f"no projection database at {path}")
            alias = f"p{index}"
            con.execute(f"ATTACH $path AS {alias} (READ_ONLY)", {"path": str(path)})  # alias: p0, p1, ...
            aliases.append(alias)
        _check_schema(con, aliases, paths)
        tables = _names(con, aliases[0], "BASE TABLE")
        for other, path in zip(aliases[1:], paths[1:], strict=True):
            if _names(con, other, "BASE TABLE") != tables:
                raise DatabaseError(f"{path} does not hold the tables {paths[0]} holds")
        for table in tables:
            if table in _NOT_UNIONED:
                continue
            parts = " UNION ALL BY NAME ".join(f"SELECT * FROM {alias}.main.{_ident(table)}" for alias in aliases)
            con.execute(f"CREATE VIEW main.{_ident(table)} AS {parts}")
        for (definition,) in con.execute(
            "SELECT sql FROM duckdb_views() WHERE database_name = ? AND schema_name = 'main' AND NOT internal"
            " ORDER BY view_oid",
            [aliases[0]],
        ).fetchall():
            con.execute(definition)
    except duckdb.Error as exc:
        con.close()
        raise DatabaseError(f"cannot read the projection databases {list(map(str, paths))} as one: {exc}") from exc
    except BaseException:
        con.close()
        raise
    return con


def _check_schema(con: duckdb.DuckDBPyConnection, aliases: Sequence[str], paths: Sequence[str | Path]) -> None:
    known = {m.version for m in migrations()}
    for alias, path in zip(aliases, paths, strict=True):
        rows = con.execute(f"SELECT version FROM {alias}.main.schema_migrations").fetchall()
        if {int(v) for (v,) in rows} != known:
            raise DatabaseError(f"{path} is not at the current schema: open it once read-write to migrate it")


def _names(con: duckdb.DuckDBPyConnection, alias: str, kind: str) -> list[str]:
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = ? AND table_schema = 'main'"
        " AND table_type = ? ORDER BY table_name",
        [alias, kind],
    ).fetchall()
    return [str(name) for (name,) in rows]


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
