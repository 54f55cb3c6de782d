"""The publisher survives a broker restart: no acknowledged event lost, no unacknowledged one reported recorded.

Agents run the real engine (run -> record -> execute) through one `KafkaEventSink` while the Apache
Kafka broker is stopped at a random moment (a controlled shutdown, or a SIGKILL of the JVM), stays
down 1-3 s, and comes back on the same ports and data. The sink is never restarted. Then the topic is
read from offset 0 and compared with what the engine was told:

* every publish that returned is in the log, byte for byte, at the very (partition, offset) the sink
  acknowledged, exactly once (lost, duplicated, differing: 0);
* every run the engine recorded has its events in the log; every run whose record raised has no
  record in the engine's storage (nothing unacknowledged is reported as recorded); such a run may
  still be in the log (its message was retried after `publish` gave up), counted apart;
* once the broker is back, publishing works again with the same sink: every publish started after
  the broker answered again, plus one delivery timeout, is acknowledged.

Apache Kafka only: the embedded Tansu keeps everything in memory and loses every topic when it stops.

What this test found (before `KafkaEventSink` replaced a producer whose sequence was lost): after a
controlled stop, every later publish failed with `OutOfOrderSequenceNumber`, for good. `TestALostSequence`
holds the fix without a broker.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import (
    KafkaTimeoutError,
    LeaderNotAvailableError,
    OutOfOrderSequenceNumber,
    UnknownProducerId,
)

from infra.brokers import create_topics
from infra.kafka import ApacheKafkaBroker
from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.adapters.kafka import KafkaEventSink, PublishError
from preflight.events import decode_message, encode_message
from tests.reliability.harness import (
    PARTITIONS,
    Agents,
    Counts,
    Ledger,
    LedgerSink,
    RunSource,
    fault_rng,
    read_topic,
    report,
    restart_mid_stream,
)

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

DELIVERY_TIMEOUT_S = 3.0
RUNS_BEFORE, RUNS_AFTER = 48, 48
PACE_S = 0.1


@pytest.mark.parametrize("hard", [False, True], ids=["controlled-stop", "sigkill"])
async def test_the_sink_survives_a_broker_restart(
    restartable_broker: ApacheKafkaBroker, topic_name: str, tmp_path: Path, hard: bool
) -> None:
    broker = restartable_broker
    rng, seed = fault_rng()
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap, [topic_name], partitions=PARTITIONS)
    ledger = Ledger()
    sink = KafkaEventSink(bootstrap, topic_name, delivery_timeout_s=DELIVERY_TIMEOUT_S, request_timeout_ms=2_000)
    agents = Agents(LedgerSink(sink, ledger))
    source = RunSource(users=16)
    await sink.start()
    try:
        publishing = asyncio.create_task(agents.publish(source.take(RUNS_BEFORE), pace_s=PACE_S))
        stopped_at, down_s = await restart_mid_stream(broker, ledger, rng, hard=hard)
        back = time.monotonic()
        back_at = len(ledger.attempts)
        await publishing
        settled = len(ledger.attempts)
        settle_s = time.monotonic() - back
        await agents.publish(source.take(RUNS_AFTER), pace_s=PACE_S / 4)
    finally:
        await sink.stop()
    records = await read_topic(bootstrap, topic_name)

    in_log = Counter(e["event_id"] for r in records for e in _events_of(r.value))
    at = {(r.partition, r.offset): r.value for r in records}
    acked = [a for a in ledger.attempts if a.acked]
    refused = [a for a in ledger.attempts if not a.acked]
    lost = [a for a in acked if any(in_log[e.event_id] == 0 for e in a.events)]
    misplaced = [a for a in acked if a.position is None or at.get(a.position) != encode_message(a.events)]
    duplicated = sum(n - 1 for n in in_log.values())
    written = sum(1 for a in refused for e in a.events if in_log[e.event_id])
    published = {e.event_id for a in ledger.attempts for e in a.events}
    counts = Counts(
        acknowledged=sum(len(a.events) for a in acked),
        archived=sum(in_log.values()),
        lost=sum(len(a.events) for a in lost),
        duplicated=duplicated,
        differing_events=len(misplaced) - len(lost),
        unexpected=sum(1 for e_id in in_log if e_id not in published),
        unacked_written=written,
    )
    recorded_runs = {r.run_ref.run_id for key in ledger.action_keys() for r in agents.storage.history(key) if r.run_ref}
    errors = Counter((a.error or "").split(":")[0] for a in refused)
    report(
        f"publisher across a broker restart ({'SIGKILL' if hard else 'controlled stop'})",
        counts,
        f"down {down_s:.1f} s after {stopped_at} publishes (seed {seed})",
        f"{len(acked)} publishes acknowledged, {len(refused)} refused ({dict(errors)})",
        f"{sum(1 for a in ledger.attempts[back_at:settled] if not a.acked)} refused in the {settle_s:.1f} s after"
        f" the broker was back, {sum(1 for a in ledger.attempts[settled:] if not a.acked)} later",
    )
    assert counts.ok, counts.explain()
    assert set(agents.recorded) <= {e["run_id"] for r in records for e in _events_of(r.value)}
    assert not set(agents.refused) & recorded_runs, "a run whose record raised was stored as recorded"
    assert refused, "the broker was down for a second or more: some publish should have been refused"
    assert all(a.acked for a in ledger.attempts[settled:]), [a.error for a in ledger.attempts[settled:]]


def _events_of(value: bytes | None) -> list[dict[str, Any]]:
    """The events of a message in the log, as JSON objects."""
    return list(decode_message(value))


# ---- the fix, without a broker --------------------------------------------------------------------------------


class _Producer:
    """A stand-in for aiokafka's producer: every send fails with `error`, or is acknowledged in order."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.sent: list[bytes | None] = []
        self.stopped = False

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic: str, value: bytes | None = None, **options: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.error is not None:
            future.set_exception(self.error)
        else:
            future.set_result(SimpleNamespace(partition=0, offset=len(self.sent)))
            self.sent.append(value)
        return future


