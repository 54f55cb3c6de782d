"""The Faust app: fold every preflight event per `action_key` and serve the baseline over HTTP.

Run it with ``faust -A streams.app worker -l info --web-port 6066`` (the module-level `app` reads the
``PREFLIGHT_*`` environment, see `streams.settings`), or build one with `create_app(settings)`.

Wiring, and nothing that decides:

* the events topic (must exist, `settings.partitions` partitions), raw bytes in and out;
* one table, keyed ``k:<action_key>`` (a key's folded state) and ``w:<partition>`` (the partition's
  progress: watermark and counts), changelog-backed with as many partitions as the events topic, written
  a batch at a time (`Folder._send_changelog`) and restored by the worker's own reader (`FoldTable`);
* one agent that takes batches with `take_events` and hands each partition's messages to
  `streams.batch.fold_partition` (around `preflight.fold.evolve`), publishes the dead letters, then
  writes each changed state once and the partition's progress last -- until the assignment is caught
  up: from then on the worker's own reader (`streams.feed`, `Folder.follow`) brings the batches, and
  Faust's consumer is paused on the events partitions;
* the dead-letter topic, one JSON record per message the fold did not apply;
* HTTP: ``GET /baseline/{action_key}[?min_offset=N&partition=P&wait=S]``, ``GET /fold/status``,
  ``GET /fold/totals`` (and ``GET /fold/profile`` when profiling).

No exactly-once (Tansu cannot), and nothing relies on Faust's offset commits (SPEC §7): a message at
or below the partition's watermark is skipped, offsets beyond it that the consumer did not deliver
are read back (`streams.backfill`), and every state records the offset it has applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import faust
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.admin import DescribeGroupsRequest
from aiokafka.protocol.group import LeaveGroupRequest
from faust.types import TP
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from preflight.fold import UnrebuildableBaselineError
from preflight.signing import DecisionVerifier
from streams import transport as streams_transport
from streams.backfill import Backfill
from streams.batch import (
    STATE_PREFIX,
    DeadLetter,
    Incoming,
    Missing,
    Progress,
    decode_changelog_value,
    encode_changelog_value,
    fold_partition,
    progress_key,
    restore_record,
    state_key,
)
from streams.errors import StreamsError
from streams.feed import Feed
from streams.metrics import PartitionFigures, WorkerFigures, worker_registry
from streams.settings import WorkerSettings
from streams.view import QueryError, baseline_body, key_partition, parse_query, totals, unavailable_body

log = logging.getLogger(__name__)

#: Faust's own offset commits, from the offsets its consumer has acknowledged, are switched off (an
#: interval and a count no worker reaches): the worker commits what it has stored (`Folder._commit`).
#: Faust still commits on a rebalance and at shutdown; by then the worker has committed its own.
_NEVER_S = 10 * 365 * 24 * 3600.0
_NEVER = 2**62
#: How long a scrape may wait for the log's end offsets, and how long one answer is reused.
_LOG_END_TIMEOUT_S = 2.0
_LOG_END_TTL_S = 1.0
#: The producer's batch bound: a batch's changelog records go out in produce batches of up to this many bytes
#: (`Folder._send_changelog`), below the producer's request bound (Faust's default, 1,000,000).
_CHANGELOG_BATCH_BYTES = 512 * 1024
#: The files in the data directory that count the worker's starts and hold its group instance id.
STARTS_FILE = "preflight-worker-starts"
INSTANCE_FILE = "preflight-worker-instance"


class FoldTable(faust.Table[str, Any]):
    """The fold's table: its changelog holds each key's state as parts (`preflight.fold.stored_parts`),
    which recovery puts back together (`streams.batch.restore_record`) instead of taking each record's
    value as the value of its key.

    Given a `reader` of its changelog, the table restores its active partitions itself when they are
    assigned (`on_rebalance`, before Faust's recovery starts): it reads each from its start to its end in
    fetches of thousands of records and applies them, then tells Faust's recovery it holds them up to there
    (`persisted_offset`), so that Faust reads nothing again. Faust's recovery takes each record on its own
    (an event, a decode, a buffer; ~0.5 ms a record on a busy machine), and the table's changelog holds a
    record per message and part; read here, a record costs microseconds. Without a reader, or if reading
    fails, Faust's recovery restores the table as before."""

    reader: Backfill | None = None
    #: Per changelog partition, the last offset `on_rebalance` restored (for `persisted_offset`).
    restored_to: dict[int, int]
    #: Since the process started: the changelog records `on_rebalance` restored, and the seconds it took.
    restored_records = 0
    restore_s = 0.0
    #: Since the process started: restores that failed (this reader's, or of the changelog's tail), each
    #: left to a slower path (Faust's recovery; the fold catching up from the log).
    restore_failures = 0

    def _serializer_from_type(self, typ: Any) -> str:
        """Keys and values pass through Faust as bytes: the worker writes its changelog's records itself
        (`Folder._send_changelog`) and every reader of them decodes them with `restore_raw`. (Faust's choice
        for a ``str`` key, JSON, does not read the UTF-8 keys written there.)"""
        return "raw"

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        """Faust's recovery, when the table's own reader could not restore it (`on_rebalance`)."""
        for event in batch:
            self.restore_raw(event.message.partition, event.message.key, event.message.value)

    def restore_raw(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        """Apply one changelog record as the broker holds it (the only decoding of the changelog)."""
        self._restore(partition, _changelog_key(key), decode_changelog_value(value))

    def _restore(self, partition: int, key: str | None, value: Any) -> None:
        store = self.data
        data = store.data  # the memory store's dict (the worker's store is memory://)
        owner = getattr(store, "_key_partition", None)  # the memory store's record of each key's partition
        if key is None:
            return
        changed = restore_record(data, key, value)
        if changed is not None and owner is not None:
            if changed in data:
                owner[changed] = partition
            else:
                owner.pop(changed, None)

    def persisted_offset(self, tp: TP) -> int | None:
        restored = getattr(self, "restored_to", {})
        return restored.get(tp.partition) if tp.topic == self.changelog_topic.get_topic_name() else None

    async def on_rebalance(
        self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP], generation_id: int = 0
    ) -> None:
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        self.restored_to = {}
        if self.reader is None:
            return
        topic = self.changelog_topic.get_topic_name()
        actives = sorted(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == topic)
        if not actives:
            return
        began = time.monotonic()
        restored: dict[int, int] = {}
        records = 0
        try:
            ends = await self.reader.end_offsets(self.partitions or 1)
            for partition in actives:
                end = ends.get(partition, 0)
                for start in range(0, end, _RESTORE_CHUNK):
                    for item in await self.reader.read(partition, start, min(end, start + _RESTORE_CHUNK)):
                        if isinstance(item, Incoming):  # else compacted away: a later write of the key follows
                            self.restore_raw(partition, item.key, item.value)
                            records += 1
                if end > 0:
                    restored[partition] = end - 1
        except Exception:
            self.restore_failures += 1
            log.exception("restoring the table from its changelog failed: Faust's recovery restores it instead")
            return
        self.restored_to = restored
        self.restored_records += records
        self.restore_s += time.monotonic() - began
        log.info(
            "restored %d changelog records of partitions %s in %.2f s (up to %s)",
            records,
            actives,
            time.monotonic() - began,
            restored,
        )


def _changelog_key(key: bytes | None) -> str | None:
    """A changelog record's key as the table's (UTF-8, as Faust's raw codec writes a str key)."""
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


#: Offsets of the changelog read (and held in memory) at once while restoring.
_RESTORE_CHUNK = 20_000


class NotOwnedError(StreamsError):
    """A partition this worker is not assigned (any more) was about to be written: another worker owns it."""


def decision_verifier(settings: WorkerSettings) -> DecisionVerifier | None:
    """The verifier of signed decisions the settings name, or None (outcomes then go unsigned-checked).

    :raises SigningKeyError: a key file is unreadable or not an Ed25519 public key -- the worker does
        not start rather than fold without the check it was configured to make.
    """
    if not settings.decision_public_keys:
        return None
    return DecisionVerifier.from_pem_files(
        *settings.decision_public_keys, leeway=timedelta(seconds=settings.decision_leeway_s)
    )


def record_start(data_dir: Path) -> int:
    """Count this start in `data_dir` (created if missing); how many starts it now holds."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / STARTS_FILE
    try:
        starts = int(path.read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        starts = 0
    starts += 1
    partial = path.with_suffix(".tmp")
    partial.write_text(f"{starts}\n")
    os.replace(partial, path)
    return starts


def instance_id(settings: WorkerSettings) -> str:
    """The worker's own name in its consumer group: `settings.group_instance_id`, else one made on the first
    start with this data directory and kept in it (`INSTANCE_FILE`). It is the worker's Kafka client id, so
    the broker names the worker's group member after it (``<id>-<uuid>``), and a restarted worker finds
    the member its previous run left behind (`evict_previous_member`). Give every worker its own data
    directory: two live workers must never share the id.
    """
    if settings.group_instance_id:
        return settings.group_instance_id
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    path = settings.data_dir / INSTANCE_FILE
    try:
        existing = path.read_text().strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return existing
    made = f"{settings.app_id}-{uuid.uuid4().hex[:12]}"
    partial = path.with_suffix(".tmp")
    partial.write_text(f"{made}\n")
    os.replace(partial, path)
    return made


async def evict_previous_member(bootstrap: str, group: str, instance: str, *, timeout_s: float = 10.0) -> int:
    """Remove from `group` the members a previous run of this worker left (member ids ``<instance>-...``);
    how many were removed.

    A SIGKILLed worker's member stays in the group until its session times out, and the next join waits
    for that (the whole session timeout, 10 s, on top of the join itself). The worker knows its own dead
    member by its client id, and removes it (LeaveGroup on its behalf) before it joins: the group
    rebalances at once. Only a settled (Stable) group is touched: removing a member in the middle of a
    join wedged Tansu 0.6's group; then the join waits for the session timeout as before. (Static
    membership, KIP-345, would do this in the protocol, but Tansu 0.6 never syncs a restarted static
    follower: it rejoins for ever.)
    """
    client = AIOKafkaClient(bootstrap_servers=bootstrap, client_id=f"{instance}-evict", request_timeout_ms=5_000)
    try:
        async with asyncio.timeout(timeout_s):
            await client.bootstrap()
            node = await client.coordinator_lookup(0, group)  # 0: a consumer group's coordinator
            described = (await client.send(node, DescribeGroupsRequest([group]))).to_object()
            mine = [
                m["member_id"]
                for g in described["groups"]
                if g["state"] == "Stable"
                for m in g["members"]
                if str(m["member_id"]).startswith(f"{instance}-")
            ]
            for member in mine:
                await client.send(node, LeaveGroupRequest(group, member))
            return len(mine)
    finally:
        await client.close()


def _evict_before_joining(settings: WorkerSettings, instance: str) -> str:
    """`evict_previous_member` from a thread of its own (the worker's event loop does not run yet); what it
    did, for the log (logging is not set up yet either)."""
    outcome = ["no previous group member removed"]

    def run() -> None:
        try:
            removed = asyncio.run(evict_previous_member(settings.bootstrap_servers, settings.app_id, instance))
        except Exception as exc:  # no broker yet, no group yet: the join waits as it would have
            outcome[0] = f"no previous group member removed ({exc!r})"
            return
        outcome[0] = f"removed {removed} group member(s) a previous run left behind"

    thread = threading.Thread(target=run, name="evict-previous-member")
    thread.start()
    thread.join()
    return outcome[0]


class Folder:
    """The glue between Faust and the pure fold, for one worker: batches in, table and dead letters out.

    Per assignment of partitions (at start and after every rebalance): the changelog's tail that Faust's
    restore did not read is applied (`restore_tail`, before the streams resume), then the owned
    partitions are folded from the log up to its end (`catch_up`); only then is the worker ready.
    Every write goes to the table's changelog and is acknowledged by the broker before the partition's
    new stored offset is committed to the consumer group: what is committed is what is stored. A batch is
    folded while the previous batch's writes are in flight (at most one per partition, `_apply`).
    """

    def __init__(
        self,
        app: Any,
        settings: WorkerSettings,
        table: Any,
        dlq: Any,
        backfill: Backfill,
        *,
        changelog: Backfill | None = None,
        log_ends: Backfill | None = None,
        starts: int = 0,
    ) -> None:
        self.app = app
        self.settings = settings
        self.table = table
        self.dlq = dlq
        self.backfill = backfill
        self.changelog = changelog
        self.log_ends = log_ends
        self.verifier = decision_verifier(settings)
        self.topology_checked = asyncio.Event()
        self.caught_up = asyncio.Event()
        self._progressed = asyncio.Event()
        self._locks = [asyncio.Lock() for _ in range(settings.partitions)]
        #: The events partitions this worker owns (set when an assignment is complete, cleared on revoke).
        self.assigned: frozenset[int] = frozenset()
        self.generation = 0
        self.rebalances = 0
        self._catching_up: asyncio.Task[None] | None = None
        self.starts = starts
        self.evicted = ""
        self._began = time.monotonic()
        self.recovery_s: float | None = None
        # Since this process started (not persisted): what the consumer delivered versus the watermark.
        self.redelivered: Counter[int] = Counter()
        self.re_read: Counter[int] = Counter()
        self.read_back: Counter[int] = Counter()
        #: Since this process started: the messages Faust's stream delivered, and those the worker's own reader
        #: read (`follow`), per partition.
        self.delivered: Counter[int] = Counter()
        self.fed: Counter[int] = Counter()
        self.resumed: dict[int, dict[str, int]] = {}
        #: Each owned partition's stored offset (watermark) as restored, before catching up: where the
        #: last assignment resumed.
        self.restored: dict[int, int] = {}
        self.failed_batches = 0
        self.commit_failures = 0
        self.store_failures = 0
        self.tail_records = 0  # changelog records past the broker's listed end applied (`restore_tail`)
        #: Since the process started: the batches stored, the seconds their writes took to be acknowledged
        #: and committed, and the seconds the fold waited for them (the rest overlapped the next fold).
        self.stores = 0
        self.store_s = 0.0
        self.store_wait_s = 0.0
        #: Since the first batch: the seconds the agent waited for the next batch (`take_events`).
        self.batch_wait_s = 0.0
        #: Per partition, the batch whose writes are on their way to the broker (`_apply`, `_store`).
        self._in_flight: dict[int, asyncio.Task[None]] = {}
        #: The next offsets this process committed to the consumer group, per partition.
        self.committed: dict[int, int] = {}
        #: Per owned partition, the states' counts summed (`streams.view.totals`), kept up to date by
        #: every write (recounted from the table when an assignment is caught up).
        self._counts: dict[int, Counter[str]] = {}
        self._log_end: dict[int, int] = {}
        self._log_end_at = -_LOG_END_TTL_S
        self.first_fold_at: float | None = None  # wall clock, for throughput measured in the worker
        self.last_fold_at: float | None = None
        #: The process's CPU seconds (every thread) at the first fold, and from then to the last batch stored.
        self._first_fold_cpu = 0.0
        self.fold_cpu_s = 0.0
        #: Per partition, the next offset whose batch's writes the broker has acknowledged (the status's
        #: ``stored``: what a restart would resume from, where ``progress`` is what the table has folded).
        self.stored: dict[int, int] = {}

    # ---- reading --------------------------------------------------------------------------------------

    @property
    def recovered(self) -> bool:
        """Whether Faust has restored the table from its changelog and is not rebalancing."""
        return bool(
            self.app.tables.recovery.completed.is_set()
            and not getattr(self.app, "in_recovery", False)
            and not getattr(self.app, "rebalancing", False)
        )

    @property
    def ready(self) -> bool:
        """Whether the worker may vouch for what it answers: topology checked, table restored, and its
        partitions folded up to where the log ended when they were assigned."""
        return self.topology_checked.is_set() and self.caught_up.is_set() and self.recovered

    def not_ready_reason(self) -> str:
        if not self.topology_checked.is_set():
            return "checking the events topic"
        if not self.recovered:
            return "restoring the table from its changelog, or rebalancing"
        if not self.caught_up.is_set():
            return "catching up on its partitions from the log"
        return ""

    def owner_of(self, partition: int) -> str | None:
        """The URL of the group's worker that owns events `partition` (from the group's assignment, which
        Faust's assignor shares with every member: each worker's changelog partitions and its URL)."""
        distribution = getattr(self.app.assignor, "changelog_distribution", None) or {}
        for url, topics in distribution.items():
            if partition in (topics.get(self.settings.changelog_topic) or ()):
                return str(url).rstrip("/")
        return None

    def progress(self, partition: int) -> Progress:
        return Progress.from_json(self.table.get(progress_key(partition)))

    def state(self, key: str) -> Mapping[str, Any] | None:
        value = self.table.get(key)
        return value if isinstance(value, Mapping) else None

    async def wait_folded(self, partition: int, offset: int | None, wait_s: float) -> bool:
        """Wait (at most `wait_s`) until the worker is ready and `partition` is folded up to `offset`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            if self.ready and (offset is None or self.progress(partition).offset >= offset):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            progressed = self._progressed
            # Woken by each folded batch; the cap re-checks readiness, which nothing signals.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(progressed.wait(), min(remaining, 0.2))

    # ---- assignments ----------------------------------------------------------------------------------

    async def on_revoked(self) -> None:
        """A rebalance starts (Faust has stopped delivering and flushed its producer): stop catching up,
        own nothing, not ready, until the next assignment is complete."""
        self.assigned = frozenset()
        self.caught_up.clear()
        self._began = time.monotonic()
        await self.stop_following()
        await self.drain()  # the batches in flight reach the changelog before the next owner reads it

    async def on_assigned(self) -> None:
        """An assignment is complete and the table restored, before Faust resumes the streams: apply the
        changelog's tail the restore left out, then catch the owned partitions up (in the background)."""
        assignment = self.app.consumer.assignment()
        owned = frozenset(tp.partition for tp in assignment if tp.topic == self.settings.events_topic)
        self.generation += 1
        self.rebalances += 1
        self.assigned = owned
        self._counts = {p: self._counts.get(p, Counter()) for p in owned}
        log.info("assigned events partitions %s (assignment %d)", sorted(owned), self.generation)
        try:
            await self.restore_tail(owned)
        except Exception:
            self.table.restore_failures += 1
            log.exception("reading the changelog's tail failed: the fold catches up from the log instead")
        self.restored = {p: self.progress(p).offset for p in sorted(owned)}
        log.info("restored: folded up to %s", self.restored)
        self._catching_up = asyncio.create_task(self._catch_up_and_follow(owned, self.generation), name="catch-up")

    async def _catch_up_and_follow(self, owned: frozenset[int], generation: int) -> None:
        """This assignment's catch-up, then its partitions read by the worker's own reader (`follow`)."""
        await self.catch_up(owned, generation)
        if generation == self.generation:
            await self.follow(owned)

    async def stop_following(self) -> None:
        """Stop catching up and reading the owned partitions (the worker stops, or a rebalance starts)."""
        task, self._catching_up = self._catching_up, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def restore_tail(self, partitions: Iterable[int]) -> None:
        """Apply the changelog records past where Faust's restore stopped, up to the changelog's real end.

        Faust restores a table up to the end offsets the broker lists; Tansu 0.6 lists the base offset of
        a partition's last batch, short of its real end, so the restored table lacks the last batch's
        writes -- the last stored offset among them. Applying records again from an earlier offset, in
        log order, leaves each key at its last write: the restored table then equals the changelog."""
        if self.changelog is None:
            return
        owned = sorted(partitions)
        if not owned:
            return
        recovery = self.app.tables.recovery
        topic = self.settings.changelog_topic
        ends = await self.changelog.end_offsets(self.settings.partitions)
        applied = 0
        for partition in owned:
            tp = TP(topic, partition)
            read_to = min(recovery.active_offsets.get(tp, -1), recovery.active_highwaters.get(tp, -1))
            start, end = max(read_to + 1, 0), ends.get(partition, 0)
            if start >= end:
                continue
            records = 0
            for item in await self.changelog.read(partition, start, end):
                if isinstance(item, Missing):
                    continue  # compacted away: a later write of the same key follows
                self.table.restore_raw(partition, item.key, item.value)
                records += 1
            applied += records
            self.tail_records += records
            log.info(
                "partition %d: applied the changelog's tail %d..%d (%d records)", partition, start, end - 1, records
            )
        if applied:
            log.info("restored %d changelog records past the broker's listed end", applied)

    # ---- folding --------------------------------------------------------------------------------------

    async def catch_up(self, partitions: frozenset[int] | None = None, generation: int | None = None) -> None:
        """Fold, from the log itself, everything between the owned partitions' stored offsets and the log's
        end, commit the stored offsets, and become ready.

        Faust resumes each partition at its committed offset, which may be past what the (restored)
        table holds: without this, the gap would be read back only when the next message arrives, and
        until then the worker would answer from a stale table."""
        owned = self.assigned if partitions is None else partitions
        await self.topology_checked.wait()
        if self.settings.catch_up:
            while True:
                try:
                    await self._catch_up_once(owned)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception:  # e.g. the broker is not answering yet: stay not ready, and retry
                    log.exception("catching up from the log failed; retrying in 1 s")
                    await asyncio.sleep(1.0)
        await self.drain(owned)
        self.recount(owned)
        # Faust seeks the streams to the group's committed offsets once the assignment's recovery is done, then
        # resumes the flow. Committing before that seek would move where the consumer resumes -- past the
        # messages a replay would redeliver -- depending on which of the two the event loop ran first.
        await self.app.flow_control.acquire()
        await self._commit({p: self.progress(p).offset + 1 for p in owned})
        if generation is None or generation == self.generation:
            self.recovery_s = time.monotonic() - self._began
            self.caught_up.set()
            log.info("ready in %.2f s: %s", self.recovery_s, {p: self.progress(p).offset for p in sorted(owned)})

    async def _catch_up_once(self, owned: frozenset[int]) -> None:
        ends = await self.backfill.end_offsets(self.settings.partitions)
        for partition, end in sorted(ends.items()):
            if partition not in owned:
                continue
            async with self._locks[partition]:
                start = self.progress(partition).offset + 1
                if start < end:
                    log.info("partition %d: catching up offsets %d..%d from the log", partition, start, end - 1)
                    await self._read_back(partition, start, end)
            self._notify()
        log.info("caught up: %s", {p: self.progress(p).offset for p in sorted(owned)})

    async def fold_batch(self, events: Sequence[Any]) -> None:
        """Fold a `take_events` batch, partition by partition. Never raises: a failed partition is
        logged and left at its watermark, and the next batch reads its offsets back."""
        await self.topology_checked.wait()
        by_partition: dict[int, list[Incoming]] = {}
        for event in events:
            message = event.message
            by_partition.setdefault(message.partition, []).append(
                Incoming(message.partition, message.offset, message.key, message.value)
            )
        try:
            for partition, items in by_partition.items():
                self.delivered[partition] += len(items)
                await self._fold_logged(partition, items)
        finally:
            self._notify()

    async def _fold_logged(self, partition: int, items: list[Incoming]) -> bool:
        """`_fold_partition` under the partition's lock; False (logged) if the batch was not folded."""
        try:
            async with self._locks[partition]:
                await self._fold_partition(partition, items)
        except Exception:
            self.failed_batches += 1
            log.exception(
                "partition %d: batch at offsets %d..%d not folded; the watermark stays at %d and the"
                " offsets will be read again",
                partition,
                items[0].offset,
                items[-1].offset,
                self.progress(partition).offset,
            )
            return False
        return True

    async def follow(self, partitions: frozenset[int]) -> None:
        """Fold the owned `partitions` as the log grows, read by the worker's own reader (`streams.feed`)
        from their watermarks, until cancelled (a revoke, a stop); Faust's consumer stops fetching them.

        Faust resumes every events partition when an assignment is complete; they are paused here, after
        the catch-up (a batch Faust delivered before is folded as ever: what the reader then returns again
        is at or below the watermark and skipped). A batch that was not folded is read again from the
        watermark; a reader that fails is started again from there a second later."""
        owned = sorted(partitions)
        if not owned:
            return
        topic = self.settings.events_topic
        self.app.consumer.pause_partitions({TP(topic, p) for p in owned})
        feed = Feed(
            self.settings.bootstrap_servers,
            topic,
            max_records=self.settings.batch_size,
            client_id=f"{self.app.conf.broker_client_id}-feed",
        )
        log.info("partitions %s: folded from the worker's own reader (Faust's consumer paused on them)", owned)
        try:
            while True:
                try:
                    if not feed.started:
                        await feed.start({p: self.progress(p).offset + 1 for p in owned})
                    waiting = time.monotonic()
                    batches = await feed.next(self.settings.batch_within_s)
                    if batches and self.first_fold_at is not None:  # the wait for a batch, not idling at the end
                        self.batch_wait_s += time.monotonic() - waiting
                except Exception:
                    log.exception("the reader of partitions %s failed; starting it again in 1 s", owned)
                    with contextlib.suppress(Exception):
                        await feed.stop()
                    await asyncio.sleep(1.0)
                    continue
                for partition, items in batches.items():
                    self.fed[partition] += len(items)
                    if not await self._fold_logged(partition, items):
                        feed.seek(partition, self.progress(partition).offset + 1)
                if batches:
                    self._notify()
        finally:
            with contextlib.suppress(Exception):
                await feed.stop()

    async def _fold_partition(self, partition: int, events: list[Incoming]) -> None:
        if partition not in self.assigned:
            raise NotOwnedError(f"partition {partition} is not assigned to this worker (any more)")
        expected = self.progress(partition).offset + 1
        first = events[0].offset
        if partition not in self.resumed:
            self.resumed[partition] = {"first_delivered": first, "watermark": expected - 1}
            log.info(
                "partition %d: first delivery since start at offset %d, folded up to %d (%s)",
                partition,
                first,
                expected - 1,
                "in step" if first == expected else ("replay" if first < expected else "GAP: reading back"),
            )
        pending: list[Incoming] = []
        for message in events:
            if message.offset > expected:
                if pending:
                    await self._apply(partition, pending)
                    pending = []
                log.warning(
                    "partition %d: the consumer skipped offsets %d..%d; reading them back before folding on",
                    partition,
                    expected,
                    message.offset - 1,
                )
                await self._read_back(partition, expected, message.offset)
                expected = self.progress(partition).offset + 1
            pending.append(message)
            expected = max(expected, message.offset + 1)
        if pending:
            await self._apply(partition, pending)

    async def _read_back(self, partition: int, start: int, end: int) -> None:
        cursor = start
        while cursor < end:
            stop = min(end, cursor + self.settings.batch_size)
            await self._apply(partition, await self.backfill.read(partition, cursor, stop))
            self.read_back[partition] += stop - cursor
            cursor = stop

    async def _apply(self, partition: int, items: Sequence[Any]) -> None:
        """Fold `items` on top of the partition's state, while the previous batch's writes are still on their
        way to the broker; once those are acknowledged, put this batch's states in the table and send its
        writes (`_store`, in the background): the dead letters, the changed states, then the new progress.

        At most one batch per partition is in flight, and a batch's writes go out only after the broker has
        acknowledged the previous batch's: the changelog never holds a batch without every batch before it,
        so whatever prefix of it a restart reads is a state the fold reached. The table holds the folded
        batch only once the previous one is stored and the partition still owned (a revoke while waiting
        leaves the table as it is stored, and the batch is folded again by its next owner)."""
        if partition not in self.assigned:
            raise NotOwnedError(f"partition {partition} is not assigned to this worker (any more)")
        if self.first_fold_at is None:
            self.first_fold_at = time.time()
            self._first_fold_cpu = time.process_time()
        before = self.progress(partition)
        result = fold_partition(
            self.settings.events_topic, partition, items, before, self.state, verifier=self.verifier
        )
        self.redelivered[partition] += result.redelivered
        self.re_read[partition] += result.re_read
        if result.progress == before:
            return
        progress = result.progress.to_json()
        # Only the parts each message changed, in order, then the progress, encoded while the previous batch
        # is in flight.
        records = [
            (key.encode(), encode_changelog_value(value))
            for key, value in [*result.records, (progress_key(partition), progress)]
        ]
        waiting = time.monotonic()
        await self._stored(partition)
        self.store_wait_s += time.monotonic() - waiting
        if partition not in self.assigned:
            raise NotOwnedError(f"partition {partition} was revoked while its previous batch was being stored")
        counts = self._counts.setdefault(partition, Counter())
        for key, state in result.writes.items():
            _count_change(counts, self.state(state_key(key)), state)
            self.table.data[state_key(key)] = state
        self.table.data[progress_key(partition)] = progress
        self._in_flight[partition] = asyncio.create_task(
            self._store(partition, result.dead_letters, records, result.progress.offset + 1),
            name=f"store-partition-{partition}",
        )

    def _stored_offset(self, partition: int) -> int | None:
        """The next offset of `partition` whose writes the broker has acknowledged: the folded progress when no
        batch is in flight (it came from the changelog or was stored), else the last batch stored."""
        task = self._in_flight.get(partition)
        if task is None or (task.done() and not task.cancelled() and task.exception() is None):
            return self.progress(partition).offset + 1
        return self.stored.get(partition)

    async def _store(
        self, partition: int, letters: Sequence[DeadLetter], records: Sequence[tuple[bytes, bytes]], next_offset: int
    ) -> None:
        """Publish a batch's dead letters, then its changelog records, wait until the broker has acknowledged
        them all, and commit the new stored offset (`next_offset`).

        Should the producer give up on a write (it retries for `producer_request_timeout`, 20 minutes by
        default), the table holds more than the changelog does, and only a restart makes the two agree: the
        worker stops (`App.crash`), and its next start restores what is stored and folds the rest again."""
        began = time.monotonic()
        try:
            if letters:
                await self._publish(letters)
            await self._send_changelog(partition, records)
            self.last_fold_at = time.time()
            self.fold_cpu_s = time.process_time() - self._first_fold_cpu
            self.stored[partition] = next_offset
        except Exception as exc:
            self.store_failures += 1
            log.critical("partition %d: a batch's writes were not stored (%r); stopping the worker", partition, exc)
            await self.app.crash(exc)
            raise
        await self._commit({partition: next_offset})
        self.stores += 1
        self.store_s += time.monotonic() - began

    async def _stored(self, partition: int) -> None:
        """Wait until the batch of `partition` in flight, if any, is stored (and committed); raise if it failed."""
        task = self._in_flight.get(partition)
        if task is None:
            return
        await asyncio.shield(task)  # a cancelled waiter leaves the write to finish
        if self._in_flight.get(partition) is task:
            del self._in_flight[partition]

    async def drain(self, partitions: Iterable[int] | None = None) -> None:
        """Wait until every batch in flight (of `partitions`, else of every partition) is stored; a failed
        one is logged by `_store` and stops the worker."""
        wanted = set(self._in_flight) if partitions is None else set(partitions) & set(self._in_flight)
        for partition in sorted(wanted):
            with contextlib.suppress(Exception):
                await self._stored(partition)

    async def _send_changelog(self, partition: int, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Send `records` (encoded key, encoded value) to the changelog partition of `partition` (the source
        partition, as Faust routes a table written from a stream), in order, as few produce batches as their
        size allows (`_CHANGELOG_BATCH_BYTES`), and wait until the broker has acknowledged them all.

        Faust's `send_changelog` queues each record on its own (a future, a callback, its codec); a batch of a
        few hundred records costs the event loop more there than the fold of their messages. The bytes are
        the ones Faust writes (the key as UTF-8, the value as JSON), so Faust's recovery reads them alike."""
        producer = self.app.producer._ensure_producer()  # the app's aiokafka producer, started with the app
        topic = self.settings.changelog_topic
        pending = []
        batch = producer.create_batch()
        for key, value in records:
            if batch.append(key=key, value=value, timestamp=None) is None:  # full: send, start anew
                pending.append(await producer.send_batch(batch, topic, partition=partition))
                batch = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None)  # a first record always fits
        if batch.record_count():
            pending.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*pending)

    async def _commit(self, offsets: Mapping[int, int]) -> None:
        """Commit `offsets` (partition -> next offset, as stored) to the consumer group, best effort:
        external lag monitors read them. Nothing here reads them back: a restart resumes from the table."""
        wanted = {p: o for p, o in offsets.items() if self.committed.get(p) != o and p in self.assigned}
        if not wanted:
            return
        tps = {TP(self.settings.events_topic, p): o for p, o in wanted.items()}
        try:
            done = await self.app.consumer._commit_offsets(tps)  # flushes the producer first
        except Exception as exc:
            self.commit_failures += 1
            log.warning("committing offsets %s failed (%r); lag monitors see older ones", wanted, exc)
            return
        if done:
            self.committed.update(wanted)

    async def _publish(self, letters: Sequence[DeadLetter]) -> None:
        """Publish dead letters and wait for their acks, before the progress that covers them is written."""
        pending = [
            # force: never deferred to an ack
            await self.dlq.send(key=letter.key, value=letter.encode(), headers=letter.headers(), force=True)
            for letter in letters
        ]
        await asyncio.gather(*pending)
        for letter in letters:
            log.warning(
                "dead letter %s[%d]@%d: %s: %s",
                letter.topic,
                letter.partition,
                letter.offset,
                letter.dead_letter_code,
                letter.reason,
            )

    def _notify(self) -> None:
        progressed, self._progressed = self._progressed, asyncio.Event()
        progressed.set()

    # ---- counting -------------------------------------------------------------------------------------

    def owned_states(self) -> dict[str, Mapping[str, Any]]:
        """Every key's state in the partitions this worker owns."""
        return {
            k: v
            for k, v in self.table.items()
            if isinstance(k, str)
            and k.startswith(STATE_PREFIX)
            and isinstance(v, Mapping)
            and v.get("partition") in self.assigned
        }

    def recount(self, partitions: Iterable[int]) -> None:
        """Sum the states' counts of `partitions` from the table (once per assignment; every write after
        it updates the sums)."""
        wanted = set(partitions)
        grouped: dict[int, dict[str, Mapping[str, Any]]] = {p: {} for p in wanted}
        for key, state in self.table.items():
            if isinstance(key, str) and key.startswith(STATE_PREFIX) and isinstance(state, Mapping):
                partition = state.get("partition")
                if partition in wanted:
                    grouped[partition][key] = state
        for partition, states in grouped.items():
            self._counts[partition] = Counter(totals(states))

    async def log_end_offsets(self) -> dict[int, int]:
        """The log's end offsets, read at most once a second and within `_LOG_END_TIMEOUT_S` (empty when
        the broker does not answer in time)."""
        if self.log_ends is None:
            return {}
        now = time.monotonic()
        if now - self._log_end_at >= _LOG_END_TTL_S:
            try:
                self._log_end = await asyncio.wait_for(
                    self.log_ends.end_offsets(self.settings.partitions), _LOG_END_TIMEOUT_S
                )
            except Exception as exc:
                log.warning("no end offsets for the metrics (%r)", exc)
                self._log_end = {}
            self._log_end_at = time.monotonic()
        return self._log_end

    def figures(self) -> WorkerFigures:
        """What the metrics show (see `streams.metrics`)."""
        parts = tuple(
            PartitionFigures(
                partition=p,
                progress=self.progress(p),
                states=dict(self._counts.get(p, {})),
                log_end_offset=self._log_end.get(p),
                committed_offset=self.committed.get(p),
                redelivered=self.redelivered[p],
                re_read=self.re_read[p],
                read_back=self.read_back[p],
            )
            for p in sorted(self.assigned)
        )
        return WorkerFigures(
            topic=self.settings.events_topic,
            ready=self.ready,
            partitions=parts,
            failed_batches=self.failed_batches,
            commit_failures=self.commit_failures,
            starts=self.starts,
            recovery_seconds=self.recovery_s if self.caught_up.is_set() else None,
            rebalances=self.rebalances,
        )

    # ---- HTTP -----------------------------------------------------------------------------------------

    async def baseline(self, view: View, request: Request, action_key: str) -> Response:
        settings = self.settings
        try:
            query = parse_query(
                action_key, request.query, partitions=settings.partitions, max_wait_s=settings.baseline_wait_s
            )
        except QueryError as exc:
            return view.json({"action_key": action_key, "status": "bad_request", "reason": str(exc)}, status=400)
        partition = key_partition(query, self.state(state_key(action_key)), settings.partitions)
        if self.ready and partition not in self.assigned:
            owner = self.owner_of(partition)
            if owner is not None and not request.query.get("redirected"):
                # Another worker of the group owns the key's partition: send the reader there (once).
                query_text = urlencode({**request.query, "redirected": "1"})
                location = f"{owner}/baseline/{quote(action_key, safe='')}?{query_text}"
                body = unavailable_body(action_key, f"partition {partition} is folded by {owner}", partition, None)
                return view.json(body, status=307, headers={"Location": location})
            reason = f"partition {partition} is not assigned to this worker, and its owner is not known"
            return view.json(unavailable_body(action_key, reason, partition, None), status=503)
        if not await self.wait_folded(partition, query.min_offset, query.wait_s):
            reason = (
                "the worker is not ready (starting, recovering, catching up or rebalancing)"
                if not self.ready
                else f"partition {partition} is not folded up to offset {query.min_offset} yet"
            )
            body = unavailable_body(action_key, reason, partition, self.progress(partition))
            return view.json(body, status=503)
        state = self.state(state_key(action_key))
        try:
            return view.json(baseline_body(action_key, state, partition, self.progress(partition)))
        except UnrebuildableBaselineError as exc:  # fail closed: no baseline rather than a wrong one
            log.error("baseline of %r: %s", action_key, exc)
            return view.json(unavailable_body(action_key, str(exc), partition, self.progress(partition)), status=503)

    def status(self) -> dict[str, Any]:
        partitions = sorted(self.assigned)
        return {
            "ready": self.ready,
            "app_id": self.settings.app_id,
            "events_topic": self.settings.events_topic,
            "assigned": partitions,
            "progress": {str(p): self.progress(p).to_json() for p in partitions},
            "committed": {str(p): self.committed.get(p) for p in partitions},
            "stored": {str(p): self._stored_offset(p) for p in partitions},
            "starts": self.starts,
            "recovery_s": self.recovery_s,
            "since_start": {
                "redelivered": {str(p): self.redelivered[p] for p in partitions},
                "re_read": {str(p): self.re_read[p] for p in partitions},
                "read_back": {str(p): self.read_back[p] for p in partitions},
                "delivered_by_faust": {str(p): self.delivered[p] for p in partitions},
                "read_by_worker": {str(p): self.fed[p] for p in partitions},
                "resumed": {str(p): v for p, v in self.resumed.items()},
                "restored": {str(p): v for p, v in self.restored.items()},
                "failed_batches": self.failed_batches,
                "commit_failures": self.commit_failures,
                "store_failures": self.store_failures,
                "stores": self.stores,
                "store_s": round(self.store_s, 3),
                "store_wait_s": round(self.store_wait_s, 3),
                "batch_wait_s": round(self.batch_wait_s, 3),
                "rebalances": self.rebalances,
                "restored_records": getattr(self.table, "restored_records", None),
                "tail_records": self.tail_records,
                "restore_failures": getattr(self.table, "restore_failures", None),
                "restore_s": getattr(self.table, "restore_s", None),
                "first_fold_at": self.first_fold_at,
                "last_fold_at": self.last_fold_at,
                "fold_cpu_s": round(self.fold_cpu_s, 3),
            },
        }

    def totals(self) -> dict[str, Any]:
        progress = [self.progress(p) for p in sorted(self.assigned)]
        summed: Counter[str] = Counter()
        for p in progress:
            summed.update({k: v for k, v in p.to_json().items() if isinstance(v, int)})
        summed.pop("offset", None)
        return {"ready": self.ready, "states": totals(self.owned_states()), "messages": dict(summed)}


