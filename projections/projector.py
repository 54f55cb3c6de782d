"""The projector: consume the events topic into a DuckDB file, each batch exactly once in effect.

It reads with its own consumer (group id = the projection's name, partitions assigned by hand, no
auto-commit) and keeps its read position in the database itself (`consumer_offsets`), written in the
same DuckDB transaction as the rows of the batch it covers. On start it seeks each partition to the
stored offset (offset 0 when none is stored). The stored offsets are also committed to Kafka, for lag
monitors, after commits (`kafka_commit_interval_s`) and whenever the projector is idle or stops, so that
what the group shows is what the database stores; they are never read back.

Per batch (`getmany`, up to `batch_size` messages): decode and verify every message and build its
rows as Arrow tables (pure: `projections.rows.prepare_all`, in `decode_workers` processes or in the
event loop), look up the stored runs the batch mentions through a second connection (it sees
committed data), and plan (pure: `projections.rows.plan_batch`) against the database as it will be
once the batch in flight commits; then hand the plan to the one writer thread, which writes its rows,
publishes its new dead letters (`projections.dlq`, acknowledged before COMMIT) and writes the new
offsets in one transaction (`projections.store.write_batch`) -- or, behind a backlog, several batches
in one (`transaction_events`). While it does, the event loop plans the next batch and the decode
workers decode the ones after it.

A crash anywhere loses at most the uncommitted batch, which is read again from the stored offsets;
a redelivered message or run changes nothing (offsets, then closing hash, then event_id). A message
that cannot be projected becomes a row in `dead_letters` and a record on the dead-letter topic (at
least once); it never stops the projector and never leaves an offset unaccounted for.

Given a `DecisionTrust` (the public keys of the engines that sign `execute` decisions), an outcome
counts only for a decision signed by one of them and valid when the outcome occurred, as in the fold
worker: the signature is checked once, when its run is decoded (`projections.signatures`), and the
verdict kept on the run's row; an outcome without a valid signed decision is a dead letter.

`run_until(end_offsets)` projects up to given offsets (tests, demo, replay); `run_forever(stop)` until
an event is set; `replay(path, ...)` rebuilds every projection from offset 0 into a fresh file, and
`projections.store.compare_projections` compares it with the live one. ``python -m projections
--help`` runs either from a shell.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import logging
import multiprocessing
import multiprocessing.resource_tracker
import os
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import duckdb
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from preflight.adapters.ops import OpsServer
from preflight.errors import SigningKeyError
from projections.decode import Incoming, Rejected
from projections.dlq import DeadLetter, DeadLetterPublisher, default_dead_letter_topic
from projections.errors import (
    BrokerError,
    DatabaseError,
    LogGapError,
    ProjectionTimeout,
    ReplayTargetExistsError,
)
from projections.metrics import ProcessFigures, projector_registry, queryable_histogram
from projections.rows import Plan, PreparedChunk, StoredRun, plan_batch, raw, to_arrow
from projections.signatures import LEEWAY_VAR, PUBLIC_KEYS_VAR, DecisionTrust, detached_checked, prepare_checked
from projections.store import (
    EventIdConflict,
    append_batch,
    compare_projections,
    load_offsets,
    lookup_runs,
    open_database,
    record_start,
    rollback,
    sql,
    taken_event_ids,
    write_batch,
)

__all__ = [
    "DECODE_NICENESS",
    "DEFAULT_GROUP",
    "DEFAULT_TOPIC",
    "Projector",
    "ProjectorStats",
    "default_decode_workers",
    "log_end_offsets",
    "main",
    "replay",
    "tune_interpreter",
]

log = logging.getLogger(__name__)

#: How often the interpreter hands the GIL over in a projector process (see `tune_interpreter`).
SWITCH_INTERVAL_S: Final = 0.001

DEFAULT_TOPIC: Final = "preflight.events"
DEFAULT_GROUP: Final = "preflight-projector"
REPLAY_GROUP: Final = "preflight-replay"
#: The decode workers' default nice increment (`Projector`'s `decode_niceness`), and the largest.
DECODE_NICENESS: Final = 10
#: Most fetched batches decoding ahead behind a backlog while the writer writes (with decode workers):
#: a DuckDB row group compressed, or a shared transaction's COMMIT, takes as long as ~10 batches'
#: decoding (bench/projector.py); each batch waiting costs its messages and rows in memory.
DECODE_AHEAD_WHILE_WRITING: Final = 8
_MAX_NICENESS: Final = 19


@dataclass
class ProjectorStats:
    """What the projector has done since it started (counters from every committed batch)."""

    counts: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    #: COMMITs of the writer (under a backlog, one commits several batches: `transaction_events`).
    transactions: int = 0
    #: Seconds spent per stage. In the event loop: fetch, decode (with decode workers: waiting for them),
    #: lookup, plan, wait (for the writer). In the writer thread: write.
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, plan: Plan) -> None:
        self.counts.update(plan.counts)
        self.batches += 1

    @property
    def events(self) -> int:
        return self.counts["events"]

    @property
    def messages(self) -> int:
        return self.counts["messages"]

    def __str__(self) -> str:
        c = self.counts
        return (
            f"{c['messages']} messages, {c['events']} events archived ({c['runs']} runs, {c['outcomes']} outcomes),"
            f" {c['duplicates']} duplicates, {c['redelivered']} redelivered, {c['dead_letters']} dead letters,"
            f" {self.batches} batches in {self.transactions} transactions"
        )


@dataclass(frozen=True)
class _Batch:
    """A planned batch on its way to the writer, with its decoded chunks (to plan it again against the
    database after an event_id conflict)."""

    prepared: list[PreparedChunk]
    plan: Plan
    tables: dict[str, Any]
    #: The Kafka timestamps (ms) of the batch's messages beyond the stored offsets, for the
    #: run-to-queryable histogram once they commit.
    stamps: tuple[int, ...] = ()


class Projector:
    """Consumes `topic` into the DuckDB file `database` (see the module doc).

    Use as ``async with Projector(path, bootstrap, topic) as p: await p.run_until(ends)``, or call
    `start` and `stop`. One projector writes a database file at a time (DuckDB allows one writing
    process); the tables are shared by whatever projection name it is given.

    :param group_id: the projection's name: its consumer group and its key in `consumer_offsets`.
    :param batch_size: most messages per batch (fetched, decoded and planned together).
    :param transaction_events: while more messages wait than a batch holds (a backlog), the batches'
        writes share one transaction until it holds this many events (or `max_transaction_s` passed):
        DuckDB writes a transaction's full row groups (122,880 rows) straight into the file,
        compressed, where smaller transactions go through the write-ahead log and are written again
        at the next checkpoint. Near the log's end every batch commits at once. 1: every batch alone.
        The batches of the open transaction stay in memory (about 1 KB an event), to be planned again
        after an event_id conflict.
    :param max_transaction_s: the longest a transaction stays open for more batches (while it is open,
        readers do not see its rows).
    :param before_commit: called in the writer thread inside each transaction, after its last write and
        before COMMIT (tests use it to kill the process at that point).
    :param on_batch: called in the event loop after each committed batch with its plan.
    :param after_commit: called in the writer thread right after each COMMIT with the plan of each batch
        it committed: the moment their rows became visible to readers (bench/freshness.py stamps it).
    :param kafka_commit_interval_s: how often, at most, to also commit the stored offsets to Kafka for lag
        monitors while batches commit (also whenever idle and at stop; ``None`` never). Never read back.
    :param decode_workers: processes that decode, verify and build rows (0: in the event loop). Decoding
        is pure Python; in other processes it runs beside the writer instead of taking turns with it
        for the GIL. `default_decode_workers()` suits a machine the projector has to itself.
    :param decode_niceness: how far below the projector's own the decode workers' scheduling priority is
        (a nice increment, 0-19). The writer is the pipeline's one serial stage, writing a batch while the
        workers decode the next ones; where the projector's threads and workers want more cores than
        there are, workers at a lower priority take the CPU the writer leaves rather than slowing it.
    :param dead_letter_topic: where dead letters are also published (`projections.dlq`); default
        ``<topic>.projector.dlq``, declared at start (one partition) if the broker does not list it.
    :param publish_dead_letters: False keeps dead letters in the `dead_letters` table only (`replay`
        does: the live projector published them already).
    :param decision_trust: whose signed decisions an outcome needs (`projections.signatures`); None
        checks no signature (an outcome must still match its approved decision).
    :param partitions: the partitions of `topic` this projector owns (None: every one). Several projectors
        share a topic by owning disjoint partitions, each in a database of its own: a key's messages are on
        one partition, so each run is whole in one file, and `projections.union.open_union` reads the files
        as one. The assignment is fixed: a projector never takes another's partitions.
    """

    def __init__(
        self,
        database: str | Path,
        bootstrap_servers: str,
        topic: str = DEFAULT_TOPIC,
        *,
        group_id: str = DEFAULT_GROUP,
        batch_size: int = 2_000,
        transaction_events: int = 245_760,
        max_transaction_s: float = 10.0,
        poll_timeout_ms: int = 200,
        start_timeout_s: float = 30.0,
        request_timeout_ms: int = 30_000,
        kafka_commit_interval_s: float | None = 5.0,
        decode_workers: int = 0,
        decode_niceness: int = DECODE_NICENESS,
        before_commit: Callable[[], None] | None = None,
        on_batch: Callable[[Plan], None] | None = None,
        after_commit: Callable[[Plan], None] | None = None,
        dead_letter_topic: str | None = None,
        publish_dead_letters: bool = True,
        decision_trust: DecisionTrust | None = None,
        partitions: Sequence[int] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if decode_workers < 0:
            raise ValueError(f"decode_workers must not be negative, got {decode_workers}")
        if not 0 <= decode_niceness <= _MAX_NICENESS:
            raise ValueError(f"decode_niceness must be within 0-{_MAX_NICENESS}, got {decode_niceness}")
        if transaction_events < 1:
            raise ValueError(f"transaction_events must be positive, got {transaction_events}")
        if max_transaction_s < 0:
            raise ValueError(f"max_transaction_s must not be negative, got {max_transaction_s}")
        self._path = Path(database)
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._group = group_id
        self._batch_size = batch_size
        self._transaction_events = transaction_events
        self._max_transaction_s = max_transaction_s
        self._poll_timeout_ms = poll_timeout_ms
        self._start_timeout_s = start_timeout_s
        self._request_timeout_ms = request_timeout_ms
        self._kafka_commit_interval_s = kafka_commit_interval_s
        self._decode_workers = decode_workers
        self._decode_niceness = decode_niceness
        self._trust = decision_trust
        self._owned = None if partitions is None else frozenset(int(p) for p in partitions)
        if self._owned is not None and not self._owned:
            raise ValueError("partitions: a projector owns at least one partition (None: every one)")
        self._pool: ProcessPoolExecutor | None = None
        self._before_commit = before_commit
        self._on_batch = on_batch
        self._after_commit = after_commit
        self._con: duckdb.DuckDBPyConnection | None = None
        self._consumer: Any = None
        self._partitions: list[Any] = []
        self._executor: ThreadPoolExecutor | None = None
        self._reader: duckdb.DuckDBPyConnection | None = None
        #: The last write handed to the writer: the plans it committed, or None (appended, not committed).
        self._pending: asyncio.Future[list[Plan] | None] | None = None
        #: In the event loop: the batches handed to the writer since its last known COMMIT, and what they
        #: change (run states, offsets, events), which the next batch is planned on top of.
        self._handed: list[_Batch] = []
        self._open_states: dict[str, StoredRun] = {}
        self._open_offsets: dict[tuple[str, int], int] = {}
        self._open_events = 0
        self._open_since: float | None = None
        #: In the writer thread: the batches written in its open DuckDB transaction (none: no transaction).
        self._transaction: list[_Batch] = []
        #: A fetched batch not handed to the writer yet, and its decoding in the workers (None: not started).
        self._decoding: list[tuple[list[Incoming], asyncio.Future[list[PreparedChunk]] | None]] = []
        #: Fetched batches decoding while the writer writes (with decode workers, two: one may take
        #: longer than a write, and the workers would then wait for the next fetch).
        self._decode_ahead = 2 if decode_workers else 1
        self._unaccounted = False
        self._committed: dict[tuple[str, int], int] = {}
        self._last_kafka_commit = -float("inf")
        #: What this process last committed to Kafka (partition -> next offset), and its failures.
        self._kafka_committed: dict[int, int] = {}
        self._kafka_commit_failures = 0
        #: Readiness: the log's end when the projector started, and when it was all committed.
        self._began = time.monotonic()
        self._ready_target: dict[int, int] | None = None
        self._recovery_s: float | None = None
        self.starts = 0
        self._log_end: dict[int, int] = {}
        self.queryable = queryable_histogram()
        self._figures = ProcessFigures(projection=group_id, topic=topic)
        self._dead_letter_topic = dead_letter_topic or default_dead_letter_topic(topic)
        if publish_dead_letters and self._dead_letter_topic == topic:
            raise ValueError(f"the dead-letter topic must differ from the events topic ({topic!r})")
        self._publisher = (
            DeadLetterPublisher(bootstrap_servers, self._dead_letter_topic) if publish_dead_letters else None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats = ProjectorStats()
        #: Near the log's end, how old the open transaction must be before a batch commits it (0: each batch
        #: commits at once). A subclass whose commits are dear raises it (`projections.lake.LakeProjector`);
        #: idle, the open transaction commits at once all the same.
        self.commit_every_s = 0.0

    # ---- lifecycle ------------------------------------------------------------------------------------

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def dead_letter_topic(self) -> str | None:
        """The topic dead letters are published to (None: they are not)."""
        return self._publisher.topic if self._publisher is not None else None

    @property
    def decode_worker_pids(self) -> list[int]:
        """The process ids of the decode workers (empty without any)."""
        processes: dict[int, Any] = getattr(self._pool, "_processes", None) or {}
        return sorted(processes)

    @property
    def partitions(self) -> list[int]:
        """The partitions of the topic this projector reads (known after `start`)."""
        return [tp.partition for tp in self._partitions]

    def committed_offsets(self) -> dict[int, int]:
        """Each partition's next offset as stored in the database by the last committed batch."""
        return {partition: offset for (topic, partition), offset in self._committed.items() if topic == self._topic}

    @property
    def ready(self) -> bool:
        """Whether the projector has committed everything the log held when it started (its recovery)."""
        return self._recovery_s is not None

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): for a readiness probe (`preflight.adapters.ops.OpsServer`); any thread."""
        if self.ready:
            return True, ""
        if self._ready_target is None:
            return False, "starting: opening the database and seeking to the stored offsets"
        return False, f"projecting the backlog the log held at start, up to {self._ready_target}"

    def _check_ready(self) -> None:
        """Become ready once everything the log held at start is committed; publish the figures."""
        if self._recovery_s is None and self._consumer is not None:
            committed = self.committed_offsets()
            target = self._ready_target
            if target is None:  # the end offsets were not read at start: the consumer's own view of the end
                target = dict(self._log_end) if len(self._log_end) == len(self._partitions) else None
            if target is not None and all(committed.get(p, 0) >= end for p, end in target.items() if end > 0):
                self._recovery_s = time.monotonic() - self._began
                log.info("projector %s ready in %.2f s (committed %s)", self._group, self._recovery_s, committed)
        self._publish_figures()

    def figures(self) -> ProcessFigures:
        """The process's own figures for the metrics, as of the last commit or fetch (any thread)."""
        return self._figures

    def _publish_figures(self) -> None:
        """Replace the figures the metrics read (in the event loop, after a commit or an idle poll)."""
        stats = self.stats
        self._figures = ProcessFigures(
            projection=self._group,
            topic=self._topic,
            ready=self.ready,
            log_end=dict(self._log_end),
            kafka_committed=dict(self._kafka_committed),
            kafka_commit_failures=self._kafka_commit_failures,
            counts=dict(stats.counts),
            batches=stats.batches,
            transactions=stats.transactions,
            starts=self.starts,
            recovery_seconds=self._recovery_s,
        )

    async def metrics_registry(self) -> Any:
        """A Prometheus registry of this projector's metrics (`projections.metrics`), reading the database
        through a cursor of its own: serve it from another thread (`preflight.adapters.ops.OpsServer`)."""
        self._require_started()
        con = self._con
        assert con is not None
        cursor = await self._in_writer(con.cursor)
        return projector_registry(cursor, self.figures, self.queryable)

    async def start(self) -> None:
        """Open and migrate the database, connect, assign every partition and seek to the stored offsets.

        :raises BrokerError: when the broker does not answer or the topic does not exist.
        :raises DatabaseError, MigrationError: when the database cannot be opened or migrated.
        """
        if self._con is not None:
            return
        self._began = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="projector-writer")
        try:
            stored = await self._open()
        except BaseException:
            await self._close_database()
            raise
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self._group,
            client_id=f"{self._group}-projector",
            enable_auto_commit=False,
            auto_offset_reset="none",  # never skip silently: a stored offset the log lost is an error
            isolation_level="read_committed",
            max_partition_fetch_bytes=16 << 20,
            fetch_max_bytes=64 << 20,
            fetch_max_wait_ms=100,
            request_timeout_ms=self._request_timeout_ms,
        )
        try:
            async with asyncio.timeout(self._start_timeout_s):
                await consumer.start()
                numbers = await _partitions_of(consumer, self._topic)
                if not numbers:
                    raise BrokerError(f"topic {self._topic!r} does not exist on {self._bootstrap}: create it first")
                if self._owned is not None and not self._owned <= numbers:
                    missing = sorted(self._owned - numbers)
                    raise BrokerError(f"topic {self._topic!r} has no partition {missing} (it has {len(numbers)})")
                owned = numbers if self._owned is None else self._owned
                self._partitions = [TopicPartition(self._topic, p) for p in sorted(owned)]
                consumer.assign(self._partitions)
                for tp in self._partitions:
                    if tp.partition in stored:
                        consumer.seek(tp, stored[tp.partition])
                    else:
                        await consumer.seek_to_beginning(tp)
            if self._publisher is not None:
                await self._publisher.start()
        except BaseException as exc:
            await consumer.stop()
            if self._publisher is not None:
                await self._publisher.stop()
            await self._close_database()
            if isinstance(exc, TimeoutError):
                raise BrokerError(f"no answer from {self._bootstrap} within {self._start_timeout_s:g} s") from exc
            if isinstance(exc, KafkaError):
                raise BrokerError(f"cannot consume {self._topic!r} from {self._bootstrap}: {exc!r}") from exc
            raise
        self._consumer = consumer
        try:
            self._ready_target = await log_end_offsets(self._bootstrap, self._topic, self.partitions)
        except BrokerError as exc:
            log.warning("no end offsets at start (%s): ready once the first fetches reach the log's end", exc)
        log.info(
            "projector %s on %s: partitions %s from %s",
            self._group,
            self._topic,
            self.partitions,
            {p: stored.get(p, 0) for p in self.partitions},
        )
        self._check_ready()

    async def _open(self) -> dict[int, int]:
        """Start the decode workers, open and migrate the database; the stored next offsets."""
        if self._decode_workers:
            # Spawned, not forked: this process already runs threads (the writer, the Kafka client).
            pool = ProcessPoolExecutor(
                self._decode_workers,
                mp_context=DecodeWorkerContext(),
                initializer=_start_decode_worker,
                initargs=(os.getpid(), self._decode_niceness),
            )
            self._pool = pool
            failure = await _start_workers(pool, self._decode_workers, self._trust)
            if failure is not None:
                # A worker's start failed, or it died while starting (killed on its own: the process
                # group's stop signals cannot kill it, `DecodeWorkerProcess`): nothing was handed to it, and
                # the event loop decodes.
                log.warning("a decode worker died while starting (%r); decoding in the event loop", failure)
                self._pool = None
                await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
        con = await self._in_writer(open_database, self._path)
        self._con = con
        self._reader = con.cursor()  # a second connection: reads committed data while the writer writes
        await self._in_writer(con.execute, sql("writer_settings"))
        stored: dict[int, int] = await self._in_writer(load_offsets, con, self._group, self._topic)
        self._committed = {(self._topic, p): o for p, o in stored.items()}
        self.starts = await self._in_writer(record_start, con, self._group)
        return stored

    async def stop(self) -> None:
        """Finish the writes handed over and commit them (or roll back whole), then disconnect and close.

        A batch fetched but not handed to the writer is dropped: the next start reads it again.
        """
        try:
            await self._drop_decoding()
            await self._settle()
        finally:  # each piece is stopped even when stopping an earlier one raised (an interrupt, say)
            consumer, self._consumer = self._consumer, None
            try:
                if consumer is not None:
                    try:
                        await self._commit_to_kafka(consumer, force=True)
                    finally:
                        await consumer.stop()
            finally:
                try:
                    await self._close_database()
                finally:
                    if self._publisher is not None:
                        await self._publisher.stop()

    async def _close_database(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
        con, self._con = self._con, None
        executor, self._executor = self._executor, None
        if con is not None and executor is not None:
            await asyncio.get_running_loop().run_in_executor(executor, con.close)
        if executor is not None:  # not on the loop: a write in flight may be waiting for it to publish
            await asyncio.to_thread(executor.shutdown, wait=True)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ---- running ----------------------------------------------------------------------------------------

    async def run_until(
        self,
        end_offsets: Mapping[int, int] | None = None,
        *,
        idle_s: float | None = None,
        timeout_s: float = 60.0,
    ) -> ProjectorStats:
        """Project until every partition's stored offset reaches `end_offsets` (partition -> next offset).

        Without `end_offsets`, the log's end offsets when the call starts are the target. With `idle_s`,
        the call also goes on until no message arrived for `idle_s` seconds. Returns once everything up
        to the target is committed.

        :raises ProjectionTimeout: when that takes longer than `timeout_s` (committed work stays).
        """
        self._require_started()
        try:
            async with asyncio.timeout(timeout_s):
                if self._unaccounted:
                    await self._rewind()
                if end_offsets is None:
                    end_offsets = await log_end_offsets(self._bootstrap, self._topic, self.partitions)
                targets = {tp: int(end_offsets.get(tp.partition, 0)) for tp in self._partitions}
                quiet_since = time.monotonic()
                while True:
                    if await self._reached(targets) and (idle_s is None or time.monotonic() - quiet_since >= idle_s):
                        await self._flush()
                        return self.stats
                    if await self._poll():
                        quiet_since = time.monotonic()
        except TimeoutError as exc:
            await self._settle()
            raise ProjectionTimeout(
                f"projector {self._group} did not reach {dict(end_offsets or {})} within {timeout_s:g} s"
                f" (committed: {self.committed_offsets()})"
            ) from exc

    async def run_forever(self, stop: asyncio.Event) -> ProjectorStats:
        """Project until `stop` is set, then finish the batches in hand and return."""
        self._require_started()
        if self._unaccounted:
            await self._rewind()
        while not stop.is_set():
            await self._poll()
        await self._flush()
        return self.stats

    async def checkpoint(self) -> None:
        """Once the batch in flight is committed, fold DuckDB's write-ahead log into the database file
        (``CHECKPOINT``): what DuckDB does by itself every `checkpoint_threshold` of log (writer_settings.sql)
        and on close. A benchmark calls it to count that work; an operator before copying the file.

        :raises DatabaseError: when DuckDB fails to checkpoint.
        """
        self._require_started()
        await self._settle()
        con = self._con
        assert con is not None
        try:
            await self._in_writer(con.execute, "CHECKPOINT")
        except duckdb.Error as exc:
            raise DatabaseError(f"checkpointing {self._path} failed: {exc}") from exc

    def _require_started(self) -> None:
        if self._consumer is None:
            raise RuntimeError("the projector is not started (call start() or use `async with`)")

    async def _reached(self, targets: Mapping[Any, int]) -> bool:
        """Whether the consumer has fetched every target (what it fetched is handed over by `_flush`)."""
        for tp, target in targets.items():
            if target > 0 and await self._consumer.position(tp) < target:
                return False
        return True

    async def _poll(self) -> int:
        """Fetch a batch and start decoding it; meanwhile hand the batch fetched before it to the writer.

        Batches in the air: the one being written (the writer thread), the one handed over next (planned
        here), and the ones fetched after it, decoding in the decode workers: two (`_decode_ahead`), and
        behind a backlog, while the writer writes, up to `DECODE_AHEAD_WHILE_WRITING` (a write that
        compresses a full row group, or the COMMIT of a shared transaction, takes as long as ten batches'
        decoding; the workers decode on meanwhile instead of waiting). Near the log's end the fetch does
        not wait for new messages while a fetched batch waits: it takes what the consumer holds. Behind a
        backlog it does (the next messages are on their way), rather than hand over with nothing decoding
        behind. The batch handed over commits at once unless a backlog waits behind it (`transaction_events`).
        """
        if self._unaccounted:
            await self._rewind()
        self._unaccounted = True  # interrupted from here on, the consumer is ahead of the database
        ahead = self._decoding
        incoming = await self._fetch(wait=not ahead)
        limit = self._decode_ahead
        if self._pool is not None and ahead and await self._lag() >= self._batch_size:
            if self._pending is not None and not self._pending.done():
                limit = DECODE_AHEAD_WHILE_WRITING
            if not incoming and len(ahead) <= limit:
                incoming = await self._fetch(wait=True)
        if incoming:
            ahead.append((incoming, self._start_decode(incoming)))
        if ahead and (len(ahead) > limit or not incoming):
            previous = ahead.pop(0)
            waiting = sum(len(messages) for messages, _ in ahead)
            if waiting < self._batch_size:
                waiting += await self._lag()
            await self._hand_over(*previous, backlog=waiting >= self._batch_size)
        elif not incoming:
            await self._settle()
            # Idle: what is stored is all there is; lag monitors must see it now, not at the next batch.
            await self._commit_to_kafka(self._consumer, force=True)
            self._check_ready()
        self._unaccounted = False
        return len(incoming)

    async def _flush(self) -> None:
        """Hand the fetched batches (if any) to the writer, and wait until everything handed over is committed."""
        if self._unaccounted:
            await self._rewind()
        ahead = self._decoding
        if ahead:
            self._unaccounted = True
            while ahead:
                previous = ahead.pop(0)
                await self._hand_over(*previous, backlog=bool(ahead))
            self._unaccounted = False
        await self._settle()

    async def _settle(self) -> None:
        """Wait for the write in flight, then commit the open transaction (if any) and wait for that."""
        await self._drain()
        if self._handed:
            self._submit(None, commit=True)
            await self._drain()

    async def _lag(self) -> int:
        """Messages the broker holds beyond what the consumer has fetched (as its last fetch responses
        told: the last stable offset, which a read_committed consumer reads up to, or the high watermark)."""
        lag = 0
        for tp in self._partitions:
            end = self._consumer.last_stable_offset(tp)
            if end is None or end < 0:
                end = self._consumer.highwater(tp)
            if end is not None:
                lag += max(0, end - await self._consumer.position(tp))
        return lag

    async def _fetch(self, *, wait: bool) -> list[Incoming]:
        """The next messages, at most `batch_size` (without `wait`, only those the consumer already holds)."""
        clock = time.perf_counter()
        try:
            batches: dict[Any, list[Any]] = await self._consumer.getmany(
                *self._partitions, timeout_ms=self._poll_timeout_ms if wait else 0, max_records=self._batch_size
            )
        except OffsetOutOfRangeError as exc:
            raise LogGapError(
                f"the log of {self._topic!r} no longer holds offsets this projection needs ({exc!r});"
                f" stored offsets: {self.committed_offsets()}"
            ) from exc
        except KafkaError as exc:
            raise BrokerError(f"reading {self._topic!r} failed: {exc!r}") from exc
        for tp in self._partitions:
            end = self._consumer.last_stable_offset(tp)
            if end is None or end < 0:
                end = self._consumer.highwater(tp)
            if end is not None:
                self._log_end[tp.partition] = int(end)
        incoming = [
            Incoming(
                tp.topic,
                tp.partition,
                record.offset,
                record.key,
                record.value,
                record.timestamp,
                tuple((str(k), bytes(v)) for k, v in record.headers) if record.headers else (),
            )
            for tp, records in batches.items()
            for record in records
        ]
        self.stats.seconds["fetch"] += time.perf_counter() - clock
        return incoming

    def _start_decode(self, incoming: list[Incoming]) -> asyncio.Future[list[PreparedChunk]] | None:
        """Start decoding in the decode workers (None without any: `_hand_over` decodes in the event loop)."""
        if self._pool is None:
            return None
        return asyncio.ensure_future(self._prepared(incoming))

    async def _hand_over(
        self,
        incoming: list[Incoming],
        decoding: asyncio.Future[list[PreparedChunk]] | None,
        *,
        backlog: bool,
    ) -> None:
        """Plan a fetched batch once it is decoded, wait for the write in flight, and submit this one: to
        be committed at once, or -- under a `backlog`, while the open transaction is small and young --
        with the batches after it."""
        seconds = self.stats.seconds
        clock = time.perf_counter()
        prepared = await decoding if decoding is not None else [prepare_checked(incoming, self._trust)]
        seconds["decode"] += time.perf_counter() - clock
        batch = self._plan(prepared)
        clock = time.perf_counter()
        if not await self._drain():  # the batches in flight were planned again: so must this one be
            batch = self._plan(prepared)
        seconds["wait"] += time.perf_counter() - clock
        age = 0.0 if self._open_since is None else time.monotonic() - self._open_since
        commit = (
            (not backlog and age >= self.commit_every_s)
            or self._open_events + batch.plan.archived >= self._transaction_events
            or age >= self._max_transaction_s
        )
        self._submit(batch, commit=commit)

    def _submit(self, batch: _Batch | None, *, commit: bool) -> None:
        """Hand a planned batch (None: nothing but the COMMIT) to the writer thread."""
        if batch is not None:
            if not self._handed:
                self._open_since = time.monotonic()
            self._handed.append(batch)
            self._open_states.update(batch.plan.states)
            self._open_offsets.update(batch.plan.offsets)
            self._open_events += batch.plan.archived
        # Submitted now, not when the event loop next gets control: the write runs while this loop
        # fetches, decodes and plans the next batch (DuckDB releases the GIL while it works).
        assert self._executor is not None
        self._pending = asyncio.get_running_loop().run_in_executor(self._executor, self._write, batch, commit)

    def _forget_open(self) -> list[_Batch]:
        opened, self._handed = self._handed, []
        self._open_states, self._open_offsets, self._open_events, self._open_since = {}, {}, 0, None
        return opened

    async def _drop_decoding(self) -> None:
        """Forget the fetched batches not handed over yet (their messages are read again after a rewind)."""
        dropped, self._decoding = self._decoding, []
        for _, decoding in dropped:
            if decoding is not None:
                decoding.cancel()
                with contextlib.suppress(BaseException):
                    await decoding

    async def _rewind(self) -> None:
        """Seek every partition back to its stored offset: after a failed write, or a call interrupted
        (a timeout, a cancellation) between fetching a batch and handing it to the writer, the consumer
        is ahead of what the database holds, and what lies in between must be read again."""
        try:
            await self._drop_decoding()
            await self._settle()
        finally:
            for tp in self._partitions:
                stored = self._committed.get((tp.topic, tp.partition))
                if stored is None:
                    await self._consumer.seek_to_beginning(tp)
                else:
                    self._consumer.seek(tp, stored)
            self._unaccounted = False
            log.info("projector %s rewound to its stored offsets %s", self._group, self.committed_offsets())

    async def _prepared(self, incoming: list[Incoming]) -> list[PreparedChunk]:
        """Each message decoded, verified and turned into rows by the decode workers.

        A worker sends back Arrow tables and small per-message values, not the messages (reattached here).
        """
        pool = self._pool
        if pool is None:  # the workers died since this batch was fetched (another batch found them gone)
            return [prepare_checked(incoming, self._trust)]
        loop = asyncio.get_running_loop()
        size = -(-len(incoming) // self._decode_workers)
        parts = [incoming[i : i + size] for i in range(0, len(incoming), size)]
        try:
            chunks = await asyncio.gather(
                *(loop.run_in_executor(pool, detached_checked, [raw(m) for m in part], self._trust) for part in parts)
            )
        except BrokenProcessPool:
            # A decode worker died (killed on its own: the workers ignore the signals that stop the
            # projector). The pool has ended the others; the event loop decodes this batch and the rest.
            if self._pool is pool:
                self._pool = None
                log.warning("the decode workers are gone; the event loop decodes from now on")
                await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
            return [prepare_checked(incoming, self._trust)]
        return [chunk.attached(part) for chunk, part in zip(chunks, parts, strict=True)]

    def _plan(self, prepared: list[PreparedChunk]) -> _Batch:
        """Plan a batch against the database as it will be once the batches handed over commit.

        The database (read through a second connection, which sees committed data only) holds every
        batch committed; the run states and offsets of those handed over since are overlaid from their plans.
        """
        assert self._reader is not None
        seconds = self.stats.seconds
        clock = time.perf_counter()
        overlay = self._open_states
        next_offsets = {**self._committed, **self._open_offsets}
        wanted = [
            item.run_id
            for chunk in prepared
            for item in chunk.items
            if not isinstance(item, Rejected) and item.run_id not in overlay
        ]
        stored = lookup_runs(self._reader, wanted)
        stored.update(overlay)
        seconds["lookup"] += time.perf_counter() - clock
        clock = time.perf_counter()
        plan = plan_batch(
            prepared, stored, projection=self._group, next_offsets=next_offsets, decision_trust=self._trust
        )
        stamps = tuple(
            m.timestamp_ms
            for chunk in prepared
            for m in chunk.incoming
            if m.timestamp_ms is not None and m.offset >= next_offsets.get((m.topic, m.partition), 0)
        )
        seconds["plan"] += time.perf_counter() - clock  # rows taken from the decoded Arrow tables included
        return _Batch(prepared, plan, to_arrow(plan), stamps)

    async def _drain(self) -> bool:
        """Wait for the write in flight; account for the batches it committed, or raise what it raised.

        Returns False when the writer had to plan the batches of its transaction again (an event_id
        conflict), so that a batch planned on top of them must be planned again too.
        """
        pending = self._pending
        if pending is None:
            return True
        try:
            committed = await asyncio.shield(pending)  # a cancelled wait leaves the write running, and pending
        except BaseException:
            if pending.done():  # the write failed and its transaction rolled back: all of it must be read again
                self._unaccounted = True
                self._forget_open()
            raise
        finally:
            if pending.done():
                self._pending = None
        if committed is None:  # written in the open transaction: accounted for when it commits
            return True
        opened = self._forget_open()
        for plan in committed:
            self._committed.update(plan.offsets)
            self.stats.add(plan)
            if self._on_batch is not None:
                self._on_batch(plan)
        if self._consumer is not None:
            await self._commit_to_kafka(self._consumer)
        self._check_ready()
        return all(plan is batch.plan for plan, batch in zip(committed, opened, strict=True))

    def _write(self, batch: _Batch | None, commit: bool) -> list[Plan] | None:
        """In the writer thread: write a planned batch and its offsets in the open transaction (opening one
        if none is), and with `commit` commit it. Returns the plans of the batches committed, or None when
        the transaction stays open for more.

        An event_id conflict rolls the transaction back and writes its batches again, each planned again
        against the database (the ids found taken dead-lettered) and committed alone. Any other failure
        rolls it back and raises: every batch of it must be read again.
        """
        con = self._con
        assert con is not None
        clock = time.perf_counter()
        publish = self._publish if self._publisher is not None else None
        try:
            if batch is not None:
                if not self._transaction:
                    con.begin()
                self._transaction.append(batch)
                append_batch(con, batch.tables, expected_events=batch.plan.archived, publish=publish)
            if not commit:
                return None
            plans = [written.plan for written in self._transaction]
            if plans:
                if self._before_commit is not None:
                    self._before_commit()
                con.commit()
                self.stats.transactions += 1
                self._observe_queryable(self._transaction)
            self._transaction = []
        except EventIdConflict:
            rollback(con)
            batches, self._transaction = self._transaction, []
            log.warning("%d batch(es) reuse archived event ids; writing each alone, dead-lettering those", len(batches))
            plans = [self._write_alone(written, publish) for written in batches]
            return plans
        except duckdb.Error as exc:
            rollback(con)
            batches, self._transaction = self._transaction, []
            log.warning(
                "writing %d batch(es) failed (%s); writing each alone, isolating the runs at fault", len(batches), exc
            )
            plans = [self._write_isolating(written, publish) for written in batches]
            return plans
        except BaseException:
            rollback(con)
            self._transaction = []
            raise
        finally:
            self.stats.seconds["write"] += time.perf_counter() - clock
        if self._after_commit is not None:
            for plan in plans:
                self._after_commit(plan)
        return plans

    def _write_isolating(self, batch: _Batch, publish: Callable[[list[DeadLetter]], None] | None) -> Plan:
        """In the writer thread, no transaction open, after a database error on a write holding `batch`: a
        poisoned run is told from a sick database, and never stops the projector.

        The batch is written alone first (the error may have been another batch's). If that fails too, a
        write of its offsets and dead letters alone is tried (every run set aside): if even that fails, the
        database is sick -- every write fails -- and `DatabaseError` stops the projector, which resumes from
        its stored offsets once the database is repaired. Otherwise each run and outcome is tried alone (in
        a transaction rolled back); the ones that fail alone are poisoned and dead-lettered with the
        database's error (`database_error`), and the batch is written without them.

        :raises DatabaseError: the database refuses every write.
        """
        con = self._con
        assert con is not None
        try:
            return self._write_alone(batch, publish)
        except DatabaseError as exc:
            log.warning("a batch failed alone (%s); trying each of its runs alone", exc)
        stored, next_offsets = self._stored_for(batch)
        positions = [
            (m.topic, m.partition, m.offset)
            for chunk in batch.prepared
            for item in chunk.items
            if not isinstance(item, Rejected)
            for m in [chunk.message(item)]
            if m.offset >= next_offsets.get((m.topic, m.partition), 0)
        ]
        aside = dict.fromkeys(positions, "set aside")
        problem = self._try_write(batch, stored, next_offsets, aside)
        if problem is not None:
            raise DatabaseError(
                f"the database refuses every write, even one without any run ({problem}): it is sick, not a run;"
                " repair it and start the projector again (it resumes from its stored offsets)"
            )
        poisoned: dict[tuple[str, int, int], str] = {}
        for position in positions:
            problem = self._try_write(batch, stored, next_offsets, {p: "" for p in positions if p != position})
            if problem is not None:
                poisoned[position] = problem
        log.warning("%d poisoned run(s) dead-lettered (database_error): %s", len(poisoned), sorted(poisoned))
        return self._write_alone(batch, publish, poisoned=poisoned)

    def _stored_for(self, batch: _Batch) -> tuple[dict[str, Any], dict[tuple[str, int], int]]:
        """In the writer thread: the stored runs `batch` mentions, and the stored offsets."""
        con = self._con
        assert con is not None
        run_ids = [item.run_id for chunk in batch.prepared for item in chunk.items if not isinstance(item, Rejected)]
        next_offsets = {(self._topic, p): o for p, o in load_offsets(con, self._group, self._topic).items()}
        return dict(lookup_runs(con, run_ids)), next_offsets

    def _try_write(
        self,
        batch: _Batch,
        stored: Mapping[str, Any],
        next_offsets: Mapping[tuple[str, int], int],
        aside: Mapping[tuple[str, int, int], str],
    ) -> str | None:
        """In the writer thread: write `batch` without the messages `aside` in a transaction, and roll it back
        (nothing published); the database's error, or None if it took the rows."""
        con = self._con
        assert con is not None
        plan = plan_batch(
            batch.prepared,
            stored,
            projection=self._group,
            next_offsets=next_offsets,
            decision_trust=self._trust,
            poisoned=aside,
        )
        try:
            con.begin()
            append_batch(con, to_arrow(plan), expected_events=plan.archived, publish=None)
        except duckdb.Error as exc:
            return str(exc)
        except EventIdConflict:
            return None  # not the database's fault: the write that counts dead-letters the ids
        finally:
            rollback(con)
        return None

    def _write_alone(
        self,
        batch: _Batch,
        publish: Callable[[list[DeadLetter]], None] | None,
        *,
        poisoned: Mapping[tuple[str, int, int], str] | None = None,
    ) -> Plan:
        """In the writer thread, no transaction open: plan `batch` again against the database and write it
        in its own transaction; the event ids the archive holds already dead-letter their messages, and so
        do the `poisoned` ones (`_write_isolating`)."""
        con = self._con
        assert con is not None
        stored, next_offsets = self._stored_for(batch)
        taken: frozenset[str] = frozenset()
        while True:
            plan = plan_batch(
                batch.prepared,
                stored,
                projection=self._group,
                next_offsets=next_offsets,
                taken_event_ids=taken,
                decision_trust=self._trust,
                poisoned=poisoned,
            )
            try:
                write_batch(
                    con,
                    to_arrow(plan),
                    expected_events=plan.archived,
                    before_commit=self._before_commit,
                    publish=publish,
                )
            except EventIdConflict as exc:
                if taken:  # pragma: no cover - the ids were just read in this thread
                    raise DatabaseError(f"the archive changed under the projector: {exc}") from exc
                taken = taken_event_ids(con, plan.event_ids)
                log.warning("a batch reuses %d archived event id(s); dead-lettering their messages", len(taken))
                continue
            self.stats.transactions += 1
            self._observe_queryable([batch])
            if self._after_commit is not None:
                self._after_commit(plan)
            return plan

    def _observe_queryable(self, batches: Sequence[_Batch]) -> None:
        """In the writer thread, right after a COMMIT: each message's time from its Kafka timestamp to now."""
        now_ms = time.time() * 1000.0
        observe = self.queryable.observe
        for batch in batches:
            for stamp in batch.stamps:
                observe(max(0.0, now_ms - stamp) / 1000.0)

    def _publish(self, letters: list[DeadLetter]) -> None:
        """In the writer thread, inside the batch's transaction: publish its new dead letters and wait for
        the broker's acknowledgement (the event loop runs the producer meanwhile)."""
        assert self._publisher is not None and self._loop is not None
        asyncio.run_coroutine_threadsafe(self._publisher.publish(letters), self._loop).result()
        self.stats.counts["dead_letters_published"] += len(letters)

    async def _in_writer(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self._executor is not None
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _commit_to_kafka(self, consumer: Any, *, force: bool = False) -> None:
        """Show the stored offsets to Kafka lag monitors: after a commit at most every
        `kafka_commit_interval_s`, and (`force`) whenever the projector is idle or stops, so that what the
        group shows is what the database stores. Never read back; a failure is counted, logged and retried.
        """
        interval = self._kafka_commit_interval_s
        if interval is None:
            return
        stored = self.committed_offsets()
        offsets = {p: stored.get(p, 0) for p in self.partitions}  # an empty partition's position is 0
        if offsets == self._kafka_committed:
            return
        now = time.monotonic()
        if now - self._last_kafka_commit < (interval if not force or self._kafka_commit_failures else 0.0):
            return  # after a failure, even an idle retry waits an interval
        self._last_kafka_commit = now
        try:
            async with asyncio.timeout(5.0):
                await consumer.commit({TopicPartition(self._topic, p): o for p, o in offsets.items()})
        except (KafkaError, TimeoutError) as exc:
            self._kafka_commit_failures += 1
            log.warning("committing offsets %s to Kafka failed (%r); lag monitors see older ones", offsets, exc)
            return
        self._kafka_committed = offsets


async def _partitions_of(consumer: Any, topic: str) -> set[int] | None:
    """The topic's partitions, from a metadata request for all topics (which never creates one).

    `AIOKafkaConsumer.topics()` fetches exactly that but returns only the names, and its
    `partitions_for_topic` reads the client's own metadata, which holds only assigned topics.
    """
    cluster = await consumer._client.fetch_all_metadata()
    partitions: set[int] | None = cluster.partitions_for_topic(topic)
    return partitions


async def log_end_offsets(
    bootstrap_servers: str, topic: str, partitions: Sequence[int], *, timeout_s: float = 30.0
) -> dict[int, int]:
    """Each partition's log end offset (one past its last message), read as a fetch's high watermark.

    Not from ListOffsets alone: Tansu 0.6 answers it with the base offset of the partition's last
    batch, short of the real end. The listed offset is a start at or before the real end, and the
    fetch from there reports the real one.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=100
    )
    tps = [TopicPartition(topic, p) for p in partitions]
    try:
        async with asyncio.timeout(timeout_s):
            await consumer.start()
            consumer.assign(tps)
            listed = await consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, listed[tp])
            while any(consumer.highwater(tp) is None for tp in tps):
                await consumer.getmany(*tps, timeout_ms=200, max_records=1)
            return {tp.partition: int(consumer.highwater(tp)) for tp in tps}
    except TimeoutError as exc:
        raise BrokerError(f"no end offsets for {topic!r} from {bootstrap_servers} within {timeout_s:g} s") from exc
    except KafkaError as exc:
        raise BrokerError(f"cannot read the end offsets of {topic!r}: {exc!r}") from exc
    finally:
        await consumer.stop()


async def _start_workers(pool: ProcessPoolExecutor, workers: int, trust: DecisionTrust | None) -> BaseException | None:
    """Start each of the pool's `workers` (a call with nothing to decode each); None, or why one did not start.

    A worker that dies while starting breaks the pool. The calls handed over then fail with
    `BrokenProcessPool`; a call still being handed over can fail with `OSError` instead. The pool
    spawns a worker within the call that needs one, and the pool's manager thread, having found the
    dead worker, closes the queue that spawn is pickling for the child ("handle is closed"); a child
    that dies while its parent writes to it gives a `BrokenPipeError`. Every call started is awaited.
    """
    loop = asyncio.get_running_loop()
    started: list[asyncio.Future[Any]] = []
    failure: BaseException | None = None
    try:
        for _ in range(workers):
            started.append(loop.run_in_executor(pool, detached_checked, [], trust))
    except (BrokenProcessPool, OSError) as exc:
        failure = exc
    for outcome in await asyncio.gather(*started, return_exceptions=True):
        if isinstance(outcome, BaseException) and failure is None:
            failure = outcome
    if failure is not None and not isinstance(failure, (BrokenProcessPool, OSError)):
        raise failure
    return failure


#: The signals a process group is stopped with, which a decode worker ignores (`_start_decode_worker`).
_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


class DecodeWorkerProcess(multiprocessing.context.SpawnProcess):
    """A decode worker's process: spawned, not forked, with the stop signals blocked from its first
    instruction (`start`). It ignores SIGTERM (`_start_decode_worker`), so `terminate` -- which the pool
    calls on the workers left when one died, and then waits for them -- sends SIGKILL: a worker left
    blocked (writing a result nobody reads any more) would never end."""

    def start(self) -> None:
        """Spawn the worker with SIGTERM and SIGINT blocked; its initializer ignores them, then unblocks.

        Without the block, a stop sent to the process group while the worker imports (before its
        initializer runs) kills it, and a worker that dies while the pool spawns the next one hangs
        CPython's pool (3.11): its manager thread, finding the dead worker, kills the workers it knows of,
        then joins every worker -- including the one spawned meanwhile, alive and waiting for work -- forever,
        and `shutdown(wait=True)` with it (and a call handed over meanwhile may never be answered). A
        blocked signal stays pending in the child, and ignoring it discards it: the worker cannot die of
        the group's stop, so the pool never breaks on one. CPython starts its resource tracker the same
        way (bpo-33613); it is started first here, because starting it unblocks the signals.
        """
        multiprocessing.resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            super().start()  # the child inherits this thread's signal mask through fork and exec
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def terminate(self) -> None:
        self.kill()


class DecodeWorkerContext(multiprocessing.context.SpawnContext):
    """The decode workers' multiprocessing context: spawn, with `DecodeWorkerProcess`."""

    Process = DecodeWorkerProcess


def _start_decode_worker(parent: int, niceness: int) -> None:
    """In a decode worker: ignore the stop signals, lower its priority by `niceness`, collect garbage as
    `tune_interpreter` has it, and exit once the projector process is gone (SIGKILLed, say) rather than linger.

    The projector stops its workers itself, after the batches they decode are handed over. A SIGTERM or
    SIGINT sent to its whole process group (a terminal's Ctrl-C, a service manager stopping the group)
    must not kill a worker first: one killed while it sends a result back leaves part of the result in
    the pipe, and the pool's manager thread then waits for the rest forever -- the projector never exits.
    (The pool ends workers with SIGKILL instead: `DecodeWorkerProcess`.)
    """
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)  # discards one sent while they were blocked (`DecodeWorkerProcess`)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the death signal was asked for
        os._exit(0)
    if niceness:
        os.nice(niceness)
    _collect_less_often()

    def watch() -> None:  # where the kernel cannot send a death signal (not Linux)
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


#: prctl(2)'s option asking the kernel for a signal when the parent thread dies (linux/prctl.h).
_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:
    """Ask the kernel (Linux) to SIGKILL this process the moment the process that spawned it dies -- a
    SIGKILLed projector leaves no decode worker behind, even for a second. Elsewhere, a no-op (the
    `watch` thread notices within a second).

    The signal follows the parent *thread* that spawned the worker: the pool spawns its workers from the
    projector's event loop thread (`_start_workers`), which lives as long as the projector.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the watch thread still ends the worker
        pass


def default_decode_workers() -> int:
    """Decode processes for a machine the projector has to itself: one per core, at most four (none on one
    core). Decoding and verifying is mostly Python (msgspec and the compiled check of `native/` aside) and
    costs more CPU than DuckDB's writes; in worker processes it runs beside the writer instead of taking
    turns with it for the GIL, and a worker sends
    back Arrow tables, cheap to pickle. Measured on two otherwise idle cores (bench/projector.py, 200k
    events): 23-26k events/s with none, 24k with one, 32k with two; with today's decoder, a ratio to the
    bulk insert of 0.39-0.40 with one and 0.43-0.50 with two in the same hour. On a machine busy with other
    work, none or one did as well or better (14-17k events/s against 11-13k with two)."""
    cores = os.cpu_count() or 1
    return 0 if cores < 2 else min(4, cores)


def tune_interpreter() -> None:
    """For a process that runs a projector: hand the GIL over every millisecond rather than every 5 ms.

    The writer thread's DuckDB statements run without the GIL but take it back briefly and often; while
    the event loop decodes (pure Python, holding the GIL) each take waits up to the switch interval, and
    with the default 5 ms the writer falls behind the decoding (bench/projector.py on two shared cores:
    16.4-17.9k events/s at 5 ms, 18.9-19.7k at 1 ms). Process-wide, so only the command line and the
    benchmark call it; a program embedding a `Projector` decides for itself.
    """
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    _collect_less_often()


#: The cyclic collector's thresholds in a projector's processes (CPython's default: 700, 10, 10).
GC_THRESHOLDS: Final = (20_000, 20, 20)


def _collect_less_often() -> None:
    """Run the cyclic garbage collector less often, and never over what was loaded at start.

    Decoding allocates tuples, dicts and strings by the hundred per message; nearly all are freed by
    reference counting, none form cycles, yet each 700 allocations start a collection that walks them
    all. With the thresholds raised, decode and unpickling cost about 7-10% less CPU (prepare_all on the
    bench workload, in process: 21.1-21.4 against 23.1-25.7 us per event); the young generation stays a few
    megabytes. `gc.freeze` moves the modules and objects loaded so far out of every later collection.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


# ---- replay ---------------------------------------------------------------------------------------------


class _Progress:
    """A progress display for `replay`: rich's bar when rich is installed, else a line every 2 s."""

    def __init__(self, enabled: bool) -> None:
        self._total = 0
        self._done = 0
        self._enabled = enabled
        self._last = 0.0
        self._bar: Any = None
        self._task: Any = None

    def begin(self, total: int) -> None:
        """Show progress towards `total` messages."""
        self._total = total
        if not self._enabled:
            return
        try:
            from rich.progress import Progress  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            return
        self._bar = Progress(transient=False)
        self._task = self._bar.add_task("replaying", total=total)
        self._bar.start()

    def update(self, plan: Plan) -> None:
        self._done += sum(plan.counts[k] for k in ("messages", "redelivered"))
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=self._done)
            return
        now = time.monotonic()
        if now - self._last >= 2.0 or self._done >= self._total:
            self._last = now
            print(f"replay: {self._done}/{self._total} messages", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


async def replay(
    database: str | Path,
    bootstrap_servers: str,
    topic: str = DEFAULT_TOPIC,
    *,
    group_id: str = REPLAY_GROUP,
    batch_size: int = 2_000,
    decode_workers: int = 0,
    decode_niceness: int = DECODE_NICENESS,
    timeout_s: float = 600.0,
    progress: bool = True,
    decision_trust: DecisionTrust | None = None,
) -> ProjectorStats:
    """Rebuild every projection from offset 0 into the fresh database file `database`.

    Projects up to the log's end as it is when the call starts. Compare the result with the live
    database using `projections.store.compare_projections`; give the `decision_trust` the live
    projector has, or the two judge outcomes differently.

    :raises ReplayTargetExistsError: when `database` already exists.
    :raises ProjectionTimeout: when the replay takes longer than `timeout_s`.
    """
    path = Path(database)
    if await asyncio.to_thread(path.exists):
        raise ReplayTargetExistsError(f"{path} exists: a replay builds a fresh database, pass a new path")
    counter = _Progress(enabled=progress)
    async with Projector(
        path,
        bootstrap_servers,
        topic,
        group_id=group_id,
        batch_size=batch_size,
        decode_workers=decode_workers,
        decode_niceness=decode_niceness,
        kafka_commit_interval_s=None,
        publish_dead_letters=False,  # the live projector published them
        on_batch=counter.update,
        decision_trust=decision_trust,
    ) as projector:
        ends = await log_end_offsets(bootstrap_servers, topic, projector.partitions)
        counter.begin(sum(ends.values()))
        try:
            return await projector.run_until(ends, timeout_s=timeout_s)
        finally:
            counter.close()


# ---- command line ---------------------------------------------------------------------------------------


def _within(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from `low` up to `high` (None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if high is None and value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not within {low}-{high}")
        return value

    return parse


def _partition_list(text: str) -> list[int]:
    """An argparse type: partitions as ``0-5``, ``0,2,4`` or ``0-3,8``."""
    found: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            first, last = int(low), int(high) if high else int(low)
            if first < 0 or last < first:
                raise ValueError(part)
            found.update(range(first, last + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a partition list (0-5 or 0,2,4): {text!r}") from None
    return sorted(found)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m projections", description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", required=True, help="broker address, host:port[,host:port...]")
    parser.add_argument("--topic", default=DEFAULT_TOPIC, help=f"events topic (default {DEFAULT_TOPIC})")
    parser.add_argument("--batch-size", type=_within(1), default=2_000, help="most messages per transaction")
    parser.add_argument(
        "--decode-workers",
        type=_within(0),
        default=default_decode_workers(),
        help="processes that decode and verify messages (0: none; default: one per core, at most 4)",
    )
    parser.add_argument(
        "--decode-niceness",
        type=_within(0, _MAX_NICENESS),
        default=DECODE_NICENESS,
        help=f"how much lower the decode workers' priority is (nice increment 0-19, default {DECODE_NICENESS})",
    )
    parser.add_argument(
        "--decision-public-key",
        dest="decision_public_keys",
        action="append",
        default=[],
        metavar="PEM",
        help="a trusted decision signer's public key (repeatable): an outcome then needs a decision it signed"
        f" (default: the files {PUBLIC_KEYS_VAR} names, as for the fold worker; none: no signature checked)",
    )
    parser.add_argument(
        "--decision-leeway-s",
        type=float,
        help=f"clock skew allowed around a decision's validity period (default: {LEEWAY_VAR}, else 0)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="project the topic into a database until SIGTERM / SIGINT")
    run.add_argument("--db", help="the DuckDB file (created and migrated if needed)")
    run.add_argument(
        "--lake-catalog",
        help="instead of --db: the Iceberg lake's SQL catalog, a SQLAlchemy URL (projections.lake)",
    )
    run.add_argument("--lake-warehouse", help="with --lake-catalog: the directory of the lake's files")
    run.add_argument("--group", default=DEFAULT_GROUP, help=f"projection name / consumer group ({DEFAULT_GROUP})")
    run.add_argument(
        "--dead-letter-topic", help="where dead letters are also published (default: <topic>.projector.dlq)"
    )
    run.add_argument(
        "--no-dead-letter-topic",
        dest="publish_dead_letters",
        action="store_false",
        help="keep dead letters in the dead_letters table only",
    )
    run.add_argument(
        "--ops-port",
        type=_within(0, 65535),
        help="serve /healthz, /readyz and /metrics (Prometheus) on this port (0: any free one; default: none)",
    )
    run.add_argument("--ops-host", default="127.0.0.1", help="where --ops-port listens (default 127.0.0.1)")
    run.add_argument(
        "--partitions",
        type=_partition_list,
        help="the partitions this projector owns, e.g. 0-5 or 0,2,4 (default: every one); see projections.union",
    )
    rebuild = sub.add_parser("replay", help="rebuild every projection from offset 0 into a fresh file")
    rebuild.add_argument("--db", required=True, help="the new DuckDB file (must not exist)")
    rebuild.add_argument("--compare", help="a live database to compare the rebuilt one with")
    return parser


async def _run_command(args: argparse.Namespace, trust: DecisionTrust | None) -> int:
    if args.command == "replay":
        stats = await replay(
            args.db,
            args.bootstrap,
            args.topic,
            batch_size=args.batch_size,
            decode_workers=args.decode_workers,
            decode_niceness=args.decode_niceness,
            decision_trust=trust,
        )
        print(f"replayed: {stats}")
        if args.compare:
            comparison = compare_projections(args.compare, args.db)
            print(f"compared with {args.compare}: {comparison}")
            return 0 if comparison.equal else 1
        return 0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if (args.db is None) == (args.lake_catalog is None) or (args.lake_catalog is None) != (args.lake_warehouse is None):
        raise SystemExit("run: give --db FILE, or --lake-catalog URL with --lake-warehouse DIR")
    target: Any = args.db
    make: Any = Projector
    if args.lake_catalog is not None:
        from projections.lake import Lake, LakeProjector

        target, make = Lake(args.lake_catalog, args.lake_warehouse), LakeProjector
    async with make(
        target,
        args.bootstrap,
        args.topic,
        group_id=args.group,
        dead_letter_topic=args.dead_letter_topic,
        publish_dead_letters=args.publish_dead_letters,
        batch_size=args.batch_size,
        decode_workers=args.decode_workers,
        decode_niceness=args.decode_niceness,
        decision_trust=trust,
        partitions=args.partitions,
    ) as p:
        ops = None
        if args.ops_port is not None:
            ops = OpsServer(args.ops_host, args.ops_port, await p.metrics_registry(), p.readiness)
            ops.start()
            log.info("projector %s: /healthz, /readyz and /metrics at %s", args.group, ops.url)
        try:
            stats = await p.run_forever(stop)
        finally:
            if ops is not None:
                ops.stop()
    print(f"stopped: {stats}")
    return 0


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The command line: ``run`` (until SIGTERM) or ``replay`` (then optionally compare)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        trust = DecisionTrust.from_env(environ, public_keys=args.decision_public_keys, leeway_s=args.decision_leeway_s)
    except SigningKeyError as exc:
        parser.error(f"decision keys: {exc}")
    tune_interpreter()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_run_command(args, trust))
    return 130


if __name__ == "__main__":
    raise SystemExit(main())
