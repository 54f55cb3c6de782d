"""`KafkaEventSink` on a real broker: the event-sink contract, the engine end to end, "no record, no
execution" with the broker gone, and what idempotence the sink gets from Tansu and from Apache Kafka.

Each test writes to a fresh topic created explicitly with one partition, and reads it back with a plain
consumer that stops at the sink's last acknowledged offset. Every wait is bounded; nothing sleeps to
synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from infra._process import free_port
from infra.brokers import ENV_VAR, Broker, create_topics, delete_topics
from infra.embedded import EmbeddedBroker
from infra.kafka import ApacheKafkaBroker
from preflight import (
    UNKEYED_RECORD_KEY,
    ConstructionError,
    ExecutionRecord,
    MemoryStorage,
    PreflightEvent,
    RecordingError,
    create_preflight,
    decode_event,
    rebuild_record,
)
from preflight import scenario as sc
from preflight.adapters.kafka import KafkaEventSink, PublishError, SinkStartError
from preflight.events import EVENT_SCHEMA_VERSION, decode_message, encode_message
from tests.contract.storage_contract import EventSinkContract, ReadBack

pytestmark = pytest.mark.integration

#: Bound on any one produce-or-consume phase of a test.
PHASE_TIMEOUT_S = 60.0
#: A dedicated Apache Kafka broker takes ~5-9 s to start; Tansu well under 1 s.
DEDICATED_TEST_TIMEOUT_S = 150.0
#: The deadline of a call that must end on its own (the sink's bounds are a few seconds): it tells a sink
#: that answers from one that hangs, and measures nothing.
HANG_S = 60.0

_KIND = os.environ.get(ENV_VAR, "").strip().lower()
ON_KAFKA = _KIND == "kafka"
ON_EMBEDDED = _KIND in ("", "embedded")
kafka_only = pytest.mark.skipif(not ON_KAFKA, reason=f"needs the Apache Kafka broker ({ENV_VAR}=kafka)")
tansu_only = pytest.mark.skipif(not ON_EMBEDDED, reason=f"needs the embedded Tansu broker ({ENV_VAR} unset)")

KEY = "u_01:bank.transfer"
READY = {"to_account": "2200119"}  # the answer that makes the seed transfer `execute`


@contextlib.asynccontextmanager
async def answers_on_its_own(what: str) -> AsyncIterator[None]:
    """The block must end by itself -- returning or raising -- before `HANG_S`."""
    try:
        async with asyncio.timeout(HANG_S):
            yield
    except TimeoutError:
        raise AssertionError(f"{what} was still waiting after {HANG_S:g} s: its own bounds never ended it") from None


@dataclass(frozen=True)
class Consumed:
    """One message as read back from the topic."""

    offset: int
    key: bytes | None
    headers: dict[str, bytes]
    value: bytes
    events: list[PreflightEvent]


@pytest.fixture
async def topic(broker: Broker, topic_name: str) -> AsyncIterator[str]:
    """A fresh one-partition topic, deleted afterwards."""
    await create_topics(broker.bootstrap_servers, [topic_name], partitions=1)
    try:
        yield topic_name
    finally:
        await delete_topics(broker.bootstrap_servers, [topic_name])


@pytest.fixture
async def sink(broker: Broker, topic: str) -> AsyncIterator[KafkaEventSink]:
    """A started sink on the fresh topic (auto idempotence), stopped afterwards."""
    async with KafkaEventSink(broker.bootstrap_servers, topic) as started:
        yield started


async def consume(bootstrap: str, topic: str, last_offset: int) -> list[Consumed]:
    """Read partition 0 of `topic` from the start through `last_offset`, decoding every message."""
    if last_offset < 0:
        return []
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    await consumer.start()
    received: list[Consumed] = []
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            await consumer.seek_to_beginning(partition)
            while not received or received[-1].offset < last_offset:
                batches: dict[Any, list[Any]] = await consumer.getmany(partition, timeout_ms=1_000)
                received.extend(_consumed(message) for message in batches.get(partition, []))
    finally:
        await consumer.stop()
    return received


def _consumed(message: Any) -> Consumed:
    value: bytes = message.value
    return Consumed(
        offset=int(message.offset),
        key=message.key,
        headers={str(name): bytes(data) for name, data in message.headers},
        value=value,
        events=[decode_event(raw) for raw in decode_message(value)],
    )


async def end_offset(bootstrap: str, topic: str, number: int = 0) -> int:
    """The next offset partition `number` (0 unless named) of `topic` will get."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    partition = TopicPartition(topic, number)
    consumer.assign([partition])
    await consumer.start()
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            offsets: dict[Any, int] = await consumer.end_offsets([partition])
            return int(offsets[partition])
    finally:
        await consumer.stop()


