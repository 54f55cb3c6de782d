"""Shared machinery of the reliability suite: real runs published by agents, processes to kill, and the audit.

The audit is in the style of Kafka's own exactly-once system tests: it compares *sets*. What the
publisher was told was acknowledged is compared with what the projector archived (lost, duplicated,
differing, unexpected); every archived run must have a contiguous `seq` and a chain that verifies;
the live projection must equal a rebuild from offset 0 (`projections.replay`); every baseline the
worker serves must equal a pure fold (`preflight.fold.evolve`) of the archive. `Counts` holds the
figures; `report` prints them and keeps them for the terminal summary (see ``conftest.py``).

Fault injection: `kill_cycles()` reads how many kills a test makes (``PREFLIGHT_SOAK_CYCLES``,
default 20; ``make soak`` sets 50); `fault_rng()` the seed of the random kill points
(``PREFLIGHT_FAULT_SEED`` replays one). Random delays before a kill are the injection; every *wait*
polls with a deadline.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.admin import DescribeGroupsRequest
from aiokafka.protocol.group import LeaveGroupRequest

from infra.brokers import ENV_VAR
from infra.kafka import ApacheKafkaBroker
from preflight import MemoryStorage, Preflight, PreflightEvent, RecordingError, create_preflight, decode_event
from preflight import scenario as sc
from preflight.adapters.kafka import KafkaEventSink
from preflight.errors import ChainError, EventDecodeError
from preflight.events import encode_event, encode_message, kafka_key, verify_run
from preflight.fold import Position, baseline_json, evolve
from preflight.records import UNKEYED_RECORD_KEY
from projections import Projector, ProjectorStats, compare_projections, log_end_offsets, replay
from streams.view import totals as fold_totals
from tests.integration.worker_harness import DECISION_OF, OUTCOME_HOOKS, OUTCOME_INPUT, WorkerRig

ROOT = Path(__file__).resolve().parents[2]

#: How many kills a fault test makes; CI runs the default, ``make soak`` sets 50.
SOAK_ENV = "PREFLIGHT_SOAK_CYCLES"
DEFAULT_CYCLES = 20
#: Replays the random kill points of an earlier run (every test prints the seed it used).
SEED_ENV = "PREFLIGHT_FAULT_SEED"
#: Bound on any one phase: publishing, a process becoming ready, projecting or folding to the end.
PHASE_TIMEOUT_S = 90.0
PARTITIONS = 2
#: The outcome of each run in turn: every decision, executions that succeed and fail.
OUTCOMES = ("executed", "ask_user", "executed", "deferred", "ask_user", "failed", "executed", "hold", "ask_user")

Message = tuple[PreflightEvent, ...]


def kill_cycles() -> int:
    """How many kill cycles a fault test runs (``PREFLIGHT_SOAK_CYCLES``, default 20)."""
    raw = os.environ.get(SOAK_ENV, "").strip()
    if not raw:
        return DEFAULT_CYCLES
    try:
        cycles = int(raw)
    except ValueError:
        raise ValueError(f"{SOAK_ENV}={raw!r} is not a whole number") from None
    if cycles < 1:
        raise ValueError(f"{SOAK_ENV}={raw!r}: at least one cycle")
    return cycles


def fault_rng() -> tuple[random.Random, int]:
    """A random source for kill points and its seed (``PREFLIGHT_FAULT_SEED`` to replay one)."""
    raw = os.environ.get(SEED_ENV, "").strip()
    seed = int(raw) if raw else random.SystemRandom().randrange(2**32)
    return random.Random(seed), seed


def broker_kind() -> str:
    return os.environ.get(ENV_VAR, "").strip().lower() or "embedded"


async def restart_mid_stream(
    broker: ApacheKafkaBroker, ledger: Ledger, rng: random.Random, *, hard: bool
) -> tuple[int, float]:
    """The fault of the broker-restart tests, while a stream is being published: at a random point of it the
    broker is halted (`hard`: SIGKILLed), kept down a random 1-3 s, and started again (a bounded start).
    Returns how many publishes the ledger held when the broker was halted, and the seconds it was down."""
    await asyncio.sleep(rng.uniform(0.2, 1.0))  # the fault: a random point of the stream
    stopped_at = len(ledger.attempts)
    await asyncio.to_thread(broker.halt, hard=hard)
    down_s = rng.uniform(1.0, 3.0)
    await asyncio.sleep(down_s)  # the fault: how long the broker stays down
    await asyncio.to_thread(broker.start)
    return stopped_at, down_s


# ---- the published side: agents running the real engine -------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One `publish` call: its events, and whether the sink said they were acknowledged (and where)."""

    events: Message
    acked: bool
    position: tuple[int, int] | None = None
    error: str | None = None


