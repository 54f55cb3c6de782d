"""Which database the reading commands read without --db (`preflight_audit.settings.reading_settings`): the
deployment's when it exists or is named; the demo's only while there is no deployment and nothing names one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from preflight_audit.settings import DEMO_DATABASE, DEMO_OUT, demo_read_by_default, reading_settings


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory where the demo has run, with no PREFLIGHT_* variable and no settings file."""
    for name in [n for n in os.environ if n.startswith("PREFLIGHT_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEMO_OUT / "keys").mkdir(parents=True)
    (tmp_path / DEMO_DATABASE).write_bytes(b"")
    return tmp_path


def test_with_no_deployment_the_demo_is_read_with_its_keys_and_said(here: Path) -> None:
    settings, note = reading_settings()
    assert settings.database == DEMO_DATABASE
    assert settings.key_dir == DEMO_OUT / "keys" / "values"
    assert settings.ledger_public_key_file == str(DEMO_OUT / "keys" / "ledger.key.pub")
    assert note is not None and str(DEMO_DATABASE) in note
    assert demo_read_by_default(None, Path("demo-out"))
    assert not demo_read_by_default(None, Path("elsewhere"))


def test_a_key_store_named_is_kept(here: Path) -> None:
    settings, _ = reading_settings(key_dir=here / "mine")
    assert (settings.database, settings.key_dir) == (DEMO_DATABASE, here / "mine")


@pytest.mark.parametrize("how", ["option", "variable", "settings file", "deployment exists", "lake"])
def test_a_deployment_database_is_never_replaced(here: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    overrides = {}
    if how == "option":
        overrides["database"] = Path("var/preflight.duckdb")
    elif how == "variable":
        monkeypatch.setenv("PREFLIGHT_DATABASE", "var/preflight.duckdb")
    elif how == "settings file":
        (here / "preflight-audit.toml").write_text('database = "var/preflight.duckdb"\n')
    elif how == "deployment exists":
        (here / "var").mkdir()
        (here / "var" / "preflight.duckdb").write_bytes(b"")
    else:
        monkeypatch.setenv("PREFLIGHT_LAKE_CATALOG", "sqlite:///lake.db")
    settings, note = reading_settings(**overrides)
    assert (settings.database, note) == (Path("var/preflight.duckdb"), None)
    if how != "option":  # an option names the database of one command only
        assert not demo_read_by_default(None, Path("demo-out"))
