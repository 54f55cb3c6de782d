"""`preflight-audit status`: a running deployment as its operator sees it -- each consumer's lag, the last
verify result, the dead letters -- read from the processes' own endpoints and from the broker.

For each consumer (the fold worker's group, the projector's):

* its own view, from its ``/metrics`` and ``/readyz``: ready or not, and per partition the stored offset
  (what it has durably folded or projected), the log's end and the lag between them;
* what an external lag monitor sees: the offsets committed to the consumer group, read from the broker,
  against the log's end (both processes commit what they stored, also when idle, so the two agree once
  they have caught up);

then the dead letters each has refused (by code) and the last `preflight-audit verify` result, which
`verify` keeps in ``<data_dir>/verify-last.json`` (`save_verify`).

Where things are: `serve` writes ``<data_dir>/serve.json`` (the broker's address -- an embedded broker's
port is chosen at start --, the worker's and the projector's endpoints); without it, the settings say
(``PREFLIGHT_BROKER`` must then name a broker: an embedded one lives only inside `serve`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from preflight_audit.settings import Settings

__all__ = [
    "SERVE_FILE",
    "VERIFY_FILE",
    "ConsumerStatus",
    "DeploymentStatus",
    "gather",
    "render",
    "save_serve",
    "save_verify",
]

#: What `serve` writes into the data directory, and what `verify` does.
SERVE_FILE = "serve.json"
VERIFY_FILE = "verify-last.json"
_TIMEOUT_S = 5.0


@dataclass
class PartitionLag:
    partition: int
    stored: int | None = None
    log_end: int | None = None
    committed: int | None = None

    @property
    def lag(self) -> int | None:
        """Messages not stored yet, as the process itself measures them (log end - stored)."""
        if self.stored is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.stored)

    @property
    def monitor_lag(self) -> int | None:
        """What an external lag monitor reads: log end - the offset committed to the group."""
        if self.log_end is None:
            return None
        return max(0, self.log_end - (self.committed or 0))


@dataclass
class ConsumerStatus:
    """One consumer: the worker or the projector."""

    name: str
    group: str
    url: str | None
    reachable: bool = False
    ready: bool = False
    reason: str = ""
    partitions: list[PartitionLag] = field(default_factory=list)
    dead_letters: dict[str, int] = field(default_factory=dict)

    @property
    def lag(self) -> int | None:
        lags = [p.lag for p in self.partitions]
        return None if not lags or any(x is None for x in lags) else sum(x for x in lags if x is not None)

    @property
    def monitor_lag(self) -> int | None:
        lags = [p.monitor_lag for p in self.partitions]
        return None if not lags or any(x is None for x in lags) else sum(x for x in lags if x is not None)


@dataclass
class DeploymentStatus:
    broker: str | None
    events_topic: str
    consumers: list[ConsumerStatus]
    verify: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)
    #: The database this status is of; the last verify counts only when it read this one.
    database: str | None = None
    #: The database the last verify read when it was another one (then `verify` is None).
    verify_elsewhere: str | None = None

    @property
    def ok(self) -> bool:
        """Every consumer reachable, ready and caught up, and the last verify (if any) passed."""
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "broker": self.broker,
            "events_topic": self.events_topic,
            "consumers": [
                {
                    **{k: v for k, v in asdict(c).items() if k != "partitions"},
                    "lag": c.lag,
                    "monitor_lag": c.monitor_lag,
                    "partitions": [{**asdict(p), "lag": p.lag, "monitor_lag": p.monitor_lag} for p in c.partitions],
                }
                for c in self.consumers
            ],
            "database": self.database,
            "verify": self.verify,
            "verify_elsewhere": self.verify_elsewhere,
            "problems": self.problems,
        }


# ---- what serve and verify leave behind -------------------------------------------------------------------


def _write_json(path: Path, body: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)


def save_serve(settings: Settings, *, broker: str, worker_url: str, projector_url: str | None) -> Path:
    """`serve` says where its pieces are (``<data_dir>/serve.json``), for `status`."""
    path = settings.data_dir / SERVE_FILE
    _write_json(
        path,
        {"broker": broker, "worker_url": worker_url, "projector_url": projector_url, "pid": os.getpid()},
    )
    return path


def save_verify(settings: Settings, *, ok: bool, summary: str, database: Path) -> Path:
    """`verify` keeps its verdict (``<data_dir>/verify-last.json``), for `status`."""
    path = settings.data_dir / VERIFY_FILE
    _write_json(
        path,
        {
            "ok": ok,
            "summary": summary,
            "database": str(database),
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    )
    return path


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        body = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return body if isinstance(body, dict) else None


# ---- reading a running deployment ---------------------------------------------------------------------------


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return int(exc.code), exc.read()


def _scrape(consumer: ConsumerStatus, prefix: str) -> None:
    """Fill `consumer` from its /readyz and /metrics (`prefix`: ``preflight_worker`` or ``preflight_projector``)."""
    assert consumer.url is not None
    try:
        code, body = _get(f"{consumer.url}/readyz")
        _, text = _get(f"{consumer.url}/metrics")
    except OSError as exc:
        consumer.reason = f"not reachable at {consumer.url}: {exc}"
        return
    consumer.reachable = True
    consumer.ready = code == 200
    if not consumer.ready:
        try:
            consumer.reason = str(json.loads(body).get("reason", "not ready"))
        except ValueError:
            consumer.reason = "not ready"
    by_partition: dict[int, PartitionLag] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == f"{prefix}_dead_letters_total":
                code_ = labels.get("code", "")
                consumer.dead_letters[code_] = consumer.dead_letters.get(code_, 0) + int(value)
                continue
            if "partition" not in labels:
                continue
            part = by_partition.setdefault(int(labels["partition"]), PartitionLag(int(labels["partition"])))
            if name == f"{prefix}_stored_offset":
                part.stored = int(value)
            elif name == f"{prefix}_log_end_offset":
                part.log_end = int(value)
    consumer.partitions = [by_partition[p] for p in sorted(by_partition)]


async def _committed(bootstrap: str, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
    """The offsets committed for `group` (OffsetFetch, as a lag monitor reads them), never joining it."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        async with asyncio.timeout(_TIMEOUT_S * 2):
            await consumer.start()
            return {p: await consumer.committed(TopicPartition(topic, p)) for p in partitions}
    finally:
        await consumer.stop()