@dataclass
class Ledger:
    """Every publish attempt, in the order they finished."""

    attempts: list[Attempt] = field(default_factory=list)

    def events(self, *, acked: bool) -> dict[str, bytes]:
        """event_id -> the canonical bytes published, of the acknowledged (or unacknowledged) attempts."""
        return {e.event_id: encode_event(e) for a in self.attempts if a.acked is acked for e in a.events}

    def action_keys(self) -> set[str]:
        return {kafka_key(a.events) for a in self.attempts}

    @property
    def acked_messages(self) -> int:
        return sum(1 for a in self.attempts if a.acked)

    @property
    def failed_messages(self) -> int:
        return sum(1 for a in self.attempts if not a.acked)


class LedgerSink:
    """An `EventSink` in front of a `KafkaEventSink` that writes every attempt into a `Ledger`.

    An attempt counts as acknowledged only when `publish` returned; its position is the sink's
    acknowledged position for the key right after (one agent per key, so no other publish races it)."""

    def __init__(self, inner: KafkaEventSink, ledger: Ledger) -> None:
        self.inner = inner
        self.ledger = ledger

    async def publish(self, events: Sequence[PreflightEvent]) -> None:
        message = tuple(events)
        try:
            await self.inner.publish(message)
        except Exception as exc:
            self.ledger.attempts.append(Attempt(message, acked=False, error=f"{type(exc).__name__}: {exc}"))
            raise
        position = self.inner.acked_position(kafka_key(message))
        self.ledger.attempts.append(Attempt(message, acked=True, position=position))


