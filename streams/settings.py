"""The worker's configuration: one frozen settings object, built from arguments or from the environment.

Nothing in the worker reads the environment except `WorkerSettings.from_env`, which the module-level
`streams.app.app` calls because `faust -A streams.app worker` can only name a module attribute; it reads
the variables through the deployment's one settings model (`preflight_audit.settings`), which declares
each of them (`SETTINGS` maps a field here to its setting there).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from preflight_audit.settings import SettingValueError, env_var, given_settings
from streams.errors import SettingsError

#: Settings field -> the setting of `preflight_audit.settings.Settings` it is read from.
SETTINGS: dict[str, str] = {
    "broker_url": "broker_url",
    "events_topic": "events_topic",
    "partitions": "events_partitions",
    "dlq_topic": "dlq_topic",
    "app_id": "app_id",
    "table_name": "table",
    "web_host": "web_host",
    "web_port": "web_port",
    "data_dir": "data_dir",
    "batch_size": "batch_size",
    "batch_within_s": "batch_within_s",
    "session_timeout_s": "session_timeout_s",
    "profile_path": "profile",
    "catch_up": "catch_up",
    "replication_factor": "replication_factor",
    "decision_public_keys": "decision_public_keys",
    "decision_leeway_s": "decision_leeway_s",
    "group_instance_id": "group_instance_id",
}
#: Environment variable -> settings field. Every variable is optional.
ENV_VARS: dict[str, str] = {env_var(setting): name for name, setting in SETTINGS.items()}


@dataclass(frozen=True)
class WorkerSettings:
    """Everything the worker needs to know, and nothing else.

    `partitions` must equal the events topic's partition count: the table's changelog gets the same
    count (the worker checks it at start and refuses to fold otherwise). `broker_url` is
    ``host:port[,host:port]`` (a ``kafka://`` prefix is accepted). `profile_path`, when set, makes the
    worker profile its event loop and write the profile there on ``GET /fold/profile`` (for
    `bench/fold.py`). `catch_up=False` skips folding the log's backlog from the log itself at start-up
    (see `streams.app.Folder.catch_up`): only for measuring the Faust consumer path in isolation.
    `decision_public_keys` (PEM files; ``PREFLIGHT_DECISION_PUBLIC_KEYS`` separates them with the
    platform's path separator) makes the fold count an outcome only for a decision signed by one of
    them, with `decision_leeway_s` of clock skew; without keys, outcomes are checked against the
    approved decision's id, tool and arguments digest, not its signature. `group_instance_id` is the
    worker's name in its consumer group, its Kafka client id (default: an id made on the first start and
    kept in `data_dir`, see `streams.app.instance_id`): each worker of a group needs its own.
    `replication_factor` is that of the topics the worker creates (its changelog, Faust's own): 3 on a
    cluster that must lose a broker without losing the table.
    """

    broker_url: str = "127.0.0.1:9092"
    events_topic: str = "preflight.events"
    partitions: int = 1
    dlq_topic: str = "preflight.events.dlq"
    app_id: str = "preflight-fold"
    table_name: str = "fold"
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    data_dir: Path = field(default_factory=lambda: Path("var/worker"))
    batch_size: int = 5000
    batch_within_s: float = 0.2
    baseline_wait_s: float = 5.0
    session_timeout_s: float = 10.0
    profile_path: Path | None = None
    catch_up: bool = True
    decision_public_keys: tuple[Path, ...] = ()
    decision_leeway_s: float = 0.0
    group_instance_id: str | None = None
    replication_factor: int = 1

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in ("broker_url", "events_topic", "dlq_topic", "app_id", "table_name", "web_host"):
            if not str(getattr(self, name)).strip():
                problems.append(f"{name} must not be empty")
        if self.events_topic == self.dlq_topic:
            problems.append("the dead-letter topic must differ from the events topic")
        if self.partitions < 1:
            problems.append(f"partitions must be >= 1, got {self.partitions}")
        if not 0 < self.web_port < 65536:
            problems.append(f"web_port must be a TCP port, got {self.web_port}")
        if self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.batch_within_s > 0:
            problems.append(f"batch_within_s must be positive, got {self.batch_within_s}")
        if self.replication_factor < 1:
            problems.append(f"replication_factor must be >= 1, got {self.replication_factor}")
        if self.decision_leeway_s < 0:
            problems.append(f"decision_leeway_s must not be negative, got {self.decision_leeway_s}")
        if not 0 < self.baseline_wait_s <= 30:
            problems.append(f"baseline_wait_s must be in (0, 30], got {self.baseline_wait_s}")
        if problems:
            raise SettingsError("; ".join(problems))

    @property
    def bootstrap_servers(self) -> str:
        """The broker address without a ``kafka://`` scheme."""
        return ",".join(part.strip().removeprefix("kafka://") for part in self.broker_url.split(","))

    @property
    def changelog_topic(self) -> str:
        """The table's changelog topic, as Faust names it."""
        return f"{self.app_id}-{self.table_name}-changelog"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> WorkerSettings:
        """Settings from ``PREFLIGHT_*`` variables (see `SETTINGS`; default: the process environment), each
        parsed by the deployment's settings model; a variable left unset keeps the default here.
        `overrides` win over both.

        :raises SettingsError: naming the variable whose value is not usable.
        """
        try:
            given = given_settings(environ, *SETTINGS.values())
        except SettingValueError as exc:
            raise SettingsError(str(exc)) from None
        values: dict[str, object] = {}
        for name, setting in SETTINGS.items():
            if setting in given:
                value = given[setting]
                if name == "decision_public_keys":
                    value = tuple(Path(part) for part in str(value).split(os.pathsep) if part.strip())
                values[name] = value
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """The environment variables that make `from_env` rebuild these settings (for a subprocess)."""
        env: dict[str, str] = {}
        for var, name in ENV_VARS.items():
            value = getattr(self, name)
            if isinstance(value, bool):
                env[var] = "1" if value else "0"
            elif isinstance(value, tuple):
                if value:
                    env[var] = os.pathsep.join(str(part) for part in value)
            elif value is not None:
                env[var] = str(value)
        return env
