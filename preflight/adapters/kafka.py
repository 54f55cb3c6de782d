"""The agent-side event publisher: `KafkaEventSink` writes each run's events to Kafka (SPEC §5).

Transport: one Kafka message per `publish(events)` call -- a whole run (seq 0 .. `run_closed`) or one
tail event (`executed` / `execution_failed`). The value is `encode_message(events)` (a JSON array of the
events' canonical bytes, never re-encoded here), the headers are `message_headers(events)`, and the key
is the events' `action_key` (`__preflight_unkeyed__` for a run without one), so all of a key's messages
land on one partition, in order. One topic carries every preflight event.

`publish` returns only after the broker acknowledged the message (`acks="all"` by default) and raises
`PublishError` -- a `RecordingError` -- on anything else: broker down, no ack within
`delivery_timeout_s`, sink not started, message too large. The engine turns that into "no record, no
execution". A message that was not acknowledged may still reach the log later (the client keeps
retrying it until the sink stops): "not acknowledged" never means "not written", so consumers
deduplicate by `event_id` / run `seq`, and a run whose record was never stored is never executed.

Order. aiokafka sends at most one produce request per broker at a time and mutes a partition while a
batch of it is in flight; a failed batch is re-queued at the head of its partition. Retries therefore
cannot reorder a partition (the equivalent of Java's `max.in.flight.requests.per.connection=1`), and
with an idempotent producer they cannot duplicate either. Since `publish` awaits each ack and the
engine publishes a run in one call, and an `executed` tail only after its run was acknowledged, a
caller's messages for a key are in causal order. Caveat: two tasks publishing *concurrently* on the
same key are ordered by whichever called `send` first, and if the first one fails (e.g. its batch
expires) the second may still succeed; each message is a whole run, so this never splits a run.

Broker restarts. aiokafka retries an idempotent producer's batches for ever, except one whose partition
has no leader when it expires (a controlled broker shutdown): that batch fails although it already
holds a sequence number, and from then on the broker refuses every later batch of the partition as
`OutOfOrderSequenceNumber` -- the producer would never publish again. A publish that fails that way
(or with another error that says the producer's sequence or epoch is lost) marks the producer broken,
and the next publish replaces it with a new one (a new producer id, sequences from 0) before sending;
the old one is closed in the background (its pending messages get `stop_timeout_s`, then fail). The
publish that failed is not acknowledged, as always; `tests/reliability` restarts a broker under load.

Each publish's time to its acknowledgement (or failure) is observed in the ``preflight_publish_ack_seconds``
histogram (`preflight.adapters.ops`), in `prometheus_client`'s default registry.

This module imports aiokafka and prometheus_client (nothing heavier): importing `preflight` does not load it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Final, Literal, Protocol, Self

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    BrokerResponseError,
    IncompatibleBrokerVersion,
    InvalidProducerEpoch,
    KafkaError,
    LeaderNotAvailableError,
    NotLeaderForPartitionError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
    UnknownProducerId,
)
from aiokafka.protocol.metadata import MetadataRequest

from preflight.adapters.ops import PUBLISH_ACK_SECONDS
from preflight.errors import ConstructionError, PreflightError, RecordingError
from preflight.events import PreflightEvent, encode_message, kafka_key, message_headers
from preflight.records import UNKEYED_RECORD_KEY, event_member

__all__ = ["DEFAULT_TOPIC", "KafkaEventSink", "PublishError", "SinkStartError"]

log = logging.getLogger(__name__)

#: The topic for all preflight events unless the deployment names another.
DEFAULT_TOPIC: Final = "preflight.events"

Acks = Literal["all", -1, 1]

#: Failures after which an idempotent producer's sequence numbers (or epoch) no longer match the
#: broker's: a batch that expired while its partition had no leader (it held a sequence number), or
#: the broker saying so. The producer is replaced before the next publish (see the module doc).
_SEQUENCE_LOST: Final = (
    OutOfOrderSequenceNumber,
    UnknownProducerId,
    InvalidProducerEpoch,
    ProducerFenced,
    NotLeaderForPartitionError,
    LeaderNotAvailableError,
)


class PublishError(RecordingError):
    """The broker did not acknowledge a message: the run's events are not known to be durable.

    No record, no execution: treat the run as not decided and do not call the tool. `retriable` tells
    a transient cause (broker unreachable, no ack in time, leader moving: run the preflight again once
    the broker answers) from a terminal one (sink not started, message too large, not authorised: fix
    the configuration or the caller). A message that timed out may still reach the log later.
    """

    def __init__(self, message: str, *, retriable: bool, key: str | None = None) -> None:
        super().__init__(message)
        self.retriable = retriable
        self.key = key

    def __reduce__(self) -> tuple[Callable[..., PublishError], tuple[str, bool, str | None]]:
        # Exceptions are copied and pickled through their args; keep the keyword-only fields too.
        return _publish_error, (str(self), self.retriable, self.key)


def _publish_error(message: str, retriable: bool, key: str | None) -> PublishError:
    return PublishError(message, retriable=retriable, key=key)


class SinkStartError(PreflightError):
    """`KafkaEventSink.start` could not get a working producer.

    Check that the broker at `bootstrap_servers` is reachable and answers within `start_timeout_s`, and
    that the topic exists (create it explicitly, e.g. with `infra.brokers.create_topics`).
    With `enable_idempotence=True` the broker must also grant a producer id (Tansu does not: use
    `None`, which falls back to a non-idempotent producer, or run Apache Kafka).
    """


class _Acked(Protocol):
    """What this module reads from aiokafka's `RecordMetadata`."""

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