class MessageSink:
    """An `EventSink` that keeps each publish as one message, as `KafkaEventSink` would send it."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def publish(self, events: Sequence[PreflightEvent]) -> None:
        self.messages.append(tuple(events))

    def encoded(self) -> list[tuple[bytes, bytes]]:
        """Each message as the (key, value) a `KafkaEventSink` publishes."""
        return [(kafka_key(m).encode(), encode_message(m)) for m in self.messages]


@dataclass(frozen=True)
class Unit:
    """One agent step: a run for `user_id` meant to end in `outcome` (executed, failed, ask_user, ...)."""

    user_id: str
    outcome: str
    account: str


class RunSource:
    """Numbered units over a fixed set of users, each user one action key (``<user>:bank.transfer``)."""

    def __init__(self, users: int = 16, prefix: str = "u") -> None:
        self.users = [f"{prefix}_{i:02d}" for i in range(users)]
        self._next = 0

    def take(self, count: int) -> list[Unit]:
        start, self._next = self._next, self._next + count
        return [
            Unit(self.users[i % len(self.users)], OUTCOMES[i % len(OUTCOMES)], f"acct-{i}")
            for i in range(start, start + count)
        ]


class Agents:
    """Agents that decide, record and execute with the real engine, publishing through one sink.

    A unit is `run` -> `record` (publish; a refusal is a `RecordingError`) -> for `execute`,
    `execute_if_ready` (publishes the outcome). Units of one user run in order on one task, as one
    agent would; users run concurrently. A `RecordingError` is the engine saying "not recorded": the
    agent carries on with its next unit, as a caller that reports the failure would.
    """

    def __init__(self, sink: Any) -> None:
        self.storage = MemoryStorage()
        self.engines: dict[str, Preflight] = {
            outcome: create_preflight(hooks=hooks, storage=self.storage, sink=sink)
            for outcome, hooks in OUTCOME_HOOKS.items()
        }
        self.recorded: list[str] = []  # run ids whose record() returned
        self.refused: list[str] = []  # run ids whose record() raised

    async def step(self, unit: Unit) -> None:
        pf = self.engines[unit.outcome]
        inputs = {**OUTCOME_INPUT.get(unit.outcome, {}), "user_answers": {"to_account": unit.account}}
        state = await pf.run(sc.transfer(user_id=unit.user_id, **inputs))
        assert state.execution_decision == DECISION_OF[unit.outcome], (unit, state.reason)
        assert state.run_ref is not None
        try:
            await pf.record(state)
        except RecordingError:
            self.refused.append(state.run_ref.run_id)
            return
        self.recorded.append(state.run_ref.run_id)
        if state.execution_decision == "execute":
            tool = _provider_ok if unit.outcome == "executed" else _provider_error
            with contextlib.suppress(RecordingError):  # the ledger has the unacknowledged outcome
                await pf.execute_if_ready(state, sc.BANK_TOOL, tool)

    async def publish(self, units: Sequence[Unit], concurrency: int = 4, pace_s: float = 0.0) -> float:
        """Run `units` (users spread over `concurrency` tasks, each pausing `pace_s` between its units,
        as an agent between tool calls); return how long it took."""
        lanes: dict[int, list[Unit]] = {}
        for unit in units:
            lanes.setdefault(self._lane(unit.user_id, concurrency), []).append(unit)

        async def lane(steps: list[Unit]) -> None:
            for index, unit in enumerate(steps):
                if index and pace_s:
                    await asyncio.sleep(pace_s)  # the load's timing, not a synchronisation
                await self.step(unit)

        began = time.monotonic()
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            await asyncio.gather(*(lane(steps) for steps in lanes.values()))
        return time.monotonic() - began

    @staticmethod
    def _lane(user_id: str, lanes: int) -> int:
        return sum(user_id.encode()) % lanes


def _provider_ok(name: str, args: dict[str, Any]) -> str:
    return "ok"


def _provider_error(name: str, args: dict[str, Any]) -> str:
    raise RuntimeError("provider error")


# ---- processes to kill ------------------------------------------------------------------------------------

_LIVE: set[ProjectorProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_LIVE):
        process.kill()


class ProjectorProcess:
    """``python -m projections ... run`` as a child in its own session, its output appended to a log file.

    `start` returns at once (`wait_started` waits, bounded, for its "partitions ... from" line);
    `kill` SIGKILLs its process group (decode workers included) and reaps it; `stop` sends SIGTERM to
    the process group, as a service manager or a terminal's Ctrl-C does (the projector finishes the
    batch in hand and stops its workers), with SIGKILL after a bound (then its exit status is -9)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        db: Path,
        log_path: Path,
        *,
        group: str = "live",
        batch_size: int = 20,
        decode_workers: int | None = None,
        ops_port: int | None = None,
        partitions: str | None = None,
    ) -> None:
        workers = [] if decode_workers is None else ["--decode-workers", str(decode_workers)]
        ops = [] if ops_port is None else ["--ops-port", str(ops_port)]
        owned = [] if partitions is None else ["--partitions", partitions]
        self.command = [
            sys.executable,
            "-m",
            "projections",
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--batch-size",
            str(batch_size),
            *workers,
            "run",
            "--db",
            str(db),
            "--group",
            group,
            *ops,
            *owned,
        ]
        self.group = group
        self.topic = topic
        self.log_path = log_path
        self._popen: subprocess.Popen[bytes] | None = None
        self._log_from = 0
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def start(self) -> None:
        if self.alive:
            return
        self.starts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}\n".encode())
            log.flush()
            self._log_from = log.tell()
            self._popen = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                cwd=ROOT,
                start_new_session=True,
            )
        _LIVE.add(self)

    def _end(self, signum: signal.Signals, timeout_s: float) -> int | None:
        popen = self._popen
        _LIVE.discard(self)
        if popen is None:
            return None
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signum)
            try:
                return popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGKILL)
                return popen.wait(timeout=10.0)
        return popen.returncode

    def kill(self) -> int | None:
        return self._end(signal.SIGKILL, 10.0)

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def kill_alone(self) -> int | None:
        """SIGKILL the projector's own process, not its process group (a crash, the OOM killer): whatever
        it started must die with it by itself."""
        popen = self._popen
        _LIVE.discard(self)
        if popen is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            popen.kill()
        return popen.wait(timeout=10.0)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        return self._end(signal.SIGTERM, timeout_s)

    def log_since_start(self) -> str:
        return _read_from(self.log_path, self._log_from).decode("utf-8", errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    async def wait_started(self, timeout_s: float = PHASE_TIMEOUT_S) -> None:
        """Wait until this start has assigned its partitions and sought to its stored offsets."""
        needle = f"projector {self.group} on {self.topic}: partitions"
        deadline = time.monotonic() + timeout_s
        while needle not in await asyncio.to_thread(self.log_since_start):
            if not self.alive:
                raise AssertionError(f"the projector exited ({self.returncode}) while starting:\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"the projector did not start within {timeout_s:g} s:\n{self.log_tail()}")
            await asyncio.sleep(0.05)  # polling interval of a bounded wait


async def evict_dead_members(bootstrap: str, group: str) -> int:
    """Remove every member of consumer group `group` (LeaveGroup on its behalf); how many were removed.

    Only for a group whose every member was just SIGKILLed: the broker would otherwise keep the dead
    member until its session times out (10 s) and hold the next join until then -- a failure
    detector's delay this suite does not measure, paid once per kill cycle."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        async with asyncio.timeout(30.0):
            await client.bootstrap()
            node = await client.coordinator_lookup(0, group)  # 0: a consumer group's coordinator
            described = (await client.send(node, DescribeGroupsRequest([group]))).to_object()
            # Only a settled group: a member killed in the middle of a join is left to time out (Tansu
            # 0.6 wedged the group when such a member was removed).
            members = [m["member_id"] for g in described["groups"] if g["state"] == "Stable" for m in g["members"]]
            for member in members:
                await client.send(node, LeaveGroupRequest(group, member))
            return len(members)
    finally:
        await client.close()


def log_size(path: Path) -> int:
    """The size of a log file now (0 if there is none): where the next start's lines begin."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def wait_for_log(
    path: Path, needle: str, since: int, *, alive: Callable[[], bool], timeout_s: float = PHASE_TIMEOUT_S
) -> None:
    """Wait (bounded) until `needle` appears in the log at `path` after byte `since`; fail if the
    process writing it (`alive`) ends first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if needle.encode() in await asyncio.to_thread(_read_from, path, since):
            return
        if not alive():
            raise AssertionError(f"the process logging to {path} exited before logging {needle!r}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"{needle!r} not logged to {path} within {timeout_s:g} s")
        await asyncio.sleep(0.05)  # polling interval of a bounded wait


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            return log.read()
    except FileNotFoundError:
        return b""


# ---- reading back -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchivedEvent:
    """One row of the projector's `archive`: the event as hashed, and where it was read."""

    event_id: str
    run_id: str
    seq: int
    action_key: str | None
    event: str
    partition: int
    offset: int
    message_index: int


def read_archive(db: Path) -> list[ArchivedEvent]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            'SELECT event_id::VARCHAR, run_id, seq, action_key, event::VARCHAR, "partition", "offset",'
            " message_index FROM archive"
        ).fetchall()
    finally:
        con.close()
    return [ArchivedEvent(str(r[0]), r[1], int(r[2]), r[3], r[4], int(r[5]), int(r[6]), int(r[7])) for r in rows]