class _Sink(KafkaEventSink):
    """A sink whose producers are given, in the order it asks for them."""

    def __init__(self, producers: list[_Producer], *, idempotent: bool = True) -> None:
        super().__init__("127.0.0.1:9", "t", enable_idempotence=idempotent)
        self.producers = iter(producers)

    async def _new_producer(self, *, idempotent: bool) -> Any:
        return next(self.producers)

    async def _check_topic(self, producer: Any) -> None:
        return None


async def _events() -> list[Any]:
    state = await create_preflight(hooks=sc.hooks(), storage=MemoryStorage()).run(sc.transfer())
    return list(state.run_events)


class TestALostSequence:
    """What the broker-restart test found: an idempotent producer whose sequence is lost is replaced."""

    @pytest.mark.parametrize("error", [OutOfOrderSequenceNumber(), LeaderNotAvailableError(), UnknownProducerId()])
    async def test_the_next_publish_goes_through_a_new_producer(self, error: Exception) -> None:
        broken, fresh = _Producer(error), _Producer()
        sink = _Sink([broken, fresh])
        await sink.start()
        events = await _events()
        with pytest.raises(PublishError) as refused:
            await sink.publish(events)
        assert refused.value.retriable
        await sink.publish(events)
        assert (broken.sent, fresh.sent) == ([], [encode_message(events)])
        await sink.stop()
        assert broken.stopped and fresh.stopped

    async def test_other_failures_and_non_idempotent_producers_keep_their_producer(self) -> None:
        for sink, producer in [
            (_Sink([p := _Producer(KafkaTimeoutError())]), p),
            (_Sink([q := _Producer(OutOfOrderSequenceNumber())], idempotent=False), q),
        ]:
            await sink.start()
            for _ in range(2):
                with pytest.raises(PublishError):
                    await sink.publish(await _events())
            await sink.stop()
            assert producer.stopped
