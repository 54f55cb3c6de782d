"""The Faust app: fold every preflight event per `action_key` and serve the baseline over HTTP.

Run it with ``faust -A streams.app worker -l info --web-port 6066`` (the module-level `app` reads the
``PREFLIGHT_*`` environment, see `streams.settings`), or build one with `create_app(settings)`.

Wiring, and nothing that decides:

* the events topic (must exist, `settings.partitions` partitions), raw bytes in and out;
* one table, keyed ``k:<action_key>`` (a key's folded state) and ``w:<partition>`` (the partition's
  progress: watermark and counts), changelog-backed with as many partitions as the events topic;
* one agent that takes batches with `take_events` and hands each partition's messages to
  `streams.batch.fold_partition` (around `preflight.fold.evolve`), publishes the dead letters, then
  writes each changed state once and the partition's progress last;
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
import time
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, cast

import faust

# Faust routes a table write to the changelog partition of the *current event*, a context variable its
# stream sets only for one-at-a-time iteration; a `take_events` batch is handed over without it ("Cannot
# modify table key from outside of stream iteration", SPEC §7). `_WritingFor` sets it, around the
# writes only, to a stand-in for the partition being written. Pinned: faust-streaming 0.15.3.
from faust.streams import _current_event
from faust.web import Request, Response, View

from preflight.signing import DecisionVerifier
from streams.backfill import Backfill
from streams.batch import (
    PROGRESS_PREFIX,
    STATE_PREFIX,
    DeadLetter,
    Incoming,
    Progress,
    fold_partition,
    progress_key,
    state_key,
)
from streams.settings import WorkerSettings
from streams.view import QueryError, baseline_body, key_partition, parse_query, totals, unavailable_body

log = logging.getLogger(__name__)

#: The most offsets read back in one go when the consumer skipped a range.
READ_BACK_CHUNK = 5000


class _Anchor:
    """Stands in for the Faust event a table write needs: `Table.on_key_set` reads only the current
    event's `message.topic` and `message.partition` (to route the changelog record and check that the
    changelog has as many partitions as the source)."""

    class _Message:
        def __init__(self, topic: str, partition: int) -> None:
            self.topic = topic
            self.partition = partition

    def __init__(self, topic: str, partition: int) -> None:
        self.message = self._Message(topic, partition)


class _WritingFor:
    """``with _WritingFor(topic, partition):`` -- table writes in this task go to `partition`'s changelog
    partition (see the note on the `_current_event` import)."""

    def __init__(self, topic: str, partition: int) -> None:
        self._anchor = _Anchor(topic, partition)
        self._token: Any = None

    def __enter__(self) -> None:
        self._token = _current_event.set(weakref.ref(cast(Any, self._anchor)))

    def __exit__(self, *exc: object) -> None:
        _current_event.reset(self._token)


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


class Folder:
    """The glue between Faust and the pure fold, for one worker: batches in, table and dead letters out."""

    def __init__(self, app: Any, settings: WorkerSettings, table: Any, dlq: Any, backfill: Backfill) -> None:
        self.app = app
        self.settings = settings
        self.table = table
        self.dlq = dlq
        self.backfill = backfill
        self.verifier = decision_verifier(settings)
        self.topology_checked = asyncio.Event()
        self.caught_up = asyncio.Event()
        self._progressed = asyncio.Event()
        self._locks = [asyncio.Lock() for _ in range(settings.partitions)]
        # Since this process started (not persisted): what the consumer delivered versus the watermark.
        self.redelivered: Counter[int] = Counter()
        self.read_back: Counter[int] = Counter()
        self.resumed: dict[int, dict[str, int]] = {}
        self.failed_batches = 0
        self.first_fold_at: float | None = None  # wall clock, for throughput measured in the worker
        self.last_fold_at: float | None = None

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
        """Whether the worker may vouch for what it answers: topology checked, table recovered, and
        everything the log held when the worker started folded."""
        return self.topology_checked.is_set() and self.caught_up.is_set() and self.recovered

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

    # ---- folding --------------------------------------------------------------------------------------

    async def catch_up(self) -> None:
        """Fold, from the log itself, everything between the recovered watermarks and the log's end.

        Faust resumes each partition at its committed offset, which may be past what the (recovered)
        table holds: without this, the gap would be read back only when the next message arrives, and
        until then the worker would answer from a stale table."""
        if self.settings.catch_up:
            while True:
                try:
                    await self._catch_up_once()
                    break
                except Exception:  # e.g. the broker is not answering yet: stay not ready, and retry
                    log.exception("catching up from the log failed; retrying in 1 s")
                    await asyncio.sleep(1.0)
        self.caught_up.set()

    async def _catch_up_once(self) -> None:
        ends = await self.backfill.end_offsets(self.settings.partitions)
        for partition, end in sorted(ends.items()):
            async with self._locks[partition]:
                start = self.progress(partition).offset + 1
                if start < end:
                    log.info("partition %d: catching up offsets %d..%d from the log", partition, start, end - 1)
                    await self._read_back(partition, start, end)
            self._notify()
        log.info("caught up: %s", {p: self.progress(p).offset for p in sorted(ends)})

    async def fold_batch(self, events: Sequence[Any]) -> None:
        """Fold a `take_events` batch, partition by partition. Never raises: a failed partition is
        logged and left at its watermark, and the next batch reads its offsets back."""
        await self.topology_checked.wait()
        by_partition: dict[int, list[Any]] = {}
        for event in events:
            by_partition.setdefault(event.message.partition, []).append(event)
        try:
            for partition, group in by_partition.items():
                try:
                    async with self._locks[partition]:
                        await self._fold_partition(partition, group)
                except Exception:
                    self.failed_batches += 1
                    log.exception(
                        "partition %d: batch at offsets %d..%d not folded; the watermark stays at %d and the"
                        " offsets will be read back",
                        partition,
                        group[0].message.offset,
                        group[-1].message.offset,
                        self.progress(partition).offset,
                    )
        finally:
            self._notify()

    async def _fold_partition(self, partition: int, events: list[Any]) -> None:
        expected = self.progress(partition).offset + 1
        first = events[0].message.offset
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
        for event in events:
            message = event.message
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
            pending.append(Incoming(partition, message.offset, message.key, message.value))
            expected = max(expected, message.offset + 1)
        if pending:
            await self._apply(partition, pending)

    async def _read_back(self, partition: int, start: int, end: int) -> None:
        cursor = start
        while cursor < end:
            stop = min(end, cursor + READ_BACK_CHUNK)
            await self._apply(partition, await self.backfill.read(partition, cursor, stop))
            self.read_back[partition] += stop - cursor
            cursor = stop

    async def _apply(self, partition: int, items: Sequence[Any]) -> None:
        if self.first_fold_at is None:
            self.first_fold_at = time.time()
        before = self.progress(partition)
        result = fold_partition(
            self.settings.events_topic, partition, items, before, self.state, verifier=self.verifier
        )
        self.redelivered[partition] += result.redelivered
        if result.progress == before:
            return
        if result.dead_letters:
            await self._publish(result.dead_letters)
        with _WritingFor(self.settings.events_topic, partition):
            for key, state in result.writes.items():
                self.table[state_key(key)] = state
            self.table[progress_key(partition)] = result.progress.to_json()
        self.last_fold_at = time.time()

    async def _publish(self, letters: Sequence[DeadLetter]) -> None:
        """Publish dead letters and wait for their acks, before the progress that covers them is written."""
        pending = [
            await self.dlq.send(key=letter.key, value=letter.encode(), force=True)  # force: never deferred to an ack
            for letter in letters
        ]
        await asyncio.gather(*pending)
        for letter in letters:
            log.warning("dead letter %s[%d]@%d: %s", letter.topic, letter.partition, letter.offset, letter.reason)

    def _notify(self) -> None:
        progressed, self._progressed = self._progressed, asyncio.Event()
        progressed.set()

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
        if not await self.wait_folded(partition, query.min_offset, query.wait_s):
            reason = (
                "the worker is not ready (starting, recovering, catching up or rebalancing)"
                if not self.ready
                else f"partition {partition} is not folded up to offset {query.min_offset} yet"
            )
            body = unavailable_body(action_key, reason, partition, self.progress(partition))
            return view.json(body, status=503)
        state = self.state(state_key(action_key))
        return view.json(baseline_body(action_key, state, partition, self.progress(partition)))

    def status(self) -> dict[str, Any]:
        partitions = range(self.settings.partitions)
        return {
            "ready": self.ready,
            "app_id": self.settings.app_id,
            "events_topic": self.settings.events_topic,
            "progress": {str(p): self.progress(p).to_json() for p in partitions},
            "since_start": {
                "redelivered": {str(p): self.redelivered[p] for p in partitions},
                "read_back": {str(p): self.read_back[p] for p in partitions},
                "resumed": {str(p): v for p, v in self.resumed.items()},
                "failed_batches": self.failed_batches,
                "first_fold_at": self.first_fold_at,
                "last_fold_at": self.last_fold_at,
            },
        }

    def totals(self) -> dict[str, Any]:
        states = {k: v for k, v in self.table.items() if isinstance(k, str) and k.startswith(STATE_PREFIX)}
        progress = [
            Progress.from_json(v) for k, v in self.table.items() if isinstance(k, str) and k.startswith(PROGRESS_PREFIX)
        ]
        summed: Counter[str] = Counter()
        for p in progress:
            summed.update(p.to_json())
        summed.pop("offset", None)
        return {"ready": self.ready, "states": totals(states), "messages": dict(summed)}


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
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        web_enabled=True,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
    )
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
    table = app.Table(
        settings.table_name,
        default=None,
        partitions=settings.partitions,
        key_type=str,
        help="k:<action_key> -> folded state; w:<partition> -> the partition's progress",
    )
    backfill = Backfill(settings.bootstrap_servers, settings.events_topic)
    folder = Folder(app, settings, table, dlq, backfill)
    profiler = cProfile.Profile() if settings.profile_path is not None else None

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
        await cast(Any, app.tables).recovery.completed.wait()
        await folder.catch_up()
        log.info(
            "folding %s (%d partitions) into table %s; dead letters to %s",
            settings.events_topic,
            settings.partitions,
            settings.changelog_topic,
            settings.dlq_topic,
        )

    async def fold(stream: Any) -> None:
        async for batch in stream.take_events(settings.batch_size, within=settings.batch_within_s):
            await folder.fold_batch(batch)

    class BaselineView(View):
        async def get(self, request: Request, action_key: str) -> Response:
            return await folder.baseline(self, request, action_key)

    class StatusView(View):
        async def get(self, request: Request) -> Response:
            return self.json(folder.status())

    class TotalsView(View):
        async def get(self, request: Request) -> Response:
            return self.json(folder.totals())

    async def close_backfill(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        await backfill.close()

    app.task(start_folding)
    app.agent(events, name="fold")(fold)
    app.page("/baseline/{action_key:.+}")(BaselineView)
    app.page("/fold/status")(StatusView)
    app.page("/fold/totals")(TotalsView)
    app.on_before_shutdown.connect(close_backfill)
    if profiler is not None:
        app.page("/fold/profile")(_profile_view(profiler, str(settings.profile_path)))
    return app


app = create_app(WorkerSettings.from_env())

if __name__ == "__main__":
    app.main()
