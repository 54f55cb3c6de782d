"""Integration tests of the brokers in ``infra``: round trips on the selected broker, process hygiene of the
embedded one, and durability and idempotent producing on Apache Kafka (only with PREFLIGHT_BROKER=kafka).

Every wait is bounded by ``asyncio.timeout``; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from infra.brokers import ENV_VAR, Broker, ExternalBroker, broker_from_env, create_topics, delete_topics
from infra.embedded import EmbeddedBroker
from infra.errors import BrokerConfigError, BrokerStartError, BrokerStateError, TopicAdminError
from infra.kafka import ApacheKafkaBroker

pytestmark = pytest.mark.integration

#: Bound on any one produce-or-consume phase of a test.
PHASE_TIMEOUT_S = 60.0

kafka_only = pytest.mark.skipif(
    os.environ.get(ENV_VAR, "").strip().lower() != "kafka",
    reason=f"needs the Apache Kafka broker ({ENV_VAR}=kafka)",
)


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


async def _produce(bootstrap: str, topic: str, count: int, *, idempotent: bool = False) -> list[tuple[int, int]]:
    """Produce ``count`` keyed JSON messages (acks=all); return the (partition, offset) of each."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=idempotent,
        linger_ms=5,
        request_timeout_ms=30_000,
    )
    await producer.start()
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            pending = [
                await producer.send(
                    topic, key=f"agent-{i % 7}".encode(), value=_encode({"seq": i, "agent": f"agent-{i % 7}"})
                )
                for i in range(count)
            ]
            records = await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return [(record.partition, record.offset) for record in records]


async def _consume(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes, dict[str, Any]]]:
    """Read partition 0 of ``topic`` from the start until ``count`` records came; return (offset, key, value)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        group_id=None,
    )
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    await consumer.start()
    received: list[tuple[int, bytes, dict[str, Any]]] = []
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            await consumer.seek_to_beginning(partition)
            while len(received) < count:
                batches = await consumer.getmany(partition, timeout_ms=1_000, max_records=500)
                for message in batches.get(partition, []):
                    received.append((message.offset, message.key, json.loads(message.value)))
    finally:
        await consumer.stop()
    return received


def _assert_in_order(received: list[tuple[int, bytes, dict[str, Any]]], count: int) -> None:
    assert len(received) == count
    assert [value["seq"] for _, _, value in received] == list(range(count))
    assert [key for _, key, _ in received] == [f"agent-{i % 7}".encode() for i in range(count)]
    offsets = [offset for offset, _, _ in received]
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == count


async def test_round_trip_1000_keyed_json_messages_in_order(broker: Broker, topic_name: str) -> None:
    await create_topics(broker.bootstrap_servers, [topic_name], partitions=1)
    try:
        placed = await _produce(broker.bootstrap_servers, topic_name, 1_000)
        assert {partition for partition, _ in placed} == {0}
        assert [offset for _, offset in placed] == sorted(offset for _, offset in placed)

        received = await _consume(broker.bootstrap_servers, topic_name, 1_000)
        _assert_in_order(received, 1_000)
        assert [offset for offset, _, _ in received] == [offset for _, offset in placed]
    finally:
        await delete_topics(broker.bootstrap_servers, [topic_name])


async def test_create_topics_is_idempotent_and_checks_partitions(broker: Broker, topic_name: str) -> None:
    await create_topics(broker.bootstrap_servers, [topic_name], partitions=1)
    try:
        await create_topics(broker.bootstrap_servers, [topic_name], partitions=1)  # exists: fine
        with pytest.raises(TopicAdminError, match="already exists with 1 partitions"):
            await create_topics(broker.bootstrap_servers, [topic_name], partitions=3, timeout_s=10.0)
    finally:
        await delete_topics(broker.bootstrap_servers, [topic_name])
    await delete_topics(broker.bootstrap_servers, [topic_name])  # missing: fine


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_embedded_stop_leaves_no_process() -> None:
    embedded = EmbeddedBroker()
    try:
        embedded.start()
        pid = embedded.pid
        assert pid is not None
        assert not _process_gone(pid)
        assert embedded.bootstrap_servers.startswith("127.0.0.1:")
    finally:
        embedded.stop()
    assert _process_gone(pid)
    assert not Path(f"/proc/{pid}").exists()
    assert embedded.pid is None
    with pytest.raises(BrokerStateError):
        _ = embedded.bootstrap_servers


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_embedded_start_error_when_the_binary_exits(tmp_path: Path) -> None:
    binary = _script(tmp_path / "broken-broker", 'echo "cannot start: simulated failure" >&2\nexit 3')
    broker = EmbeddedBroker(binary=binary, start_timeout=10.0)
    with pytest.raises(BrokerStartError, match="exited with code 3") as caught:
        broker.start()
    assert "simulated failure" in caught.value.log_tail
    assert broker.pid is None


def test_embedded_start_timeout_ends_the_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    binary = _script(tmp_path / "mute-broker", f"echo $$ > {pid_file}\nexec sleep 300")
    broker = EmbeddedBroker(binary=binary, start_timeout=1.0, stop_timeout=5.0)
    with pytest.raises(BrokerStartError, match="did not answer"):
        broker.start()
    assert _process_gone(int(pid_file.read_text()))


def test_broker_from_env_chooses_by_the_one_variable() -> None:
    assert isinstance(broker_from_env({}), EmbeddedBroker)
    assert isinstance(broker_from_env({ENV_VAR: "embedded"}), EmbeddedBroker)
    assert isinstance(broker_from_env({ENV_VAR: "kafka"}), ApacheKafkaBroker)
    external = broker_from_env({ENV_VAR: " localhost:9092 "})
    assert isinstance(external, ExternalBroker)
    assert external.bootstrap_servers == "localhost:9092"
    with pytest.raises(BrokerConfigError):
        broker_from_env({ENV_VAR: "kafak"})


@kafka_only
async def test_kafka_restart_keeps_data(broker: Broker, topic_name: str) -> None:
    assert isinstance(broker, ApacheKafkaBroker)
    address, pid = broker.bootstrap_servers, broker.pid
    await create_topics(broker.bootstrap_servers, [topic_name])
    try:
        await _produce(broker.bootstrap_servers, topic_name, 200)

        await asyncio.to_thread(broker.restart)
        assert broker.bootstrap_servers == address
        assert broker.pid != pid
        assert pid is not None and _process_gone(pid)

        _assert_in_order(await _consume(broker.bootstrap_servers, topic_name, 200), 200)
    finally:
        await delete_topics(broker.bootstrap_servers, [topic_name])


@kafka_only
async def test_kafka_idempotent_producer(broker: Broker, topic_name: str) -> None:
    await create_topics(broker.bootstrap_servers, [topic_name])
    try:
        placed = await _produce(broker.bootstrap_servers, topic_name, 300, idempotent=True)
        assert [offset for _, offset in placed] == list(range(300))
        _assert_in_order(await _consume(broker.bootstrap_servers, topic_name, 300), 300)
    finally:
        await delete_topics(broker.bootstrap_servers, [topic_name])