def read_table(db: Path, name: str) -> list[dict[str, Any]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        relation = con.table(name)
        columns = relation.columns
        return [dict(zip(columns, row, strict=True)) for row in relation.fetchall()]
    finally:
        con.close()


async def read_topic(bootstrap: str, topic: str, partitions: int | None = PARTITIONS) -> list[Any]:
    """Every record of `topic` from offset 0 to its current end (bounded); `partitions=None` asks the broker."""
    if partitions is None:
        partitions = await partition_count(bootstrap, topic)
    ends = await log_end_offsets(bootstrap, topic, list(range(partitions)))
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    records: list[Any] = []
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            await consumer.seek_to_beginning(tp)
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            while [tp for tp in tps if await consumer.position(tp) < ends[tp.partition]]:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records.extend(batch)
    finally:
        await consumer.stop()
    return records


async def partition_count(bootstrap: str, topic: str) -> int:
    """How many partitions `topic` has (0: the broker does not list it)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        async with asyncio.timeout(30.0):
            await client.bootstrap()
            cluster = await client.fetch_all_metadata()
            return len(cluster.partitions_for_topic(topic) or ())
    finally:
        await client.close()


async def project_to_end(bootstrap: str, topic: str, db: Path, *, group: str = "live") -> ProjectorStats:
    """Project `topic` into `db` up to the log's current end, in this process, then stop."""
    ends = await log_end_offsets(bootstrap, topic, list(range(PARTITIONS)))
    async with Projector(db, bootstrap, topic, group_id=group, kafka_commit_interval_s=None) as projector:
        return await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)