def _count_change(counts: Counter[str], old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> None:
    """Update a partition's summed counts (`streams.view.totals`) for one key's state going `old` -> `new`."""
    if old is None:
        counts["keys"] += 1
    counts["baselines"] += bool(new.get("baseline")) - bool(old and old.get("baseline"))
    before = (old or {}).get("counts") or {}
    for name, count in (new.get("counts") or {}).items():
        counts[name] += int(count) - int(before.get(name, 0))


def _profile_view(profiler: cProfile.Profile, path: str) -> type[View]:
    class ProfileView(View):
        async def get(self, request: Request) -> Response:
            profiler.dump_stats(path)
            return self.json({"profile": path})

    return ProfileView


def create_app(settings: WorkerSettings) -> faust.App:
    """A Faust app folding `settings.events_topic`; nothing connects until a worker starts it."""
    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{address}" for address in settings.bootstrap_servers.split(",")],
        store="memory://",
        datadir=str(settings.data_dir),
        autodiscover=False,
        processing_guarantee="at_least_once",  # exactly_once needs transactions, which Tansu refuses
        broker_session_timeout=settings.session_timeout_s,  # Tansu holds a join for half of it (SPEC §7)
        broker_commit_interval=_NEVER_S,  # the worker commits what it stored (Folder._commit)
        broker_commit_every=_NEVER,
        topic_partitions=settings.partitions,
        producer_max_batch_size=_CHANGELOG_BATCH_BYTES,
        topic_replication_factor=settings.replication_factor,
        table_standby_replicas=0,
        # The table restores its partitions itself and says so as its persisted offsets (`FoldTable`), which
        # on Tansu lie beyond the end offsets it lists (`Backfill.end_offsets`): no inconsistency.
        recovery_consistency_check=False,
        consumer_auto_offset_reset="earliest",
        web_enabled=True,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
    )
    streams_transport.install(app)  # a fetch that finds nothing held 0.1 s, not Faust's 1.5 s
    events = app.topic(
        settings.events_topic,
        partitions=settings.partitions,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )
    dlq = app.topic(
        settings.dlq_topic,
        partitions=1,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )
    table = FoldTable(
        app,
        name=settings.table_name,
        default=None,
        beacon=app.tables.beacon,
        partitions=settings.partitions,
        key_type=str,
        help="k:<action_key> -> folded state (stored as its parts); w:<partition> -> the partition's progress",
    )
    app.tables.add(table)
    bootstrap = settings.bootstrap_servers
    backfill = Backfill(bootstrap, settings.events_topic)
    changelog = Backfill(bootstrap, settings.changelog_topic)
    log_ends = Backfill(bootstrap, settings.events_topic, timeout_s=_LOG_END_TIMEOUT_S)
    restorer = table.reader = Backfill(bootstrap, settings.changelog_topic)
    folder = Folder(app, settings, table, dlq, backfill, changelog=changelog, log_ends=log_ends)
    registry = worker_registry(folder.figures)
    # CPU time of the event loop's thread, not wall time: on a shared machine a profile of wall time counts
    # the time the thread waited for a core against whatever it was running.
    profiler = cProfile.Profile(time.thread_time) if settings.profile_path is not None else None

    def init_worker(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """`faust worker` is starting this app (the consumer does not exist yet): count the start, name the
        worker's client after its instance id and remove the group member its previous run left behind.
        (Faust sends the signal more than once.)"""
        if not folder.starts:
            folder.starts = record_start(settings.data_dir)
            instance = instance_id(settings)
            app.conf.broker_client_id = instance
            folder.evicted = _evict_before_joining(settings, instance)

    async def start_folding() -> None:
        if profiler is not None:
            profiler.enable()  # profiles this thread: the event loop (agent, table, producer, web)
        try:
            await backfill.check_partitions(settings.partitions)
            await dlq.maybe_declare()
        except Exception as exc:
            log.critical("refusing to fold: %s", exc)
            await app.crash(exc)
            raise
        folder.topology_checked.set()
        log.info(
            "folding %s (%d partitions) into table %s; dead letters to %s (start #%d, group member %s; %s)",
            settings.events_topic,
            settings.partitions,
            settings.changelog_topic,
            settings.dlq_topic,
            folder.starts,
            app.conf.broker_client_id,
            folder.evicted,
        )

    async def fold(stream: Any) -> None:
        # Faust delivers the events partitions until the worker's own reader takes them over (`Folder.follow`).
        waiting: float | None = None
        async for batch in stream.take_events(settings.batch_size, within=settings.batch_within_s):
            if waiting is not None:  # a wait that began after the first fold: for this batch
                folder.batch_wait_s += time.monotonic() - waiting
            await folder.fold_batch(batch)
            waiting = time.monotonic() if folder.first_fold_at is not None else None

    async def revoked(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        await folder.on_revoked()

    async def assigned(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        await folder.on_assigned()

    class BaselineView(View):
        async def get(self, request: Request, action_key: str) -> Response:
            return await folder.baseline(self, request, action_key)

    class StatusView(View):
        async def get(self, request: Request) -> Response:
            return self.json(folder.status())

    class TotalsView(View):
        async def get(self, request: Request) -> Response:
            return self.json(folder.totals())

    class HealthView(View):
        """Liveness: the worker's event loop answers and the app has not crashed."""

        async def get(self, request: Request) -> Response:
            if getattr(app, "crashed", False):
                return self.json({"status": "crashed"}, status=503)
            return self.json({"status": "ok", "pid": os.getpid()})

    class ReadyView(View):
        """Readiness: 200 once the table is restored and the owned partitions caught up, else 503."""

        async def get(self, request: Request) -> Response:
            if folder.ready:
                return self.json({"status": "ready", "assigned": sorted(folder.assigned)})
            return self.json({"status": "not ready", "reason": folder.not_ready_reason()}, status=503)

    class MetricsView(View):
        """The Prometheus text format (`streams.metrics`)."""

        async def get(self, request: Request) -> Response:
            await folder.log_end_offsets()
            return self.bytes(generate_latest(registry), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    async def close_backfill(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        with contextlib.suppress(Exception):  # a graceful stop stores the batches in flight (a kill need not)
            await asyncio.wait_for(folder.stop_following(), _LOG_END_TIMEOUT_S * 5)
            await asyncio.wait_for(folder.drain(), _LOG_END_TIMEOUT_S * 5)
        for reader in (backfill, changelog, log_ends, restorer):
            await reader.close()

    app.on_worker_init.connect(init_worker)
    app.task(start_folding)
    app.agent(events, name="fold")(fold)
    app.on_partitions_revoked.connect(revoked)
    app.on_rebalance_complete.connect(assigned)
    app.page("/baseline/{action_key:.+}")(BaselineView)
    app.page("/fold/status")(StatusView)
    app.page("/fold/totals")(TotalsView)
    app.page("/healthz")(HealthView)
    app.page("/readyz")(ReadyView)
    app.page("/metrics")(MetricsView)
    app.on_before_shutdown.connect(close_backfill)
    if profiler is not None:
        app.page("/fold/profile")(_profile_view(profiler, str(settings.profile_path)))
    return app


app = create_app(WorkerSettings.from_env())

if __name__ == "__main__":
    app.main()
