"""The worker's configuration: one frozen settings object, built from arguments or from the environment.

Nothing in the worker reads the environment except `WorkerSettings.from_env`, which the module-level
`streams.app.app` calls because `faust -A streams.app worker` can only name a module attribute.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from streams.errors import SettingsError

#: Environment variable -> settings field. Every variable is optional.
ENV_VARS: dict[str, str] = {
    "PREFLIGHT_BROKER_URL": "broker_url",
    "PREFLIGHT_EVENTS_TOPIC": "events_topic",
    "PREFLIGHT_EVENTS_PARTITIONS": "partitions",
    "PREFLIGHT_DLQ_TOPIC": "dlq_topic",
    "PREFLIGHT_APP_ID": "app_id",
    "PREFLIGHT_TABLE": "table_name",
    "PREFLIGHT_WEB_HOST": "web_host",
    "PREFLIGHT_WEB_PORT": "web_port",
    "PREFLIGHT_DATA_DIR": "data_dir",
    "PREFLIGHT_BATCH_SIZE": "batch_size",
    "PREFLIGHT_BATCH_WITHIN_S": "batch_within_s",
    "PREFLIGHT_PROFILE": "profile_path",
    "PREFLIGHT_CATCH_UP": "catch_up",
    "PREFLIGHT_DECISION_PUBLIC_KEYS": "decision_public_keys",
    "PREFLIGHT_DECISION_LEEWAY_S": "decision_leeway_s",
    "PREFLIGHT_GROUP_INSTANCE_ID": "group_instance_id",
}

_INT_FIELDS = ("partitions", "web_port", "batch_size")
_FLOAT_FIELDS = ("batch_within_s", "decision_leeway_s")


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
        """Settings from ``PREFLIGHT_*`` variables (see `ENV_VARS`); `overrides` win over both.

        :raises SettingsError: naming the variable whose value is not usable.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for var, name in ENV_VARS.items():
            raw = env.get(var, "").strip()
            if not raw:
                continue
            try:
                if name in _INT_FIELDS:
                    values[name] = int(raw)
                elif name in _FLOAT_FIELDS:
                    values[name] = float(raw)
                elif name in ("data_dir", "profile_path"):
                    values[name] = Path(raw)
                elif name == "catch_up":
                    values[name] = _flag(var, raw)
                elif name == "decision_public_keys":
                    values[name] = tuple(Path(part) for part in raw.split(os.pathsep) if part.strip())
                else:
                    values[name] = raw
            except ValueError as exc:
                raise SettingsError(f"{var}={raw!r} is not a number") from exc
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


def _flag(var: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{var}={raw!r} is not a flag (use 1 or 0)")
