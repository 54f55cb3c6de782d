"""Every ``PREFLIGHT_*`` setting, declared once: the one settings model of the whole deployment.

`Settings` (pydantic-settings) names, types, defaults and explains every variable the command line, the
fold worker, the projector, the ledger and the brokers read; nothing else in the project reads a
``PREFLIGHT_*`` variable. The parts take their values as arguments: the command line loads the model
(`load_settings`) and hands each part what it needs (`Settings.worker_settings`, `Settings.open_broker`,
the keys and tokens); a part's own entry point -- ``faust -A streams.app worker``, ``python -m
projections``, ``python -m ledger``, the test suite's broker -- reads its variables through this model
too (`given_settings`), so each name has one parse rule. `preflight-audit settings` lists every setting,
its default, its current value and where that came from (`explain`), secrets masked.

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

This module imports nothing but pydantic, pydantic-settings and the standard library, so that every
part can read its settings through it.
"""

from __future__ import annotations

import contextvars
import os
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

if TYPE_CHECKING:
    from infra.brokers import Broker
    from streams.settings import WorkerSettings

__all__ = [
    "DEFAULT_SETTINGS_FILE",
    "ENV_PREFIX",
    "SETTINGS_FILE_VAR",
    "TEST_SUITE_VARIABLES",
    "Origin",
    "SettingRow",
    "SettingValueError",
    "Settings",
    "env_var",
    "explain",
    "given_settings",
    "load_settings",
    "settings_file",
]

#: Every setting's variable is this prefix and the field's name in upper case.
ENV_PREFIX: Final = "PREFLIGHT_"
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

Origin = Literal["default", "environment", "settings file", "command line"]


class Settings(BaseSettings):
    """Every setting of the deployment: the command line's, the fold worker's, the projector's, the ledger's."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    # ---- where the events go ----------------------------------------------------------------------------
    broker: str = Field("embedded", description="embedded | kafka | host:port[,host:port...]")
    events_topic: str = Field("preflight.events", min_length=1, description="the one topic of all preflight events")
    events_partitions: int = Field(2, ge=1, le=1024, description="its partition count (the changelog gets as many)")
    dlq_topic: str = Field("preflight.events.dlq", min_length=1, description="the fold worker's dead-letter topic")
    app_id: str = Field("preflight-fold", min_length=1, description="the fold worker's app id (consumer group)")
    projection: str = Field("preflight-projector", min_length=1, description="the projector's name (consumer group)")
    # ---- files ------------------------------------------------------------------------------------------
    database: Path = Field(Path("var/preflight.duckdb"), description="the projection database (DuckDB file)")
    data_dir: Path = Field(
        Path("var"),
        description="the data directory: the command line's logs and its fold worker's data (<data_dir>/worker);"
        " a fold worker started on its own keeps its Faust data here",
    )
    # ---- the HTTP read API ------------------------------------------------------------------------------
    api_host: str = Field("127.0.0.1", min_length=1, description="where the HTTP read API listens")
    api_port: int = Field(8000, ge=0, le=65535, description="its port (0: any free one)")
    api_tokens: SecretStr | None = Field(None, description="the HTTP API's bearer tokens: role:token,role:token")
    api_tokens_file: Path | None = Field(None, description="a file of role:token lines (# comments)")
    questions_file: Path | None = Field(
        None, description="the gateway's questions store (SQLite), answered in the console at /console/questions"
    )
    users_tokens_file: Path | None = Field(
        None, description="a file of user:token lines: who signs in to the console to answer their questions"
    )
    api_header_timeout_s: float = Field(
        10.0, gt=0, le=3600, allow_inf_nan=False, description="a connection's request headers must arrive within this"
    )
    api_limit_concurrency: int = Field(
        512, ge=1, description="connections and requests the HTTP API serves at once (beyond: 503 at once)"
    )
    # ---- the fold worker --------------------------------------------------------------------------------
    web_host: str = Field("127.0.0.1", min_length=1, description="where the fold worker's HTTP view listens")
    web_port: int = Field(6066, ge=1, le=65535, description="its port")
    projector_host: str = Field("127.0.0.1", min_length=1, description="where serve's projector answers /metrics")
    projector_port: int = Field(
        6067, ge=0, le=65535, description="its port for /healthz, /readyz and /metrics (0: none)"
    )
    broker_url: str | None = Field(
        None,
        min_length=1,
        description="the fold worker's bootstrap host:port[,...] when it is started on its own"
        " (serve and demo set it to their broker's)",
    )
    table: str = Field(
        "fold", min_length=1, description="the fold worker's table (changelog <app_id>-<table>-changelog)"
    )
    batch_size: int = Field(5000, ge=1, description="the fold worker's batch bound (take_events)")
    batch_within_s: float = Field(
        0.2, gt=0, allow_inf_nan=False, description="the fold worker's batch window, in seconds"
    )
    session_timeout_s: float = Field(
        10.0,
        ge=1,
        le=300,
        allow_inf_nan=False,
        description="the fold worker's consumer-group session timeout, in seconds (Tansu holds a join for about"
        " half of it: a restart's wait; Apache Kafka accepts 6 to 1800 by default)",
    )
    catch_up: bool = Field(
        True, description="the fold worker folds the log's backlog from the log itself at start (benchmarks: off)"
    )
    profile: Path | None = Field(None, description="the fold worker profiles its loop into this file (bench/fold.py)")
    group_instance_id: str | None = Field(
        None,
        min_length=1,
        description="the fold worker's name in its consumer group and its Kafka client id"
        " (default: made on the first start and kept in its data directory)",
    )
    # ---- signed decisions and sealed values -------------------------------------------------------------
    key_dir: Path = Field(Path("var/keys"), description="the per-user keys field values are sealed with")
    decision_key: Path | None = Field(
        None, description="the Ed25519 private key (PEM) signing execute decisions; default <data_dir>/decision.key"
    )
    decision_public_keys: str | None = Field(
        None,
        description="public keys (PEM files, os.pathsep-separated) of further decision signers the fold worker and"
        " the projector trust: they count an outcome only for a decision a trusted key signed",
    )
    decision_leeway_s: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="clock skew allowed around a signed decision's validity period"
    )
    require_approval: bool = Field(
        False, description="engines built here (the demo's generated sessions) need an approval for writes"
    )
    # ---- the ledger -------------------------------------------------------------------------------------
    ledger_key_file: Path | None = Field(None, description="the ledger's private digest key (python -m ledger keygen)")
    ledger_key: SecretStr | None = Field(
        None, description="the ledger's private digest key itself (PEM, or 32 raw bytes as hex or base64)"
    )
    ledger_public_key_file: str | None = Field(
        None, description="the ledger's public key file(s), os.pathsep-separated; default <ledger_key_file>.pub"
    )
    ledger_public_key: str | None = Field(None, description="the ledger's public key itself (PEM, hex or base64)")
    # ---- the projector ----------------------------------------------------------------------------------
    native_decode: bool = Field(
        True,
        description="the projector uses its compiled check (native/) when it is installed; off: the same work in"
        " Python (read when projections.decode is imported)",
    )

    @field_validator("broker")
    @classmethod
    def _broker(cls, value: str) -> str:
        value = value.strip()
        if value.lower() in ("", "embedded"):
            return "embedded"
        if value.lower() == "kafka":
            return "kafka"
        from infra.brokers import ExternalBroker
        from infra.errors import BrokerConfigError

        try:
            return ExternalBroker(value).bootstrap_servers
        except BrokerConfigError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None

    @field_validator(
        "events_topic", "dlq_topic", "app_id", "projection", "api_host", "web_host", "table", "projector_host"
    )
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value.strip()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        inputs = _INPUTS.get() or _Inputs()
        return (
            init_settings,
            _Variables(settings_cls, inputs.environ),
            TomlConfigSettingsSource(settings_cls, toml_file=inputs.file),
        )

    # ---- what the settings make -------------------------------------------------------------------------

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
            "decision_public_keys": tuple(dict.fromkeys((*self.decision_public_key_paths, *decision_public_keys))),
            "decision_leeway_s": self.decision_leeway_s,
        }
        values.update(overrides)
        try:
            return WorkerSettings(**values)
        except WorkerSettingsError as exc:
            raise ConfigurationError(f"fold worker settings: {exc}") from exc


def env_var(name: str) -> str:
    """The variable of setting `name` (``PREFLIGHT_`` and the name in upper case)."""
    if name not in Settings.model_fields:
        raise KeyError(f"{name!r} is not a setting")
    return ENV_PREFIX + name.upper()


def _paths(text: str | None) -> tuple[Path, ...]:
    """The paths of an os.pathsep-separated list (empty entries left out)."""
    return tuple(Path(part.strip()) for part in (text or "").split(os.pathsep) if part.strip())


# ---- reading the variables ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Inputs:
    file: Path | None = None
    environ: Mapping[str, str] | None = None  # None: the process environment


_INPUTS: contextvars.ContextVar[_Inputs | None] = contextvars.ContextVar(
    "preflight_audit_settings_inputs", default=None
)


class _Variables(PydanticBaseSettingsSource):
    """The ``PREFLIGHT_*`` variables of `environ` (default: the process environment), each as the text the
    field parses; an empty variable counts as unset."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str] | None) -> None:
        super().__init__(settings_cls)
        self._environ = os.environ if environ is None else environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raw = self._environ.get(ENV_PREFIX + field_name.upper(), "").strip()
        return (raw or None), field_name, False

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            if value is not None:
                found[name] = value
        return found


