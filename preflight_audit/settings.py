"""Every ``PREFLIGHT_*`` setting: the one settings model of the whole deployment, as the command line loads it.

`Settings` is the settings floor's declaration (`preflight_settings.SettingFields`: it names, types,
defaults and explains every variable the command line, the fold worker, the projector, the ledger and the
brokers read; nothing else in the project reads a ``PREFLIGHT_*`` variable) with what the settings make
(the broker, the worker's settings, key paths). The parts take their values as arguments: the command
line loads the model (`load_settings`) and hands each part what it needs (`Settings.worker_settings`,
`Settings.open_broker`, the keys and tokens); a part's own entry point -- ``faust -A streams.app
worker``, ``python -m projections``, ``python -m ledger``, the test suite's broker -- reads its variables
through the floor (`preflight_settings.given_settings`, re-exported here), so each name has one parse
rule. `preflight-audit settings` lists every setting, its default, its current value and where that came
from (`explain`), secrets masked.

Precedence for the command line, highest first: command-line options, environment variables
(``PREFLIGHT_<FIELD>``), the settings file, the defaults below. The settings file is
``preflight-audit.toml`` in the working directory when it exists, or the file ``PREFLIGHT_SETTINGS_FILE``
(or ``--settings``) names, which must then exist. Its keys are the field names::

    broker = "127.0.0.1:9092"
    events_topic = "preflight.events"
    events_partitions = 2
    database = "var/preflight.duckdb"
    api_port = 8000
    key_dir = "var/keys"
    api_tokens_file = "api-tokens.txt"

An empty variable counts as unset, and a variable's value is read without surrounding whitespace. A part
started on its own reads only the variables that are set, over its own parameter defaults (a fold worker
started by hand without ``PREFLIGHT_EVENTS_PARTITIONS`` folds one partition; ``serve`` always sets it).

Keys and tokens (see the README, "Command line" and "HTTP API"): ``key_dir`` holds the per-user keys values
are sealed with (`preflight.protect.FileKeyStore`; keep it out of backups, erasing a user destroys
theirs); ``decision_key`` the Ed25519 key that signs `execute` decisions (PKCS#8 PEM; when it is not
set, ``serve`` creates ``<data_dir>/decision.key`` on first use, with ``decision.key.pub`` beside it,
which the fold worker and the projector are given); ``decision_public_keys`` (PEM files,
os.pathsep-separated) further signers both trust, with ``decision_leeway_s`` seconds of clock skew;
``ledger_key_file`` / ``ledger_public_key_file`` (or the keys themselves, ``ledger_key`` /
``ledger_public_key``) the ledger's digest keys; ``api_tokens`` (``role:token,role:token``) or
``api_tokens_file`` (one ``role:token`` a line) the bearer tokens of the HTTP API and their roles.

Nothing below the command line imports this module: the rooms read their settings from the floor.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from pydantic import SecretStr, ValidationError
from pydantic_settings import TomlConfigSettingsSource

from preflight_settings import (
    ENV_PREFIX,
    Inputs,
    SettingFields,
    SettingValueError,
    Variables,
    env_var,
    given_settings,
    reading,
)

if TYPE_CHECKING:
    from infra.brokers import Broker
    from streams.settings import WorkerSettings

__all__ = [
    "DEFAULT_SETTINGS_FILE",
    "DEMO_DATABASE",
    "DEMO_OUT",
    "ENV_PREFIX",
    "SETTINGS_FILE_VAR",
    "TEST_SUITE_VARIABLES",
    "Origin",
    "SettingRow",
    "SettingValueError",
    "Settings",
    "demo_read_by_default",
    "env_var",
    "explain",
    "given_settings",
    "load_settings",
    "reading_settings",
    "reads_the_demo",
    "settings_file",
]

#: Read when it exists in the working directory.
DEFAULT_SETTINGS_FILE = Path("preflight-audit.toml")
#: Names another settings file (which must exist).
SETTINGS_FILE_VAR: Final = "PREFLIGHT_SETTINGS_FILE"
#: Variables only the test suite reads (they configure the tests, not the system): listed by
#: `preflight-audit settings` for completeness, read by `tests/reliability/harness.py`.
TEST_SUITE_VARIABLES: Final[Mapping[str, str]] = {
    "PREFLIGHT_SOAK_CYCLES": "kill cycles per fault test of tests/reliability (default 20; make soak: 50)",
    "PREFLIGHT_FAULT_SEED": "replays the kill points of one reliability run (default: a fresh seed, printed)",
}

#: Where `preflight-audit demo` leaves its database (``audit.duckdb``) and keys (``keys/``) unless ``--out``
#: says otherwise; the reading commands fall back to it (`reading_settings`).
DEMO_OUT: Final = Path("demo-out")
DEMO_DATABASE: Final = DEMO_OUT / "audit.duckdb"

Origin = Literal["default", "environment", "settings file", "command line"]


class Settings(SettingFields):
    """Every setting of the deployment (`preflight_settings.SettingFields`), and what they make."""

    # ---- what the settings make -------------------------------------------------------------------------

    def open_lake(self) -> Any:
        """The Iceberg lake the projections are read from (`projections.lake.Lake`), or None: the DuckDB file."""
        if self.lake_catalog is None:
            return None
        from projections.lake import Lake

        return Lake(self.lake_catalog.get_secret_value(), self.lake_warehouse)

    @property
    def embedded(self) -> bool:
        """Whether the broker is one this process starts, memory-only (nothing survives it)."""
        return self.broker == "embedded"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def decision_key_path(self) -> Path:
        """The decision signing key: `decision_key`, else ``<data_dir>/decision.key``."""
        return self.decision_key if self.decision_key is not None else self.data_dir / "decision.key"

    @property
    def decision_public_key_paths(self) -> tuple[Path, ...]:
        """The files `decision_public_keys` names."""
        return _paths(self.decision_public_keys)

    def open_broker(self, log_dir: Path | None = None) -> Broker:
        """The configured broker, not yet started: use it in ``with``. An embedded broker logs to `log_dir`
        (default: a temporary directory removed when it stops)."""
        from infra.brokers import broker_for

        return broker_for(self.broker, log_dir=log_dir)

    def worker_settings(
        self, bootstrap: str, *, decision_public_keys: tuple[Path, ...] = (), **overrides: Any
    ) -> WorkerSettings:
        """The fold worker's settings: what these settings say (its data under ``<data_dir>/worker``), with
        `bootstrap` as its broker and `overrides` last. `decision_public_keys` are trusted in addition to
        those the setting `decision_public_keys` names.

        :raises ConfigurationError: when the worker refuses them.
        """
        from preflight_audit.errors import ConfigurationError
        from streams.errors import SettingsError as WorkerSettingsError
        from streams.settings import WorkerSettings

        values: dict[str, Any] = {
            "broker_url": bootstrap,
            "events_topic": self.events_topic,
            "partitions": self.events_partitions,
            "dlq_topic": self.dlq_topic,
            "app_id": self.app_id,
            "table_name": self.table,
            "web_host": self.web_host,
            "web_port": self.web_port,
            "data_dir": self.data_dir / "worker",
            "batch_size": self.batch_size,
            "batch_within_s": self.batch_within_s,
            "session_timeout_s": self.session_timeout_s,
            "profile_path": self.profile,
            "catch_up": self.catch_up,
            "replication_factor": self.replication_factor,
            "decision_public_keys": tuple(dict.fromkeys((*self.decision_public_key_paths, *decision_public_keys))),
            "decision_leeway_s": self.decision_leeway_s,
        }
        values.update(overrides)
        try:
            return WorkerSettings(**values)
        except WorkerSettingsError as exc:
            raise ConfigurationError(f"fold worker settings: {exc}") from exc


def _paths(text: str | None) -> tuple[Path, ...]:
    """The paths of an os.pathsep-separated list (empty entries left out)."""
    return tuple(Path(part.strip()) for part in (text or "").split(os.pathsep) if part.strip())


# ---- the command line's settings ------------------------------------------------------------------------


def settings_file(explicit: Path | None = None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The settings file to read: `explicit`, else ``PREFLIGHT_SETTINGS_FILE``, else ``preflight-audit.toml``
    when it exists (else none).

    :raises ConfigurationError: when a file named explicitly or by the variable does not exist.
    """
    env = os.environ if environ is None else environ
    named = explicit if explicit is not None else (Path(env[SETTINGS_FILE_VAR]) if env.get(SETTINGS_FILE_VAR) else None)
    if named is not None:
        if not named.is_file():
            from preflight_audit.errors import ConfigurationError

            raise ConfigurationError(f"settings file {named} does not exist")
        return named
    return DEFAULT_SETTINGS_FILE if DEFAULT_SETTINGS_FILE.is_file() else None


