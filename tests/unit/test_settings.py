"""One settings model for every ``PREFLIGHT_*`` variable (`preflight_audit.settings`).

What must hold: every variable the code and the docs name is a setting of the model (or one of the few the
test suite alone reads); nothing but the settings module reads a setting from the environment; a part
started on its own reads its variables through the model, with the model's parse rule, and keeps its own
defaults for what is unset; `preflight-audit settings` lists every setting with its default, its value and
where the value came from, and never shows a secret.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from infra.brokers import ENV_VAR, broker_from_env
from infra.errors import BrokerConfigError
from ledger.keys import KEY_ENV, KEY_FILE_ENV, PUBLIC_KEY_ENV, PUBLIC_KEY_FILE_ENV
from preflight_audit.cli import app
from preflight_audit.errors import ConfigurationError
from preflight_audit.settings import (
    ENV_PREFIX,
    SETTINGS_FILE_VAR,
    TEST_SUITE_VARIABLES,
    Settings,
    SettingValueError,
    env_var,
    explain,
    given_settings,
)
from projections.signatures import LEEWAY_VAR, PUBLIC_KEYS_VAR
from streams.errors import SettingsError
from streams.settings import ENV_VARS, SETTINGS, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("preflight", "preflight_audit", "streams", "projections", "ledger", "infra", "queries", "gateway")
#: Where the project's own code touches the process environment, and why: only the settings module reads a
#: setting from it. `projections.decode` still reads PREFLIGHT_NATIVE_DECODE itself when it is imported
#: (declared in the model as `native_decode`); it is to read it through the model.
ENVIRONMENT_READERS = {
    "preflight_audit/settings.py": "the one settings model",
    "streams/process.py": "passes the environment on to the worker subprocess",
    "infra/embedded.py": "passes the environment on to the broker subprocess, without Tansu's own variables",
    "infra/kafka.py": "JAVA_HOME",
    "preflight_audit/cli.py": "COLUMNS, the width of a terminal",
    "preflight/intake.py": "PREFLIGHT_NATIVE_DECODE, read at import",
}


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No PREFLIGHT_* variable set, and a working directory without a settings file."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def _named_variables() -> dict[str, set[str]]:
    """Every PREFLIGHT_* name the code, the docs and the build files spell, with where."""
    files = [ROOT / "Makefile", ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / ".ci" / "run"]
    for folder in (*PACKAGES, "tests", "bench"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".yml", ".toml")]
    named: dict[str, set[str]] = {}
    for path in files:
        if path.is_file():
            for name in re.findall(r"\bPREFLIGHT_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")):
                named.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return named


class TestOneModel:
    def test_every_variable_named_anywhere_is_a_setting(self) -> None:
        declared = {env_var(name) for name in Settings.model_fields} | {SETTINGS_FILE_VAR} | set(TEST_SUITE_VARIABLES)
        named = _named_variables()
        unknown = {name: sorted(where) for name, where in named.items() if name not in declared}
        assert unknown == {}, "variables no setting declares (add a field to preflight_audit.settings.Settings)"
        assert len(named) > 25

    def test_only_the_settings_module_reads_the_environment(self) -> None:
        readers: set[str] = set()
        for folder in PACKAGES:
            for path in (ROOT / folder).rglob("*.py"):
                if re.search(r"os\.environ|getenv\(", path.read_text(encoding="utf-8")):
                    readers.add(str(path.relative_to(ROOT)))
        assert readers == set(ENVIRONMENT_READERS), "read a setting through preflight_audit.settings instead"

    def test_the_parts_name_their_variables_from_the_model(self) -> None:
        assert ENV_VAR == "PREFLIGHT_BROKER"
        assert (KEY_FILE_ENV, KEY_ENV) == ("PREFLIGHT_LEDGER_KEY_FILE", "PREFLIGHT_LEDGER_KEY")
        assert (PUBLIC_KEY_FILE_ENV, PUBLIC_KEY_ENV) == (
            "PREFLIGHT_LEDGER_PUBLIC_KEY_FILE",
            "PREFLIGHT_LEDGER_PUBLIC_KEY",
        )
        assert (PUBLIC_KEYS_VAR, LEEWAY_VAR) == ("PREFLIGHT_DECISION_PUBLIC_KEYS", "PREFLIGHT_DECISION_LEEWAY_S")
        assert set(SETTINGS.values()) <= set(Settings.model_fields)
        assert set(ENV_VARS) == {env_var(setting) for setting in SETTINGS.values()}
        with pytest.raises(KeyError, match="not a setting"):
            env_var("partitions")


class TestAPartOnItsOwn:
    """The fold worker, the projector, the ledger and the test suite's broker read only the variables set,
    through the model, over their own defaults."""

    def test_unset_variables_keep_the_parts_defaults(self) -> None:
        assert WorkerSettings.from_env({}) == WorkerSettings()
        assert given_settings({}, "batch_size", "events_partitions") == {}
        assert given_settings({"PREFLIGHT_BATCH_SIZE": "  "}, "batch_size") == {}  # empty: unset

    def test_a_set_variable_is_parsed_by_the_model(self) -> None:
        worker = WorkerSettings.from_env(
            {
                "PREFLIGHT_BATCH_SIZE": " 7 ",
                "PREFLIGHT_CATCH_UP": "off",
                "PREFLIGHT_EVENTS_PARTITIONS": "3",
                "PREFLIGHT_DATA_DIR": "/srv/worker",
                "PREFLIGHT_DECISION_PUBLIC_KEYS": os.pathsep.join(["a.pem", "", "b.pem"]),
                "PREFLIGHT_API_PORT": "not read by the worker",
            }
        )
        assert (worker.batch_size, worker.catch_up, worker.partitions) == (7, False, 3)
        assert worker.data_dir == Path("/srv/worker")
        assert worker.decision_public_keys == (Path("a.pem"), Path("b.pem"))

    @pytest.mark.parametrize(
        ("variable", "raw", "message"),
        [
            ("PREFLIGHT_BATCH_SIZE", "many", "PREFLIGHT_BATCH_SIZE='many' is not a number"),
            ("PREFLIGHT_CATCH_UP", "maybe", "PREFLIGHT_CATCH_UP='maybe' is not a flag"),
            ("PREFLIGHT_WEB_PORT", "70000", "PREFLIGHT_WEB_PORT='70000': Input should be less than or equal to 65535"),
        ],
    )
    def test_a_bad_variable_is_named(self, variable: str, raw: str, message: str) -> None:
        with pytest.raises(SettingsError, match=re.escape(message)):
            WorkerSettings.from_env({variable: raw})
        with pytest.raises(SettingValueError, match=re.escape(message)):
            given_settings({variable: raw}, *SETTINGS.values())

    def test_the_broker_of_the_test_suite(self) -> None:
        with pytest.raises(BrokerConfigError, match="PREFLIGHT_BROKER='kafak'"):
            broker_from_env({ENV_VAR: "kafak"})

    @given(
        batch_size=st.integers(1, 10**6),
        batch_within_s=st.floats(0.001, 60, allow_nan=False),
        session_timeout_s=st.floats(1, 300, allow_nan=False),
        partitions=st.integers(1, 1024),
        catch_up=st.booleans(),
        leeway=st.floats(0, 3600, allow_nan=False),
        keys=st.lists(st.from_regex(r"[a-z]{1,8}\.pem", fullmatch=True), max_size=3, unique=True),
    )
    def test_what_the_command_line_hands_a_worker_subprocess_is_what_it_reads(
        self,
        batch_size: int,
        batch_within_s: float,
        session_timeout_s: float,
        partitions: int,
        catch_up: bool,
        leeway: float,
        keys: list[str],
    ) -> None:
        """`WorkerSettings.to_env` (serve starting a worker) and `from_env` (the worker reading it) agree."""
        sent = WorkerSettings(
            broker_url="127.0.0.1:9092",
            partitions=partitions,
            batch_size=batch_size,
            batch_within_s=batch_within_s,
            session_timeout_s=session_timeout_s,
            catch_up=catch_up,
            decision_public_keys=tuple(Path(k) for k in keys),
            decision_leeway_s=leeway,
            data_dir=Path("var/worker"),
        )
        assert WorkerSettings.from_env(sent.to_env()) == sent


class TestTheSettingsCommand:
    def test_every_setting_its_default_value_and_origin(
        self, clean_environment: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        Path("preflight-audit.toml").write_text("events_partitions = 4\napi_port = 9001\nbatch_size = 100\n")
        monkeypatch.setenv("PREFLIGHT_API_PORT", "9002")
        monkeypatch.setenv("PREFLIGHT_CATCH_UP", "0")
        settings, rows = explain(None, api_host="0.0.0.0")
        by_name = {row.name: row for row in rows}
        assert list(by_name) == ["settings_file", *Settings.model_fields]
        assert by_name["settings_file"].value == "preflight-audit.toml"
        assert (by_name["api_host"].value, by_name["api_host"].origin) == ("0.0.0.0", "command line")
        assert (by_name["api_port"].value, by_name["api_port"].origin) == ("9002", "environment")
        assert (by_name["catch_up"].value, by_name["catch_up"].origin) == ("false", "environment")
        assert (by_name["events_partitions"].value, by_name["events_partitions"].origin) == ("4", "settings file")
        assert (by_name["batch_size"].value, by_name["batch_size"].origin) == ("100", "settings file")
        assert (by_name["broker"].value, by_name["broker"].default, by_name["broker"].origin) == (
            "embedded",
            "embedded",
            "default",
        )
        assert all(row.variable == env_var(row.name) for row in rows[1:])
        assert settings.worker_settings("127.0.0.1:1").batch_size == 100  # the file reaches the worker too

    def test_secrets_are_masked(self, clean_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
        token = "compliance:a-very-secret-token-0123456789"
        monkeypatch.setenv("PREFLIGHT_API_TOKENS", token)
        monkeypatch.setenv("PREFLIGHT_LEDGER_KEY", "00" * 32)
        monkeypatch.setenv("PREFLIGHT_LAKE_CATALOG", "postgresql+psycopg://audit:hunter2-secret@db/lake")
        _, rows = explain()
        secrets = {row.name: row for row in rows if row.secret}
        assert set(secrets) == {"api_tokens", "ledger_key", "lake_catalog"}
        assert {row.value for row in secrets.values()} == {"********"}
        for output in ("table", "json"):
            result = CliRunner().invoke(app, ["settings", "--format", output], env={"COLUMNS": "300"})
            assert result.exit_code == 0, result.output
            assert "a-very-secret" not in result.output and "0000000000" not in result.output
            assert "hunter2" not in result.output
            assert "PREFLIGHT_API_TOKENS" in result.output

    def test_the_command_lists_the_test_suite_variables_too(self, clean_environment: None) -> None:
        result = CliRunner().invoke(app, ["settings", "--set", "api_port=0", "-f", "json"])
        assert result.exit_code == 0, result.output
        listed = json.loads(result.output)
        assert [s["name"] for s in listed["settings"]] == ["settings_file", *Settings.model_fields]
        port = next(s for s in listed["settings"] if s["name"] == "api_port")
        assert (port["value"], port["default"], port["from"]) == ("0", "8000", "command line")
        assert [t["variable"] for t in listed["test_suite"]] == list(TEST_SUITE_VARIABLES)

    def test_a_bad_setting_is_named(self, clean_environment: None) -> None:
        for args in (["--set", "events_partitions=two"], ["--set", "partitions=3"], ["--set", "nothing"]):
            result = CliRunner().invoke(app, ["settings", *args])
            assert result.exit_code == 2, result.output
        with pytest.raises(ConfigurationError, match="events_partitions"):
            explain(None, events_partitions="two")
