"""The settings floor: every ``PREFLIGHT_*`` setting declared once, and how a part reads the ones it needs.

`SettingFields` names, types, defaults, checks and explains every variable (pydantic-settings);
`env_var` is a setting's variable; `given_settings` reads the variables a part needs, each parsed by its
field's one rule (`SettingValueError` names the variable it cannot take). Every room -- the fold worker
(`streams`), the projector (`projections`), the ledger, the brokers (`infra`) -- reads its settings
here, and the command line composes them (`preflight_audit.settings.Settings`: loading, precedence,
what the settings make). It sits on the ground floor beside the engine: it imports nothing of the
project, only pydantic, pydantic-settings and the standard library, so any floor may import it.

The broker's address rule (`bootstrap_address`) lives here too: the setting checks it, and the brokers
(`infra.brokers.ExternalBroker`) apply the same rule.
"""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

__all__ = [
    "ENV_PREFIX",
    "Inputs",
    "SettingFields",
    "SettingValueError",
    "Variables",
    "bootstrap_address",
    "env_var",
    "given_settings",
    "reading",
]

#: Every setting's variable is this prefix and the field's name in upper case.
ENV_PREFIX: Final = "PREFLIGHT_"

_ADDRESS = re.compile(r"^[A-Za-z0-9_.\-]+:\d{1,5}$|^\[[0-9A-Fa-f:]+\]:\d{1,5}$")


def bootstrap_address(value: str) -> str:
    """A broker's bootstrap address, ``host:port[,host:port...]``, with whitespace trimmed.

    :raises ValueError: naming each entry that is not an address."""
    entries = [entry.strip() for entry in value.split(",")]
    bad = [entry for entry in entries if not _ADDRESS.match(entry)]
    if bad:
        raise ValueError(
            "expected 'embedded', 'kafka' or host:port[,host:port...];"
            f" not an address: {', '.join(repr(entry) for entry in bad)}"
        )
    return ",".join(entries)


class SettingFields(BaseSettings):
    """Every setting of the deployment, declared: name, type, default, rule and description (the command line's,
    the fold worker's, the projector's, the ledger's). `preflight_audit.settings.Settings` adds what they make."""

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
    lake_catalog: SecretStr | None = Field(
        None,
        description="read the projections from the Iceberg lake (projections.lake) whose SQL catalog this"
        " SQLAlchemy URL names (postgresql+psycopg://user@host/db, sqlite:///path) instead of the DuckDB file",
    )
    lake_warehouse: Path = Field(Path("var/lake"), description="the lake's data files (with lake_catalog)")
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
    replication_factor: int = Field(
        1,
        ge=1,
        description="the replication factor of the topics the fold worker creates (its changelog, Faust's own);"
        " 3 on a cluster that must survive losing a broker (infra/README.md)",
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
        return bootstrap_address(value)

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
        inputs = _INPUTS.get() or Inputs()
        return (
            init_settings,
            Variables(settings_cls, inputs.environ),
            TomlConfigSettingsSource(settings_cls, toml_file=inputs.file),
        )


def env_var(name: str) -> str:
    """The variable of setting `name` (``PREFLIGHT_`` and the name in upper case)."""
    if name not in SettingFields.model_fields:
        raise KeyError(f"{name!r} is not a setting")
    return ENV_PREFIX + name.upper()


# ---- reading the variables ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """What the settings are read from: a settings file, and the variables (None: the process's)."""

    file: Path | None = None
    environ: Mapping[str, str] | None = None  # None: the process environment


_INPUTS: contextvars.ContextVar[Inputs | None] = contextvars.ContextVar("preflight_settings_inputs", default=None)


class Variables(PydanticBaseSettingsSource):
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
def reading(inputs: Inputs) -> Iterator[None]:
    """Within it, a settings model built here reads `inputs`."""
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
        with reading(Inputs(file=None, environ=given)):
            settings = SettingFields()
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else names[0]
        var = env_var(name)
        problem = _PROBLEMS.get(error["type"], str(error["msg"]).removeprefix("Value error, "))
        raise SettingValueError(var, given.get(var, ""), problem) from None
    return {name: getattr(settings, name) for name in names if env_var(name) in given}
