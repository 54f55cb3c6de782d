"""The command line's settings: one frozen object from arguments, ``PREFLIGHT_*`` variables and a TOML file.

Precedence, highest first: command-line options, environment variables (``PREFLIGHT_<FIELD>``), the
settings file, the defaults below. The settings file is ``preflight-audit.toml`` in the working
directory when it exists, or the file ``PREFLIGHT_SETTINGS_FILE`` (or ``--settings``) names, which
must then exist. Its keys are the field names::

    broker = "127.0.0.1:9092"
    events_topic = "preflight.events"
    events_partitions = 2
    database = "var/preflight.duckdb"
    api_port = 8000
    key_dir = "var/keys"
    api_tokens_file = "api-tokens.txt"

Keys and tokens (see the README, "Command line" and "HTTP API"): ``key_dir`` holds the per-user keys values
are sealed with (`preflight.protect.FileKeyStore`; keep it out of backups, erasing a user destroys
theirs); ``decision_key`` the Ed25519 key that signs `execute` decisions (PKCS#8 PEM; when it is not
set, ``serve`` creates ``<data_dir>/decision.key`` on first use, with ``decision.key.pub`` beside it,
which the fold worker and the projector are given); ``decision_public_keys`` (PEM files, os.pathsep-separated,
``PREFLIGHT_DECISION_PUBLIC_KEYS``) further signers both trust, with ``decision_leeway_s`` seconds of
clock skew (``PREFLIGHT_DECISION_LEEWAY_S``); ``ledger_key_file`` / ``ledger_public_key_file`` the ledger's digest
keys, under the names `ledger.keys` reads (``PREFLIGHT_LEDGER_KEY_FILE``,
``PREFLIGHT_LEDGER_PUBLIC_KEY_FILE``); ``api_tokens`` (``role:token,role:token``) or
``api_tokens_file`` (one ``role:token`` a line) the bearer tokens of the HTTP API and their roles.

The variables the fold worker reads (``streams.settings.ENV_VARS``) mean the same thing here where the
names meet (``PREFLIGHT_EVENTS_TOPIC``, ``PREFLIGHT_EVENTS_PARTITIONS``, ``PREFLIGHT_DLQ_TOPIC``,
``PREFLIGHT_APP_ID``, ``PREFLIGHT_WEB_HOST``/``PREFLIGHT_WEB_PORT``); the worker's own tuning
(``PREFLIGHT_BATCH_SIZE``, ...) is read by `streams.settings.WorkerSettings.from_env` when
`Settings.worker_settings` builds the worker's settings. ``PREFLIGHT_BROKER`` picks the broker as it
does for the tests (`infra.brokers.broker_from_env`): ``embedded``, ``kafka`` or ``host:port[,...]``.
"""

from __future__ import annotations

import contextvars
import os
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from infra.brokers import Broker, ExternalBroker, broker_from_env
from infra.embedded import EmbeddedBroker
from infra.errors import BrokerConfigError
from preflight_audit.errors import ConfigurationError
from streams.errors import SettingsError as WorkerSettingsError
from streams.settings import WorkerSettings

__all__ = ["DEFAULT_SETTINGS_FILE", "SETTINGS_FILE_VAR", "Settings", "load_settings"]

#: Read when it exists in the working directory.
DEFAULT_SETTINGS_FILE = Path("preflight-audit.toml")
#: Names another settings file (which must exist).
SETTINGS_FILE_VAR = "PREFLIGHT_SETTINGS_FILE"

_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("preflight_audit_settings_file", default=None)