@contextmanager
def _reading(inputs: _Inputs) -> Iterator[None]:
    token = _INPUTS.set(inputs)
    try:
        yield
    finally:
        _INPUTS.reset(token)


class SettingValueError(ValueError):
    """A ``PREFLIGHT_*`` variable holds a value its setting cannot take: the message names the variable."""

    def __init__(self, variable: str, raw: str, problem: str) -> None:
        self.variable, self.raw, self.problem = variable, raw, problem
        super().__init__(f"{variable}={raw!r}{' ' if problem.startswith('is ') else ': '}{problem}")


_PROBLEMS: Final = {
    "int_parsing": "is not a number",
    "float_parsing": "is not a number",
    "bool_parsing": "is not a flag (use 1 or 0)",
}


def given_settings(environ: Mapping[str, str] | None, *names: str) -> dict[str, Any]:
    """The settings among `names` whose variables `environ` (default: the process environment) sets, each
    parsed and checked by `Settings`; a setting whose variable is unset or empty is left out, so that the
    part reading them keeps its own default. Other variables are not looked at.

    :raises SettingValueError: naming the first variable whose value its setting cannot take.
    """
    env = os.environ if environ is None else environ
    given = {var: raw for name in names if (raw := env.get(var := env_var(name), "").strip())}
    try:
        with _reading(_Inputs(file=None, environ=given)):
            settings = Settings()
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else names[0]
        var = env_var(name)
        problem = _PROBLEMS.get(error["type"], str(error["msg"]).removeprefix("Value error, "))
        raise SettingValueError(var, given.get(var, ""), problem) from None
    return {name: getattr(settings, name) for name in names if env_var(name) in given}


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


def _load(path: Path | None, given: Mapping[str, Any]) -> Settings:
    from preflight_audit.errors import ConfigurationError

    try:
        with _reading(_Inputs(file=path)):
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
    from_env = _Variables(Settings, None)()
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