# ---- the audit ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """What an audit found. Only `unacked_written` may be non-zero in a passing run: a message whose
    publish was not acknowledged may still reach the log ("not acknowledged" never means "not written")."""

    acknowledged: int = 0
    archived: int = 0
    lost: int = 0
    duplicated: int = 0
    differing_events: int = 0
    unexpected: int = 0
    unacked_written: int = 0
    broken_runs: int = 0
    dead_lettered: int = 0
    differing_projection_rows: int = 0
    differing_baselines: int = 0
    differing_totals: int = 0
    details: tuple[str, ...] = ()

    @property
    def differing(self) -> int:
        return self.differing_events + self.differing_projection_rows + self.differing_baselines + self.differing_totals

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.duplicated or self.differing or self.unexpected or self.broken_runs or self.dead_lettered
        )

    def explain(self) -> str:
        """The summary and the first few differences found (for an assertion message)."""
        return "\n".join([self.summary(), *self.details])

    def summary(self) -> str:
        return (
            f"lost={self.lost} duplicated={self.duplicated} differing={self.differing}"
            f" (events {self.differing_events}, projection rows {self.differing_projection_rows},"
            f" baselines {self.differing_baselines}, fold totals {self.differing_totals});"
            f" acknowledged={self.acknowledged} archived={self.archived} unexpected={self.unexpected}"
            f" unacknowledged-but-written={self.unacked_written} broken runs={self.broken_runs}"
            f" dead letters={self.dead_lettered}"
        )


def compare_events(
    acked: Mapping[str, bytes], unacked: Mapping[str, bytes], archived: Sequence[ArchivedEvent]
) -> Counts:
    """The set comparison: acknowledged events against archived ones (content compared byte for byte)."""
    by_id = Counter(row.event_id for row in archived)
    positions = {(row.run_id, row.seq) for row in archived}
    duplicated = sum(n - 1 for n in by_id.values()) + (len(by_id) - len(positions))
    lost = [event_id for event_id in acked if event_id not in by_id]
    content = {row.event_id: row.event.encode() for row in archived}
    differing = [i for i, data in acked.items() if i in content and content[i] != data]
    differing += [i for i, data in unacked.items() if i in content and content[i] != data and i not in acked]
    unexpected = [i for i in by_id if i not in acked and i not in unacked]
    written = [i for i in unacked if i in by_id and i not in acked]
    details = [f"lost {i}" for i in lost[:5]] + [f"differs {i}" for i in differing[:5]]
    details += [f"unexpected {i}" for i in unexpected[:5]]
    return Counts(
        acknowledged=len(acked),
        archived=len(archived),
        lost=len(lost),
        duplicated=duplicated,
        differing_events=len(differing),
        unexpected=len(unexpected),
        unacked_written=len(written),
        details=tuple(details),
    )


def broken_runs(archived: Sequence[ArchivedEvent]) -> list[str]:
    """Runs whose archived `seq` is not 0..n-1 or whose chain does not verify (one line each)."""
    runs: dict[str, list[ArchivedEvent]] = {}
    for row in archived:
        runs.setdefault(row.run_id, []).append(row)
    broken: list[str] = []
    for run_id, rows in runs.items():
        rows.sort(key=lambda r: r.seq)
        if [r.seq for r in rows] != list(range(len(rows))):
            broken.append(f"run {run_id}: seq {[r.seq for r in rows]}")
            continue
        try:
            verify_run([decode_event(r.event) for r in rows])
        except (ChainError, EventDecodeError) as exc:
            broken.append(f"run {run_id}: {exc}")
    return broken


def fold_archive(archived: Sequence[ArchivedEvent], topic: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The pure fold of the archive: each message rebuilt from its rows, folded in log order per key.

    Returns every key's state and the anomalies (none expected: the archive holds only accepted runs)."""
    messages: dict[tuple[int, int], list[ArchivedEvent]] = {}
    for row in archived:
        messages.setdefault((row.partition, row.offset), []).append(row)
    states: dict[str, dict[str, Any]] = {}
    anomalies: list[str] = []
    for (partition, offset), rows in sorted(messages.items()):
        rows.sort(key=lambda r: r.message_index)
        events = [json.loads(r.event) for r in rows]
        key = rows[0].action_key if rows[0].action_key is not None else UNKEYED_RECORD_KEY
        folded = evolve(states.get(key), events, Position(topic, partition, offset), key)
        if folded.outcome == "anomaly":
            anomalies.append(f"{partition}@{offset}: {folded.reason}")
            continue
        states[key] = folded.state
    return states, anomalies