class Settings(BaseSettings):
    """Everything `serve`, `demo`, `query`, `replay`, `export` and `broker` need to know."""

    model_config = SettingsConfigDict(env_prefix="PREFLIGHT_", extra="forbid", frozen=True)

    broker: str = Field("embedded", description="embedded | kafka | host:port[,host:port...]")
    events_topic: str = Field("preflight.events", min_length=1, description="the one topic of all preflight events")
    events_partitions: int = Field(2, ge=1, le=1024, description="its partition count (the changelog gets as many)")
    dlq_topic: str = Field("preflight.events.dlq", min_length=1, description="the fold worker's dead-letter topic")
    app_id: str = Field("preflight-fold", min_length=1, description="the fold worker's app id (consumer group)")
    projection: str = Field("preflight-projector", min_length=1, description="the projector's name (consumer group)")
    database: Path = Field(Path("var/preflight.duckdb"), description="the projection database (DuckDB file)")
    data_dir: Path = Field(Path("var"), description="the worker's data and the logs go under it")
    api_host: str = Field("127.0.0.1", min_length=1, description="where the HTTP read API listens")
    api_port: int = Field(8000, ge=0, le=65535, description="its port (0: any free one)")
    web_host: str = Field("127.0.0.1", min_length=1, description="where the fold worker's HTTP view listens")
    web_port: int = Field(6066, ge=1, le=65535, description="its port")
    projector_host: str = Field("127.0.0.1", min_length=1, description="where serve's projector answers /metrics")
    projector_port: int = Field(
        6067, ge=0, le=65535, description="its port for /healthz, /readyz and /metrics (0: none)"
    )
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
    api_tokens: SecretStr | None = Field(None, description="the HTTP API's bearer tokens: role:token,role:token")
    api_tokens_file: Path | None = Field(None, description="a file of role:token lines (# comments)")
    ledger_key_file: Path | None = Field(None, description="the ledger's private digest key (python -m ledger keygen)")
    ledger_public_key_file: str | None = Field(
        None, description="the ledger's public key file(s), os.pathsep-separated; default <ledger_key_file>.pub"
    )

    @field_validator("broker")
    @classmethod
    def _broker(cls, value: str) -> str:
        value = value.strip()
        if value.lower() in ("", "embedded"):
            return "embedded"
        if value.lower() == "kafka":
            return "kafka"
        try:
            return ExternalBroker(value).bootstrap_servers
        except BrokerConfigError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None

    @field_validator("events_topic", "dlq_topic", "app_id", "projection", "api_host", "web_host", "projector_host")
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
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=_FILE.get()))

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
        text = self.decision_public_keys or ""
        return tuple(Path(part.strip()) for part in text.split(os.pathsep) if part.strip())

    def open_broker(self, log_dir: Path | None = None) -> Broker:
        """The configured broker, not yet started: use it in ``with``. An embedded broker logs to `log_dir`
        (default: a temporary directory removed when it stops)."""
        if self.embedded:
            return EmbeddedBroker(log_dir=log_dir)
        return broker_from_env({"PREFLIGHT_BROKER": self.broker})

    def worker_settings(
        self,
        bootstrap: str,
        environ: Mapping[str, str] | None = None,
        *,
        decision_public_keys: tuple[Path, ...] = (),
        **overrides: Any,
    ) -> WorkerSettings:
        """The fold worker's settings: what these settings say, the rest from ``PREFLIGHT_*`` as the worker
        reads it (`WorkerSettings.from_env`), `overrides` last. `decision_public_keys` are trusted in
        addition to those ``PREFLIGHT_DECISION_PUBLIC_KEYS`` (or the setting `decision_public_keys`) names.

        :raises ConfigurationError: when the worker refuses them.
        """
        values: dict[str, Any] = {
            "broker_url": bootstrap,
            "events_topic": self.events_topic,
            "partitions": self.events_partitions,
            "dlq_topic": self.dlq_topic,
            "app_id": self.app_id,
            "web_host": self.web_host,
            "web_port": self.web_port,
            "data_dir": self.data_dir / "worker",
        }
        if "decision_leeway_s" in self.model_fields_set:  # else the worker reads the variable itself
            values["decision_leeway_s"] = self.decision_leeway_s
        values.update(overrides)
        env = os.environ if environ is None else environ
        try:
            worker = WorkerSettings.from_env(env, **values)
            if decision_public_keys or self.decision_public_key_paths:
                trusted = (*worker.decision_public_keys, *self.decision_public_key_paths, *decision_public_keys)
                worker = WorkerSettings.from_env(env, **values, decision_public_keys=tuple(dict.fromkeys(trusted)))
            return worker
        except WorkerSettingsError as exc:
            raise ConfigurationError(f"fold worker settings: {exc}") from exc


def settings_file(explicit: Path | None = None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The settings file to read: `explicit`, else ``PREFLIGHT_SETTINGS_FILE``, else ``preflight-audit.toml``
    when it exists (else none).

    :raises ConfigurationError: when a file named explicitly or by the variable does not exist.
    """
    env = os.environ if environ is None else environ
    named = explicit if explicit is not None else (Path(env[SETTINGS_FILE_VAR]) if env.get(SETTINGS_FILE_VAR) else None)
    if named is not None:
        if not named.is_file():
            raise ConfigurationError(f"settings file {named} does not exist")
        return named
    return DEFAULT_SETTINGS_FILE if DEFAULT_SETTINGS_FILE.is_file() else None


@contextmanager
def _reading(path: Path | None) -> Iterator[None]:
    token = _FILE.set(path)
    try:
        yield
    finally:
        _FILE.reset(token)


def load_settings(file: Path | None = None, **overrides: Any) -> Settings:
    """The settings: `overrides` (command-line options; None values are left out), then the environment,
    then the settings file (see `settings_file`), then the defaults.

    :raises ConfigurationError: naming each unusable setting, or an unreadable settings file.
    """
    path = settings_file(file)
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        with _reading(path):
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