def load_settings(file: Path | None = None, **overrides: Any) -> Settings:
    """The settings: `overrides` (command-line options; None values are left out), then the environment,
    then the settings file (see `settings_file`), then the defaults.

    :raises ConfigurationError: naming each unusable setting, or an unreadable settings file.
    """
    return _load(settings_file(file), {k: v for k, v in overrides.items() if v is not None})


def _named(path: Path | None, given: Mapping[str, Any]) -> set[str]:
    """The settings someone named: on the command line (`given`), in a ``PREFLIGHT_*`` variable or in the
    settings file at `path`; the rest are at their defaults."""
    from_env = Variables(Settings, None)()
    from_file = TomlConfigSettingsSource(Settings, toml_file=path)() if path is not None else {}
    return set(given) | set(from_env) | set(from_file)


def reads_the_demo(settings: Settings, named: set[str]) -> bool:
    """Whether a reading command falls back to the demo's database: nobody named a database (nor a lake),
    and no deployment database exists at the default path. The demo's output itself need not exist yet."""
    default = SettingFields.model_fields["database"].default
    return not {"database", "lake_catalog"} & named and settings.database == default and not settings.database.exists()


def demo_read_by_default(file: Path | None, out: Path) -> bool:
    """Whether the reading commands will read, without ``--db``, the database of a demo that writes to
    `out` (`reading_settings`): so the demo can print its commands without it."""
    path = settings_file(file)
    return out.resolve() == DEMO_OUT.resolve() and reads_the_demo(_load(path, {}), _named(path, {}))


