"""The projection database's current schema in one file: ``projections/schema.sql``, generated.

The migrations (``projections/migrations/NNN_*.sql``) say how a database got to its schema; this file
says what the schema is now -- every table with its columns, keys and defaults, every view and index --
as DuckDB reports it for a fresh file that `open_database` migrated. It is generated, never edited:
after adding a migration, run ::

    python -m projections.schema            # rewrites projections/schema.sql
    python -m projections.schema --check    # exit 1 and the difference when the file is stale

and a test fails while the file in the repository differs from the migrations' result.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import duckdb

from projections.store import migrations, open_database

__all__ = ["SCHEMA_FILE", "current_schema", "main", "render_schema", "stale"]

#: Where the generated schema lives.
SCHEMA_FILE = Path(__file__).with_name("schema.sql")

_HEADER = """\
-- The projection database's current schema, generated from a fresh file migrated by `open_database`.
-- Do not edit: add a migration (projections/migrations/), then run `python -m projections.schema`.
"""


def _at_depth_zero(text: str) -> Iterator[int]:
    """Positions in `text` outside parentheses, brackets and quotes (and not of one of those marks)."""
    depth, quote = 0, ""
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif depth == 0:
            yield i


def _top_level_commas(text: str) -> Iterator[int]:
    """Positions of the commas of `text` outside parentheses, brackets and quotes."""
    return (i for i in _at_depth_zero(text) if text[i] == ",")


def _split(text: str) -> list[str]:
    cuts = [-1, *_top_level_commas(text), len(text)]
    return [text[a + 1 : b].strip() for a, b in itertools.pairwise(cuts)]


def _table(sql: str) -> str:
    """``CREATE TABLE name(a T, b U, PRIMARY KEY(a));`` as one column or constraint a line."""
    head, _, body = sql.partition("(")
    body = body.rstrip().removesuffix(";").rstrip()
    assert body.endswith(")"), sql
    lines = _split(body[:-1])
    return head.rstrip() + " (\n" + ",\n".join(f"    {line}" for line in lines) + "\n);"


def _view(sql: str) -> str:
    """``CREATE VIEW name AS SELECT a, b FROM ...`` with one selected column a line."""
    head, sep, rest = sql.partition(" AS SELECT ")
    if not sep:
        return sql
    depth_zero_from = _keyword_at_depth_zero(rest, " FROM ")
    if depth_zero_from < 0:
        return sql
    columns, tail = _split(rest[:depth_zero_from]), rest[depth_zero_from:].strip()
    statement = head + " AS\nSELECT\n" + ",\n".join(f"    {c}" for c in columns) + "\n" + tail
    return statement if statement.endswith(";") else statement + ";"


def _keyword_at_depth_zero(text: str, keyword: str) -> int:
    return next((i for i in _at_depth_zero(text) if text.startswith(keyword, i)), -1)


def render_schema(con: duckdb.DuckDBPyConnection) -> str:
    """The schema of the database `con` is connected to: its migrations, then every table, view and
    index of its ``main`` schema, each in name order, as DuckDB reports their definitions."""
    applied = con.execute('SELECT "version", "name" FROM schema_migrations ORDER BY "version"').fetchall()
    tables = con.execute(
        "SELECT table_name, sql FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY table_name"
    ).fetchall()
    views = con.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal ORDER BY view_name"
    ).fetchall()
    indexes = con.execute(
        "SELECT index_name, sql FROM duckdb_indexes() WHERE schema_name = 'main' ORDER BY table_name, index_name"
    ).fetchall()
    parts = [_HEADER + "-- Migrations applied:\n" + "".join(f"--   {name}\n" for _, name in applied)]
    parts += [f"-- table {name}\n{_table(str(sql))}\n" for name, sql in tables]
    parts += [f"-- view {name}\n{_view(str(sql))}\n" for name, sql in views]
    parts += [f"-- index {name}\n{sql}\n" for name, sql in indexes]
    return "\n".join(parts)


def current_schema() -> str:
    """The schema every migration in this package makes of a fresh database."""
    with tempfile.TemporaryDirectory(prefix="preflight-schema-") as directory:
        con = open_database(Path(directory) / "schema.duckdb")
        try:
            return render_schema(con)
        finally:
            con.close()


def stale(path: Path = SCHEMA_FILE) -> list[str]:
    """The difference between the schema file at `path` and the migrations' schema (a unified diff; empty
    when the file is current)."""
    written = path.read_text(encoding="utf-8") if path.is_file() else ""
    return list(
        difflib.unified_diff(
            written.splitlines(),
            current_schema().splitlines(),
            fromfile=f"{path} (in the repository)",
            tofile=f"the schema of migrations 001-{len(migrations()):03d}",
            lineterm="",
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Write the schema file, or with ``--check`` say whether it is current (exit 1 and the difference)."""
    parser = argparse.ArgumentParser(prog="python -m projections.schema", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=SCHEMA_FILE, help=f"the schema file (default: {SCHEMA_FILE})")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the file is stale")
    args = parser.parse_args(argv)
    if args.check:
        difference = stale(args.out)
        for line in difference:
            print(line)
        if difference:
            print(f"{args.out} is stale: run python -m projections.schema", file=sys.stderr)
        return 1 if difference else 0
    args.out.write_text(current_schema(), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
