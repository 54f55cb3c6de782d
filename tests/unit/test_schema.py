"""``projections/schema.sql``: the projection database's current schema in one place, generated.

What must hold: the file in the repository is what the migrations make of a fresh database (a stale file
fails here, naming the difference: run ``python -m projections.schema``), and it is that schema -- run on
an empty database, it makes the same tables, views and indexes.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from projections import open_database
from projections.schema import SCHEMA_FILE, current_schema, main, stale

OBJECTS = (
    "SELECT table_name, sql FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY 1",
    "SELECT view_name, sql FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal ORDER BY 1",
    "SELECT index_name, sql FROM duckdb_indexes() WHERE schema_name = 'main' ORDER BY 1",
)


def _objects(con: duckdb.DuckDBPyConnection) -> list[list[tuple[str, str]]]:
    return [[(str(n), str(s)) for n, s in con.execute(query).fetchall()] for query in OBJECTS]


class TestTheSchemaFile:
    def test_is_current(self) -> None:
        difference = stale()
        assert difference == [], "\n".join([*difference, "stale: run python -m projections.schema"])

    def test_makes_the_schema_the_migrations_make(self, tmp_path: Path) -> None:
        migrated = open_database(tmp_path / "migrated.duckdb")
        from_file = duckdb.connect(":memory:")
        try:
            from_file.execute(SCHEMA_FILE.read_text(encoding="utf-8"))
            expected, made = _objects(migrated), _objects(from_file)
        finally:
            migrated.close()
            from_file.close()
        assert [len(kind) for kind in expected] == [10, 3, 2]  # tables (projector_starts among them), views, indexes
        assert made == expected

    def test_a_stale_file_is_named_with_the_difference(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        edited = tmp_path / "schema.sql"
        edited.write_text(current_schema().replace("    next_offset BIGINT NOT NULL,\n", ""), encoding="utf-8")
        assert "+    next_offset BIGINT NOT NULL," in stale(edited)
        assert main(["--check", "--out", str(edited)]) == 1
        assert "is stale" in capsys.readouterr().err
        assert main(["--out", str(edited)]) == 0
        assert main(["--check", "--out", str(edited)]) == 0
        assert stale(edited) == []