async def list_topics(bootstrap: str) -> set[str]:
    """Every topic the broker lists (a metadata request for all topics creates none)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            topics: set[str] = await consumer.topics()
            return topics
    finally:
        await consumer.stop()


async def read_acknowledged(bootstrap: str, sink: KafkaEventSink) -> list[Consumed]:
    """Every message on the sink's topic up to the last one it saw acknowledged."""
    positions = sink.acked_positions().values()
    assert {partition for partition, _ in positions} <= {0}
    return await consume(bootstrap, sink.topic, max((offset for _, offset in positions), default=-1))


class TestKafkaEventSinkContract(EventSinkContract):
    """The contract every event sink meets, on the real broker."""

    @pytest.fixture
    def read_back(self, broker: Broker, sink: KafkaEventSink) -> ReadBack:
        async def read() -> Sequence[PreflightEvent]:
            messages = await read_acknowledged(broker.bootstrap_servers, sink)
            return [event for message in messages for event in message.events]

        return read


class TestKafkaEventSink:
    """One acknowledged message per run or tail, keyed by action_key, byte-exact, positions remembered."""

    async def test_engine_end_to_end_one_message_per_run_and_per_tail(
        self, broker: Broker, sink: KafkaEventSink
    ) -> None:
        storage = MemoryStorage()
        pf = create_preflight(hooks=sc.hooks(), storage=storage, sink=sink)
        state = await pf.run_and_record(sc.transfer(user_answers=READY))
        assert state.execution_decision == "execute"
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, lambda name, args: {"ok": True})
        assert outcome.status == "executed"

        run, tail = await read_acknowledged(broker.bootstrap_servers, sink)
        assert await end_offset(broker.bootstrap_servers, sink.topic) == 2  # nothing else was written

        assert run.key == KEY.encode() and tail.key == KEY.encode()
        assert run.value == encode_message(state.run_events)  # the engine's bytes, not re-encoded
        assert run.headers == {
            "event_type": b"run_closed",
            "schema_version": str(EVENT_SCHEMA_VERSION).encode(),
            "event_count": str(len(state.run_events)).encode(),
            "run_id": state.run_events[0].run_id.encode(),
        }
        assert tail.headers["event_type"] == b"executed"
        assert tail.headers["event_count"] == b"1"
        assert _dump(rebuild_record(run.events)) == _dump(state)
        assert _dump(rebuild_record([*run.events, *tail.events])) == _dump(outcome.state)
        assert _dump(rebuild_record([*run.events, *tail.events])) == _dump(storage.history(KEY)[-1])

    async def test_warm_connects_to_every_partitions_leader_and_publishes_nothing(
        self, broker: Broker, topic_name: str
    ) -> None:
        await create_topics(broker.bootstrap_servers, [topic_name], partitions=3)
        try:
            async with KafkaEventSink(broker.bootstrap_servers, topic_name) as started:
                connected = await started.warm()
            admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
            await admin.start()
            try:
                (described,) = await admin.describe_topics([topic_name])
            finally:
                await admin.close()
            leaders = {int(p["leader"]) for p in described["partitions"]}
            assert len(described["partitions"]) == 3
            assert connected == leaders  # every leader's connection, as the broker names the leaders
            assert [await end_offset(broker.bootstrap_servers, topic_name, p) for p in range(3)] == [0, 0, 0]
        finally:
            await delete_topics(broker.bootstrap_servers, [topic_name])

    async def test_a_run_without_action_key_is_keyed_unkeyed(self, broker: Broker, sink: KafkaEventSink) -> None:
        pf = create_preflight(
            hooks=sc.hooks(classify_when_case=lambda instruction: "someday"), sink=sink, storage=MemoryStorage()
        )
        state = await pf.run_and_record(sc.transfer())
        assert state.action_key is None and state.execution_decision == "ask_user"

        (message,) = await read_acknowledged(broker.bootstrap_servers, sink)
        assert message.key == UNKEYED_RECORD_KEY.encode()
        assert sink.acked_position(UNKEYED_RECORD_KEY) == (0, message.offset)
        assert sink.acked_position(KEY) is None
        assert _dump(rebuild_record(message.events)) == _dump(state)

    async def test_acked_position_advances_per_key(self, broker: Broker, sink: KafkaEventSink) -> None:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), sink=sink)
        assert sink.acked_position(KEY) is None
        await pf.run_and_record(sc.transfer())
        first = sink.acked_position(KEY)
        await pf.run_and_record(sc.transfer(user_id="u_02"))
        await pf.run_and_record(sc.transfer(user_answers=READY))
        second = sink.acked_position(KEY)
        other = sink.acked_position("u_02:bank.transfer")

        assert first == (0, 0) and other == (0, 1) and second == (0, 2)
        messages = await read_acknowledged(broker.bootstrap_servers, sink)
        assert [(m.offset, m.key) for m in messages] == [
            (0, KEY.encode()),
            (1, b"u_02:bank.transfer"),
            (2, KEY.encode()),
        ]
        assert sink.acked_positions() == {KEY: (0, 2), "u_02:bank.transfer": (0, 1)}

    async def test_concurrent_publishes_are_all_acknowledged_and_positions_are_the_latest(
        self, broker: Broker, sink: KafkaEventSink
    ) -> None:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
        states = [await pf.run(sc.transfer(user_id=f"u_{i % 5}")) for i in range(200)]
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            await asyncio.gather(*(sink.publish(state.run_events) for state in states))

        messages = await read_acknowledged(broker.bootstrap_servers, sink)
        by_run = {state.run_events[0].run_id: state for state in states}
        assert sorted(m.events[0].run_id for m in messages) == sorted(by_run)  # each run once
        latest: dict[str, tuple[int, int]] = {}
        for message in messages:
            assert message.key is not None
            latest[message.key.decode()] = (0, message.offset)
            assert _dump(rebuild_record(message.events)) == _dump(by_run[message.events[0].run_id])
        assert sink.acked_positions() == latest

    async def test_publish_refuses_what_is_not_one_run(self, sink: KafkaEventSink) -> None:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
        one, two = await pf.run(sc.transfer()), await pf.run(sc.transfer())
        with pytest.raises(PublishError, match="at least one event"):
            await sink.publish([])
        with pytest.raises(PublishError, match="one run"):
            await sink.publish([*one.run_events, *two.run_events])
        assert sink.acked_positions() == {}

    async def test_a_message_too_large_is_a_terminal_publish_error(self, broker: Broker, topic: str) -> None:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
        state = await pf.run(sc.transfer())
        async with KafkaEventSink(broker.bootstrap_servers, topic, max_request_size=1_000) as small:
            with pytest.raises(PublishError, match="MessageSizeTooLarge") as caught:
                await small.publish(state.run_events)
            assert caught.value.retriable is False
            assert isinstance(caught.value, RecordingError)
            assert small.acked_position(KEY) is None

    async def test_publish_before_start_and_after_stop_raises(self, broker: Broker, topic: str) -> None:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
        state = await pf.run(sc.transfer())
        sink = KafkaEventSink(broker.bootstrap_servers, topic)
        with pytest.raises(PublishError, match="not started"):
            await sink.publish(state.run_events)
        async with sink:
            await sink.publish(state.run_events)
        assert not sink.started
        with pytest.raises(PublishError, match="not started"):
            await sink.publish(state.run_events)

    async def test_start_refuses_a_missing_topic_without_creating_it(self, broker: Broker, topic_name: str) -> None:
        sink = KafkaEventSink(broker.bootstrap_servers, topic_name)
        with pytest.raises(SinkStartError, match="not available"):
            await sink.start()
        assert not sink.started
        assert topic_name not in await list_topics(broker.bootstrap_servers)

    async def test_start_against_a_silent_server_fails_in_bounded_time(self) -> None:
        async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.read()  # accepts the connection and never answers
            finally:
                writer.close()

        server = await asyncio.start_server(swallow, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            sink = KafkaEventSink(f"127.0.0.1:{port}", "nowhere", start_timeout_s=2.0, request_timeout_ms=1_000)
            async with answers_on_its_own("start against a silent server"):
                with pytest.raises(SinkStartError):
                    await sink.start()
            assert not sink.started
        finally:
            server.close()
            await server.wait_closed()

    def test_settings_that_cannot_acknowledge_are_refused(self) -> None:
        with pytest.raises(ConstructionError, match="acks"):
            KafkaEventSink("127.0.0.1:9", acks=0)  # type: ignore[arg-type]
        with pytest.raises(ConstructionError, match="needs acks='all'"):
            KafkaEventSink("127.0.0.1:9", acks=1, enable_idempotence=True)
        with pytest.raises(ConstructionError, match="delivery_timeout_s"):
            KafkaEventSink("127.0.0.1:9", delivery_timeout_s=0)

    async def test_start_without_a_broker_fails_in_bounded_time(self) -> None:
        sink = KafkaEventSink(f"127.0.0.1:{free_port()}", "nowhere", start_timeout_s=3.0, request_timeout_ms=1_000)
        async with answers_on_its_own("start without a broker"):
            with pytest.raises(SinkStartError):
                await sink.start()
        assert not sink.started


class TestNoRecordNoExecution:
    """With its broker gone, the engine records nothing, raises, and executes nothing."""

    async def test_broker_stopped_then_run_is_not_recorded_and_execution_is_held(self, topic_name: str) -> None:
        dedicated: EmbeddedBroker | ApacheKafkaBroker = (
            ApacheKafkaBroker() if ON_KAFKA else EmbeddedBroker(stop_timeout=2.0)
        )
        delivery_timeout_s, stop_timeout_s, request_timeout_ms = 3.0, 2.0, 2_000
        async with asyncio.timeout(DEDICATED_TEST_TIMEOUT_S):
            await asyncio.to_thread(dedicated.start)
            try:
                await create_topics(dedicated.bootstrap_servers, [topic_name], partitions=1)
                sink = KafkaEventSink(
                    dedicated.bootstrap_servers,
                    topic_name,
                    delivery_timeout_s=delivery_timeout_s,
                    stop_timeout_s=stop_timeout_s,
                    request_timeout_ms=request_timeout_ms,
                )
                await sink.start()
                storage = MemoryStorage()
                pf = create_preflight(hooks=sc.hooks(), storage=storage, sink=sink)
                recorded = await pf.run_and_record(sc.transfer(user_answers=READY))
                assert recorded.execution_decision == "execute"
                assert sink.acked_position(KEY) == (0, 0)

                await asyncio.to_thread(dedicated.stop)

                async with answers_on_its_own("a run published to a stopped broker"):
                    with pytest.raises(RecordingError) as caught:
                        await pf.run_and_record(sc.transfer(user_answers=READY))
                assert isinstance(caught.value.__cause__, PublishError)
                assert caught.value.__cause__.retriable
                assert storage.history(KEY) == [recorded]  # no record for the unacknowledged run
                assert sink.acked_position(KEY) == (0, 0)

                calls: list[str] = []

                def call_tool(name: str, args: dict[str, Any]) -> str:
                    calls.append(name)
                    return "ok"

                unrecorded = await pf.run(sc.transfer(user_answers=READY))
                assert unrecorded.execution_decision == "execute"
                # Held, nothing called; its refusal cannot be recorded either, so the caller is told so.
                with pytest.raises(RecordingError, match="refused") as refused:
                    await pf.execute_if_ready(unrecorded, sc.BANK_TOOL, call_tool)
                held = refused.value.outcome
                assert getattr(held, "status", None) == "held" and calls == []

                # The recorded decision may run, but its outcome cannot be recorded: the caller is told,
                # with what happened, so that it reconciles instead of retrying.
                with pytest.raises(RecordingError) as after_call:
                    await pf.execute_if_ready(recorded, sc.BANK_TOOL, call_tool)
                assert calls == ["bank.transfer"]
                assert getattr(after_call.value.outcome, "status", None) == "executed"

                async with answers_on_its_own("stop with the broker gone"):
                    await sink.stop()  # pending messages of an idempotent producer must not hold it open
                assert not sink.started
            finally:
                await asyncio.to_thread(dedicated.stop)


class TestIdempotence:
    """Auto mode: idempotent where the broker allows it, a logged fallback where it does not."""

    @kafka_only
    async def test_auto_mode_is_idempotent_on_apache_kafka(self, sink: KafkaEventSink) -> None:
        assert sink.idempotent

    @kafka_only
    async def test_required_idempotence_starts_on_apache_kafka(self, broker: Broker, topic: str) -> None:
        async with KafkaEventSink(broker.bootstrap_servers, topic, enable_idempotence=True) as required:
            assert required.idempotent

    @tansu_only
    async def test_auto_mode_falls_back_on_tansu_and_warns_once(
        self, broker: Broker, topic: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        sink = KafkaEventSink(broker.bootstrap_servers, topic)
        with caplog.at_level(logging.WARNING, logger="preflight.adapters.kafka"):
            for _ in range(2):
                async with sink:
                    assert not sink.idempotent
                    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), sink=sink)
                    await pf.run_and_record(sc.transfer())
        refused = [r for r in caplog.records if "refused an idempotent producer" in r.getMessage()]
        assert len(refused) == 1
        assert sink.acked_position(KEY) == (0, 1)

    @tansu_only
    async def test_required_idempotence_fails_at_start_on_tansu(self, broker: Broker, topic: str) -> None:
        sink = KafkaEventSink(broker.bootstrap_servers, topic, enable_idempotence=True)
        with pytest.raises(SinkStartError, match="refused an idempotent producer"):
            await sink.start()
        assert not sink.started and not sink.idempotent

    async def test_disabled_idempotence_is_never_asked_for(self, broker: Broker, topic: str) -> None:
        async with KafkaEventSink(broker.bootstrap_servers, topic, enable_idempotence=False) as plain:
            assert plain.started and not plain.idempotent


def test_the_publisher_imports_no_stream_processor_or_database() -> None:
    code = (
        "import sys, preflight.adapters.kafka\n"
        "print(','.join(sorted(n for n in sys.modules if n.split('.')[0] in ('faust', 'mode', 'duckdb', 'pyarrow'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""


def _dump(record: ExecutionRecord) -> dict[str, Any]:
    dumped: dict[str, Any] = record.model_dump(mode="json")
    return dumped