def reading_settings(file: Path | None = None, **overrides: Any) -> tuple[Settings, str | None]:
    """The settings of a command that reads the projections (query, export, verify): `load_settings`'s,
    except when `reads_the_demo` and the demo's database (`DEMO_DATABASE`) exists: then that database is
    read, with the demo's key store (``keys/values``) and ledger key (``keys/ledger.key.pub``) where
    nobody named those either. The second value says so on the reader's behalf (None: the settings as
    they are). Nothing is ever written to the demo's files or to a deployment's by this choice; once a
    deployment's database exists at the default path (``serve`` made it), that one is read again.

    :raises ConfigurationError: as `load_settings`.
    """
    path = settings_file(file)
    given = {k: v for k, v in overrides.items() if v is not None}
    settings = _load(path, given)
    named = _named(path, given)
    if not (reads_the_demo(settings, named) and DEMO_DATABASE.is_file()):
        return settings, None
    update: dict[str, Any] = {"database": DEMO_DATABASE}
    if "key_dir" not in named:
        update["key_dir"] = DEMO_OUT / "keys" / "values"
    if not {"ledger_public_key_file", "ledger_key_file", "ledger_public_key"} & named:
        update["ledger_public_key_file"] = str(DEMO_OUT / "keys" / "ledger.key.pub")
    note = (
        f"no deployment database at {settings.database} and none named: reading the demo's, {DEMO_DATABASE}"
        " (--db or PREFLIGHT_DATABASE to read another)"
    )
    return settings.model_copy(update=update), note


def _load(path: Path | None, given: Mapping[str, Any]) -> Settings:
    from preflight_audit.errors import ConfigurationError

    try:
        with reading(Inputs(file=path)):
            return Settings(**given)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"settings file {path} is not valid TOML: {exc}") from exc
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc, path)) from exc


def _describe(exc: ValidationError, path: Path | None) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "settings"
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "not a setting"
        problems.append(f"{where}: {message}")
    origin = f" (from options, PREFLIGHT_* variables or {path})" if path else " (from options or PREFLIGHT_* variables)"
    return "invalid settings: " + "; ".join(problems) + origin


@dataclass(frozen=True)
class SettingRow:
    """One line of `preflight-audit settings`: a setting, its variable, its value, default and origin."""

    name: str
    variable: str
    value: str
    default: str
    origin: Origin
    description: str
    secret: bool = False


_MASK: Final = "********"


def _shown(value: Any, *, secret: bool) -> str:
    if value is None:
        return "-"
    if secret:
        return _MASK
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def explain(file: Path | None = None, **overrides: Any) -> tuple[Settings, list[SettingRow]]:
    """The settings `load_settings` makes, and per setting where its value came from: the command line
    (`overrides`), the environment, the settings file or the default. Secrets are masked. The first row is
    the settings file itself.

    :raises ConfigurationError: as `load_settings`.
    """
    path = settings_file(file)
    given = {k: v for k, v in overrides.items() if v is not None}
    settings = _load(path, given)
    from_env = Variables(Settings, None)()
    from_file = TomlConfigSettingsSource(Settings, toml_file=path)() if path is not None else {}
    rows = [
        SettingRow(
            "settings_file",
            SETTINGS_FILE_VAR,
            str(path) if path is not None else "-",
            str(DEFAULT_SETTINGS_FILE) + " (when it exists)",
            "command line" if file is not None else "environment" if os.environ.get(SETTINGS_FILE_VAR) else "default",
            "the settings file (TOML; keys are the names below)",
        )
    ]
    for name, field in Settings.model_fields.items():
        secret = SecretStr in (field.annotation, *get_args(field.annotation))
        origin: Origin = (
            "command line"
            if name in given
            else "environment"
            if name in from_env
            else "settings file"
            if name in from_file
            else "default"
        )
        rows.append(
            SettingRow(
                name,
                env_var(name),
                _shown(getattr(settings, name), secret=secret),
                _shown(field.default, secret=secret),
                origin,
                field.description or "",
                secret,
            )
        )
    return settings, rows