BASELINE_FIELDS = ("run_id", "record", "last_hash", "next_seq", "decision_id", "offset", "partition")


def baseline_differences(
    expected: Mapping[str, Mapping[str, Any]], served: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Keys whose served baseline (the worker's ``/baseline`` body) differs from the pure fold's."""
    differing: list[str] = []
    for key in sorted(set(expected) | set(served)):
        base = (expected.get(key) or {}).get("baseline")
        body = served.get(key)
        # The fold keeps the executed run's events; its record is what they rebuild to (`baseline_json`).
        want = {**{name: base.get(name) for name in BASELINE_FIELDS}, "record": baseline_json(base)} if base else None
        got = {name: body.get(name) for name in BASELINE_FIELDS} if body and body.get("status") == "ok" else None
        if want != got:
            differing.append(f"baseline of {key}: fold of the archive {_brief(want)}, worker {_brief(got)}")
    return differing


def totals_differences(expected: Mapping[str, Mapping[str, Any]], worker_states: Mapping[str, int]) -> list[str]:
    want = fold_totals(expected)
    return [
        f"fold total {name}: archive {want.get(name, 0)}, worker {worker_states.get(name, 0)}"
        for name in sorted(set(want) | set(worker_states))
        if want.get(name, 0) != worker_states.get(name, 0)
    ]


def _brief(baseline: Mapping[str, Any] | None) -> str:
    if baseline is None:
        return "none"
    return f"run {baseline.get('run_id')} at {baseline.get('partition')}@{baseline.get('offset')}"


async def audit(
    *, bootstrap: str, topic: str, live_db: Path, rebuilt_db: Path, ledger: Ledger, worker: WorkerRig
) -> Counts:
    """Every check of the issue's list, on a live projection that is at the log's end and a running,
    caught-up worker. The stream holds only good runs: a dead letter (worker or projector) is a finding."""
    archived = read_archive(live_db)
    counts = compare_events(ledger.events(acked=True), ledger.events(acked=False), archived)
    broken = broken_runs(archived)
    expected, anomalies = fold_archive(archived, topic)
    await replay(rebuilt_db, bootstrap, topic, progress=False, timeout_s=PHASE_TIMEOUT_S)
    comparison = compare_projections(live_db, rebuilt_db)
    keys = sorted(ledger.action_keys() | set(expected))
    served = {key: await worker.baseline(key) for key in keys}
    baselines = baseline_differences(expected, served)
    worker_totals = await worker.totals()
    totals = totals_differences(expected, worker_totals["states"])
    worker_letters = int(worker_totals["messages"]["dead_letters"])
    letters = read_table(live_db, "dead_letters")
    return Counts(
        acknowledged=counts.acknowledged,
        archived=counts.archived,
        lost=counts.lost,
        duplicated=counts.duplicated,
        differing_events=counts.differing_events,
        unexpected=counts.unexpected,
        unacked_written=counts.unacked_written,
        broken_runs=len(broken) + len(anomalies),
        dead_lettered=len(letters) + worker_letters,
        differing_projection_rows=sum(left + right for left, right in comparison.differences.values()),
        differing_baselines=len(baselines),
        differing_totals=len(totals),
        details=(
            *counts.details,
            *broken[:5],
            *anomalies[:5],
            f"projection vs rebuild: {comparison}",
            *baselines[:5],
            *totals[:5],
            *(f"dead letter {r['partition']}@{r['offset']}: {r['code']}: {r['reason']}" for r in letters[:5]),
        ),
    )


#: Lines `report` printed, shown again in the terminal summary of every run (``conftest.py``).
REPORTED: list[str] = []


def report(test: str, counts: Counts, *facts: str, broker: str | None = None) -> None:
    """Print an audit's counts (and facts about the run), and keep them for the terminal summary."""
    line = f"{test} [{broker or broker_kind()}]: {counts.summary()}"
    if facts:
        line += "; " + "; ".join(facts)
    print(line)
    if not counts.ok:
        print("\n".join(f"  {detail}" for detail in counts.details))
    REPORTED.append(line)