def _same_file(recorded: str, database: Path) -> bool:
    return bool(recorded) and Path(recorded).resolve() == database.resolve()


async def gather(settings: Settings) -> DeploymentStatus:
    """Read the deployment's status (see the module doc); never raises for a piece that is down."""
    from projections import log_end_offsets

    served = _read_json(settings.data_dir / SERVE_FILE) or {}
    broker = served.get("broker") or (None if settings.embedded else settings.broker)
    worker = ConsumerStatus(
        "fold worker", settings.app_id, served.get("worker_url") or f"http://{settings.web_host}:{settings.web_port}"
    )
    projector_url = served.get("projector_url") or (
        f"http://{settings.projector_host}:{settings.projector_port}" if settings.projector_port else None
    )
    projector = ConsumerStatus("projector", settings.projection, projector_url)
    verify = _read_json(settings.data_dir / VERIFY_FILE)
    elsewhere = None
    if verify is not None and not _same_file(str(verify.get("database", "")), settings.database):
        elsewhere, verify = str(verify.get("database")), None  # a verify of another database says nothing here
    status = DeploymentStatus(
        broker,
        settings.events_topic,
        [worker, projector],
        verify,
        database=str(settings.database),
        verify_elsewhere=elsewhere,
    )
    await asyncio.to_thread(_scrape, worker, "preflight_worker")
    if projector.url is not None:
        await asyncio.to_thread(_scrape, projector, "preflight_projector")
    else:
        projector.reason = "no endpoint: set projector_port (PREFLIGHT_PROJECTOR_PORT)"
    partitions = list(range(settings.events_partitions))
    if broker is None:
        status.problems.append("no broker address: serve.json is missing and PREFLIGHT_BROKER is 'embedded'")
    else:
        try:
            ends = await log_end_offsets(broker, settings.events_topic, partitions, timeout_s=_TIMEOUT_S * 2)
            for consumer in (worker, projector):
                committed = await _committed(broker, consumer.group, settings.events_topic, partitions)
                known = {p.partition: p for p in consumer.partitions}
                for p in partitions:
                    part = known.setdefault(p, PartitionLag(p))
                    part.committed = committed.get(p)
                    part.log_end = ends.get(p) if part.log_end is None else max(part.log_end, ends.get(p, 0))
                consumer.partitions = [known[p] for p in sorted(known)]
        except Exception as exc:
            status.problems.append(f"the broker at {broker} did not answer: {type(exc).__name__}: {exc}")
    for consumer in (worker, projector):
        if not consumer.reachable:
            status.problems.append(f"the {consumer.name}: {consumer.reason or 'not reachable'}")
        elif not consumer.ready:
            status.problems.append(f"the {consumer.name} is not ready: {consumer.reason}")
        elif consumer.lag:
            status.problems.append(f"the {consumer.name} lags {consumer.lag} messages")
    if status.verify is not None and not status.verify.get("ok"):
        status.problems.append(f"the last verify failed: {status.verify.get('summary')}")
    return status


# ---- printing -------------------------------------------------------------------------------------------------


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def render(status: DeploymentStatus, console: Any) -> None:
    """The status as tables on `console` (a rich Console)."""
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]preflight-audit status[/]  broker {status.broker or '?'}, events {status.events_topic}")
    table = Table("consumer", "group", "state", "partition", "stored", "log end", "lag", "committed", "monitor lag")
    for consumer in status.consumers:
        state = "ready" if consumer.ready else ("not ready" if consumer.reachable else "down")
        rows = consumer.partitions or [PartitionLag(-1)]
        for index, part in enumerate(rows):
            table.add_row(
                consumer.name if index == 0 else "",
                consumer.group if index == 0 else "",
                state if index == 0 else "",
                str(part.partition) if part.partition >= 0 else "-",
                _n(part.stored),
                _n(part.log_end),
                _n(part.lag),
                _n(part.committed),
                _n(part.monitor_lag),
            )
    console.print(table)
    for consumer in status.consumers:
        letters = sum(consumer.dead_letters.values())
        detail = ", ".join(f"{code} {n}" for code, n in sorted(consumer.dead_letters.items()))
        console.print(f"dead letters ({consumer.name}): {letters}" + (f" ({escape(detail)})" if detail else ""))
    verify = status.verify
    if verify is None and status.verify_elsewhere is not None:
        console.print(
            f"last verify: none recorded for {escape(str(status.database))} (the last one read"
            f" {escape(status.verify_elsewhere)}; run `preflight-audit verify --db {escape(str(status.database))}`)",
            soft_wrap=True,
        )
    elif verify is None:
        console.print("last verify: none recorded (run `preflight-audit verify`)")
    else:
        verdict = "[green]ok[/]" if verify.get("ok") else "[red]FAILED[/]"
        console.print(f"last verify: {verdict} at {verify.get('at')}: {escape(str(verify.get('summary')))}")
    for problem in status.problems:
        console.print(f"[red]problem:[/] {escape(problem)}", soft_wrap=True)
    if status.ok:
        console.print("[green]all consumers ready and caught up[/]")