class _Cluster(Protocol):
    """The part of aiokafka's `ClusterMetadata` this module uses."""

    def leader_for_partition(self, partition: TopicPartition) -> int | None: ...


class _Client(Protocol):
    """The part of aiokafka's `AIOKafkaClient` this module uses."""

    @property
    def cluster(self) -> _Cluster: ...

    def get_random_node(self) -> int | None: ...

    async def ready(self, node_id: int) -> bool: ...

    async def send(self, node_id: int, request: object) -> _Response: ...


class _Response(Protocol):
    """A decoded broker response."""

    def to_object(self) -> dict[str, Any]: ...


class _Producer(Protocol):
    """The part of `AIOKafkaProducer` this module uses, typed (aiokafka ships no annotations)."""

    @property
    def client(self) -> _Client: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def partitions_for(self, topic: str) -> Any: ...

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[_Acked | None]: ...


class KafkaEventSink:
    """An `EventSink` that publishes each run as one acknowledged Kafka message, keyed by action_key.

    Use as ``async with KafkaEventSink(bootstrap, topic) as sink: create_preflight(..., sink=sink)``,
    or call `start` and `stop`. One sink (one producer) is meant to be shared by every engine in a
    process. The topic must exist: `start` checks that it does without letting the broker create it
    (an implicitly created topic gets a partition count nobody chose; Tansu gives it 4).

    `enable_idempotence`: ``None`` (default) tries an idempotent producer and, if the broker refuses
    InitProducerId (Tansu answers UnknownError), falls back to a non-idempotent one and logs a warning
    (once per sink); ``True`` requires it (`start` fails otherwise); ``False`` never asks. `idempotent`
    says what the sink ended up with. Idempotence needs ``acks="all"``.

    After each acknowledged publish the sink remembers, per Kafka key, the (partition, offset) of the
    key's latest acknowledged message (`acked_position`), so a reader can wait until its consumer has
    passed the agent's own writes (read-your-writes). The `max_tracked_keys` least recently written
    keys are kept; an older one reads as ``None``.
    """

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        topic: str = DEFAULT_TOPIC,
        *,
        acks: Acks = "all",
        enable_idempotence: bool | None = None,
        request_timeout_ms: int = 5_000,
        delivery_timeout_s: float = 10.0,
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        client_id: str | None = "preflight-publisher",
        max_request_size: int = 1_048_576,
        max_batch_size: int = 262_144,
        linger_ms: int = 0,
        max_tracked_keys: int = 100_000,
    ) -> None:
        """Configure the sink; nothing connects until `start`.

        :param bootstrap_servers: ``host:port[,host:port...]`` (or a list of them).
        :param topic: the one topic for all preflight events.
        :param acks: ``"all"`` (default, needed for idempotence) or ``1``; ``0`` is refused because an
            unacknowledged message cannot be reported as durable.
        :param request_timeout_ms: bound on one broker request; a non-idempotent producer also drops a
            batch it could not deliver within this time.
        :param delivery_timeout_s: bound on how long `publish` waits for the acknowledgement.
        :param start_timeout_s: bound on `start` (connecting, and the producer id when idempotent).
        :param stop_timeout_s: how long `stop` lets pending messages drain before failing them.
        :param max_request_size: largest message the producer accepts (the broker has its own limit).
        :param max_batch_size: bytes per partition batch. aiokafka builds one batch per partition while
            the previous one is in flight, and a `send` that finds it full waits (at most
            `request_timeout_ms`) for the next: with aiokafka's 16 KiB default, 1,000 concurrent
            publishes of a 6 KB run took ~5 s and some failed; with 256 KiB, ~0.5 s.
        :param max_tracked_keys: how many keys' acknowledged positions are remembered.
        :raises ConstructionError: for settings that cannot give acknowledged, ordered publishing.
        """
        if acks not in ("all", -1, 1):
            raise ConstructionError(f"acks={acks!r}: use 'all' (or 1); without an ack nothing is known durable")
        if enable_idempotence is True and acks not in ("all", -1):
            raise ConstructionError("enable_idempotence=True needs acks='all'")
        for name, number in (
            ("request_timeout_ms", request_timeout_ms),
            ("delivery_timeout_s", delivery_timeout_s),
            ("start_timeout_s", start_timeout_s),
            ("stop_timeout_s", stop_timeout_s),
            ("max_request_size", max_request_size),
            ("max_batch_size", max_batch_size),
            ("max_tracked_keys", max_tracked_keys),
        ):
            if not number > 0:
                raise ConstructionError(f"{name} must be positive, got {number!r}")
        if linger_ms < 0:
            raise ConstructionError(f"linger_ms must not be negative, got {linger_ms!r}")
        if not topic:
            raise ConstructionError("topic must be a non-empty name")
        self._bootstrap = bootstrap_servers if isinstance(bootstrap_servers, str) else ",".join(bootstrap_servers)
        self._topic = topic
        self._acks: Acks = acks
        self._want_idempotence = enable_idempotence
        self._request_timeout_ms = request_timeout_ms
        self._delivery_timeout_s = delivery_timeout_s
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._client_id = client_id
        self._max_request_size = max_request_size
        self._max_batch_size = max_batch_size
        self._linger_ms = linger_ms
        self._max_tracked_keys = max_tracked_keys
        self._producer: _Producer | None = None
        self._broken: _Producer | None = None  # an idempotent producer to replace before the next send
        self._retiring: set[asyncio.Future[None]] = set()  # replaced producers being closed
        self._idempotent = False
        self._warned_non_idempotent = False
        self._lifecycle = asyncio.Lock()
        self._positions: OrderedDict[str, tuple[int, int]] = OrderedDict()

    # ---- state -------------------------------------------------------------------------------------

    @property
    def topic(self) -> str:
        """The topic every message goes to."""
        return self._topic

    @property
    def started(self) -> bool:
        """Whether `start` succeeded and `stop` has not been called since."""
        return self._producer is not None

    @property
    def idempotent(self) -> bool:
        """Whether the running producer is idempotent (False before `start`)."""
        return self._producer is not None and self._idempotent

    def acked_position(self, key: str) -> tuple[int, int] | None:
        """(partition, offset) of the latest acknowledged message under Kafka key `key`, or None.

        `key` is an `action_key`, or `__preflight_unkeyed__`. None means this sink acknowledged
        nothing for it (or forgot it: see `max_tracked_keys`).
        """
        return self._positions.get(key)

    def acked_positions(self) -> dict[str, tuple[int, int]]:
        """A snapshot of every remembered key's latest acknowledged (partition, offset)."""
        return dict(self._positions)

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and get a producer; a no-op when started.

        :raises SinkStartError: when the broker does not answer within `start_timeout_s`, or refuses
            an idempotent producer that `enable_idempotence=True` requires.
        """
        async with self._lifecycle:
            if self._producer is not None:
                return
            acks_all = self._acks in ("all", -1)
            try:
                async with asyncio.timeout(self._start_timeout_s):
                    if self._want_idempotence is False or not acks_all:
                        producer = await self._new_producer(idempotent=False)
                        idempotent = False
                    else:
                        try:
                            producer = await self._new_producer(idempotent=True)
                            idempotent = True
                        except (BrokerResponseError, IncompatibleBrokerVersion) as exc:
                            if self._want_idempotence is True:
                                raise SinkStartError(
                                    f"the broker at {self._bootstrap} refused an idempotent producer"
                                    f" (InitProducerId: {exc!r}) and enable_idempotence=True requires one"
                                ) from exc
                            self._warn_non_idempotent(exc)
                            producer = await self._new_producer(idempotent=False)
                            idempotent = False
                    try:
                        await self._check_topic(producer)
                    except BaseException:
                        await asyncio.shield(producer.stop())
                        raise
            except TimeoutError as exc:
                raise SinkStartError(
                    f"no working producer for {self._bootstrap} within {self._start_timeout_s:g} s"
                ) from exc
            except KafkaError as exc:
                raise SinkStartError(f"cannot start a producer for {self._bootstrap}: {exc!r}") from exc
            self._producer, self._idempotent = producer, idempotent

    async def warm(self) -> frozenset[int]:
        """Fetch the topic's partitions into the producer's metadata and open a connection to each partition's
        leader now, so that the first publish to a partition waits for neither (a gateway calls this at start;
        `gateway.warm`). Publishes nothing. Returns the leaders (broker node ids) it holds a connection to.

        The start's topic check already connects to one broker; on a cluster, a partition led by another one
        would otherwise open its connection (and its version handshake) inside the first publish there: a
        producer's first produce on a new connection took 3.0 ms against 1.7 ms on an open one, measured
        against Tansu (bench/README.md, "The first call, by phase")."""
        producer = self._producer
        if producer is None:
            return frozenset()
        partitions = await producer.partitions_for(self._topic)
        cluster = producer.client.cluster
        leaders = {cluster.leader_for_partition(TopicPartition(self._topic, p)) for p in partitions}
        return frozenset([n for n in leaders if n is not None and n >= 0 and await producer.client.ready(n)])

    async def _new_producer(self, *, idempotent: bool) -> _Producer:
        producer: _Producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap,
            client_id=self._client_id,
            acks=self._acks,
            enable_idempotence=idempotent,
            request_timeout_ms=self._request_timeout_ms,
            max_request_size=self._max_request_size,
            max_batch_size=self._max_batch_size,
            linger_ms=self._linger_ms,
        )
        try:
            await producer.start()
        except BaseException:
            await asyncio.shield(producer.stop())  # a producer that failed to start still holds a client
            raise
        return producer

    async def _check_topic(self, producer: _Producer) -> None:
        """Refuse a topic that does not exist, without letting the broker create it implicitly."""
        node = producer.client.get_random_node()
        if node is None:
            raise SinkStartError(f"no broker node known for {self._bootstrap}")
        response = await producer.client.send(node, MetadataRequest([self._topic], allow_auto_topic_creation=False))
        topics: list[dict[str, Any]] = response.to_object()["topics"]
        found = [t for t in topics if t.get("topic") == self._topic]
        code = found[0].get("error_code") if found else None
        if code != 0 or not found[0].get("partitions"):
            raise SinkStartError(
                f"topic {self._topic!r} is not available on {self._bootstrap} (error code {code}):"
                " create it explicitly, with the partition count the deployment chose"
            )

    def _warn_non_idempotent(self, exc: BaseException) -> None:
        if self._warned_non_idempotent:  # once per sink, however often it is restarted
            return
        self._warned_non_idempotent = True
        log.warning(
            "the broker at %s refused an idempotent producer (InitProducerId: %r); publishing without"
            " idempotence: a retried message may be written twice (consumers deduplicate by event_id)",
            self._bootstrap,
            exc,
        )

    async def stop(self) -> None:
        """Stop the producer, bounded: pending messages get `stop_timeout_s` to be acknowledged, then fail.

        A no-op when not started. Never raises for the broker being gone.
        """
        async with self._lifecycle:
            producer, self._producer, self._broken = self._producer, None, None
            retiring, self._retiring = set(self._retiring), set()
            if producer is not None:
                await self._close(producer)
            if retiring:
                await asyncio.gather(*retiring, return_exceptions=True)

    async def _close(self, producer: _Producer) -> None:
        """Stop `producer`, bounded (see `stop`); never raises for the broker being gone."""
        stopping = asyncio.ensure_future(producer.stop())
        try:
            done, _ = await asyncio.wait({stopping}, timeout=self._stop_timeout_s)
            if not done:
                # Only messages whose publish already failed (or is failing) can be left: an
                # idempotent producer retries them for ever. Fail them so the producer can close.
                log.warning(
                    "Kafka sink for %s: unacknowledged messages still pending after %g s; dropping them",
                    self._topic,
                    self._stop_timeout_s,
                )
                _abandon_pending(producer)
                done, _ = await asyncio.wait({stopping}, timeout=self._request_timeout_ms / 1000 + 1.0)
            if not done:
                stopping.cancel()
                log.warning("Kafka sink for %s: the producer did not close in time; abandoned it", self._topic)
                return
        except BaseException:
            stopping.cancel()
            raise
        exc = stopping.exception()
        if exc is not None:
            log.warning("Kafka sink for %s: error while stopping the producer: %r", self._topic, exc)

    async def _usable(self, producer: _Producer) -> _Producer:
        """`producer`, or the new idempotent producer that replaces it when its sequence is lost."""
        if self._broken is not producer:
            return producer
        async with self._lifecycle:
            current = self._producer
            if current is None:
                raise PublishError("the Kafka sink is not started (call start() or use `async with`)", retriable=False)
            if self._broken is not current:
                return current  # another publish replaced it meanwhile
            try:
                async with asyncio.timeout(self._delivery_timeout_s):
                    fresh = await self._new_producer(idempotent=True)
            except (TimeoutError, KafkaError) as exc:
                raise PublishError(
                    f"the idempotent producer for {self._topic} lost its sequence and no new one could be started"
                    f" within {self._delivery_timeout_s:g} s: {exc!r}",
                    retriable=True,
                ) from exc
            self._producer, self._broken = fresh, None
            closing = asyncio.ensure_future(self._close(current))
            self._retiring.add(closing)
            closing.add_done_callback(self._retiring.discard)
            log.warning("Kafka sink for %s: replaced the idempotent producer whose sequence was lost", self._topic)
            return fresh

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ---- publishing --------------------------------------------------------------------------------

    async def publish(self, events: Sequence[PreflightEvent]) -> None:
        """Publish `events` (one run, or one tail event) as one message; return once it is acknowledged.

        :raises PublishError: when the message was not acknowledged within `delivery_timeout_s`, for
            whatever reason; also for an empty call or events of more than one run or key.
        """
        producer = self._producer
        if producer is None:
            raise PublishError("the Kafka sink is not started (call start() or use `async with`)", retriable=False)
        if not events:
            raise PublishError("nothing to publish: a message carries at least one event", retriable=False)
        key = kafka_key(events)
        run_id = event_member(events, 0, "run_id")
        if any(
            event_member(events, i, "run_id") != run_id or _key_of(event_member(events, i, "action_key")) != key
            for i in range(len(events))
        ):
            raise PublishError("one message carries the events of one run, under one key", retriable=False, key=key)
        try:
            value = encode_message(events)
        except (TypeError, ValueError) as exc:
            raise PublishError(f"the events cannot be encoded: {exc}", retriable=False, key=key) from exc
        producer = await self._usable(producer)
        began, outcome = time.perf_counter(), "failed"
        try:
            partition, offset = await self._send(producer, key, value, message_headers(events))
            outcome = "acknowledged"
        finally:
            PUBLISH_ACK_SECONDS.labels(self._topic, outcome).observe(time.perf_counter() - began)
        self._remember(key, partition, offset)

    async def _send(
        self, producer: _Producer, key: str, value: bytes, headers: list[tuple[str, bytes]]
    ) -> tuple[int, int]:
        where = f"{len(value)}-byte message for key {key!r} to {self._topic}"
        pending: asyncio.Future[_Acked | None] | None = None
        try:
            async with asyncio.timeout(self._delivery_timeout_s):
                pending = await producer.send(self._topic, value=value, key=key.encode(), headers=headers)
                # Shielded: on timeout we stop waiting, but the client may still deliver it (see module doc).
                acked = await asyncio.shield(pending)
        except TimeoutError as exc:
            if pending is not None:
                pending.add_done_callback(_late_outcome(key, self._topic))
            raise PublishError(
                f"{where}: no acknowledgement within {self._delivery_timeout_s:g} s"
                f" ({'queued' if pending is not None else 'not queued'})",
                retriable=True,
                key=key,
            ) from exc
        except KafkaError as exc:
            lost = self._idempotent and isinstance(exc, _SEQUENCE_LOST)
            if lost and self._producer is producer:
                self._broken = producer  # the next publish replaces it
            raise PublishError(f"{where}: {exc!r}", retriable=lost or bool(exc.retriable), key=key) from exc
        except Exception as exc:  # anything else is still "not acknowledged" (cancellation propagates)
            raise PublishError(f"{where}: {type(exc).__name__}: {exc}", retriable=False, key=key) from exc
        if acked is None or acked.offset < 0:
            raise PublishError(f"{where}: the broker returned no offset ({acked!r})", retriable=False, key=key)
        return int(acked.partition), int(acked.offset)

    def _remember(self, key: str, partition: int, offset: int) -> None:
        current = self._positions.get(key)
        if current is None or current[0] != partition or offset > current[1]:
            self._positions[key] = (partition, offset)
        self._positions.move_to_end(key)
        while len(self._positions) > self._max_tracked_keys:
            self._positions.popitem(last=False)

    def __repr__(self) -> str:
        state = ("idempotent" if self._idempotent else "started") if self._producer is not None else "stopped"
        return f"KafkaEventSink({self._bootstrap}, topic={self._topic!r}, {state})"


def _abandon_pending(producer: _Producer) -> None:
    """Fail every message the producer still holds, so that its `stop` can finish.

    aiokafka has no public way to do this: an idempotent producer retries an undeliverable batch for
    ever and `AIOKafkaProducer.stop()` waits for it. This reaches into its accumulator (guarded, so a
    future aiokafka without these attributes only loses the bound) and also marks the batches'
    internal drain waiters as retrieved, which would otherwise log "Future exception was never
    retrieved" at garbage collection.
    """
    accumulator = getattr(producer, "_message_accumulator", None)
    if accumulator is None:
        return
    queued = getattr(accumulator, "_batches", {})
    batches = [batch for queue in queued.values() for batch in queue]
    batches += list(getattr(accumulator, "_pending_batches", ()))
    accumulator.fail_all(ProducerClosed("the sink stopped before the broker acknowledged"))
    for batch in batches:
        waiter = getattr(batch, "_drain_waiter", None)
        if isinstance(waiter, asyncio.Future) and waiter.done() and not waiter.cancelled():
            waiter.exception()


def _late_outcome(key: str, topic: str) -> Callable[[asyncio.Future[_Acked | None]], None]:
    """A done-callback that logs what became of a message after `publish` stopped waiting for it."""

    def report(future: asyncio.Future[_Acked | None]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            log.info("message for key %r to %s, given up on by publish, finally failed: %r", key, topic, exc)
            return
        acked = future.result()
        log.warning(
            "message for key %r to %s was acknowledged after publish had given up on it (%s);"
            " its run is in the log although the caller treated it as not recorded",
            key,
            topic,
            f"partition {acked.partition} offset {acked.offset}" if acked is not None else "no offset",
        )

    return report


def _key_of(action_key: str | None) -> str:
    """The message key of an event with `action_key` (`preflight.events.Envelope.kafka_key`)."""
    return action_key if action_key is not None else UNKEYED_RECORD_KEY
