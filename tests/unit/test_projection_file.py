"""The projection database file holds the audit: created readable by its owner only, like the keys."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from projections import open_database


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


class TestTheDatabaseFile:
    def test_a_new_database_is_created_0600(self, tmp_path: Path) -> None:
        path = tmp_path / "audit.duckdb"
        previous = os.umask(0o022)  # the usual umask, which would make it world-readable
        try:
            open_database(path).close()
        finally:
            os.umask(previous)
        assert mode(path) == 0o600

    def test_an_existing_database_keeps_the_mode_its_owner_gave_it(self, tmp_path: Path) -> None:
        path = tmp_path / "audit.duckdb"
        open_database(path).close()
        os.chmod(path, 0o640)
        open_database(path).close()
        open_database(path, read_only=True).close()
        assert mode(path) == 0o640
