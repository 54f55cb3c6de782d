"""Which broker the tests and the demo use, and the topic helpers every user of a broker needs.

One environment variable, ``PREFLIGHT_BROKER``, chooses the broker:

* unset, empty or ``embedded`` -- an :class:`~infra.embedded.EmbeddedBroker` (Tansu, memory only);
* ``kafka`` -- an :class:`~infra.kafka.ApacheKafkaBroker` (KRaft, one node);
* anything else -- the bootstrap address (``host:port[,host:port...]``) of a broker that is already
  running: nothing is started or stopped, it is only checked to answer.

Topics are always created explicitly (:func:`create_topics`): Tansu gives an implicitly created topic 4
partitions, and the Apache Kafka broker here does not create topics implicitly at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.metadata import MetadataRequest

from infra._process import StartStop, wait_until_answering
from infra.errors import BrokerConfigError, TopicAdminError
from preflight_settings import SettingValueError, bootstrap_address, env_var, given_settings

#: The one environment variable that picks the broker.
ENV_VAR = env_var("broker")

# Kafka error codes the topic helpers treat as success.
_UNKNOWN_TOPIC_OR_PARTITION = 3
_TOPIC_ALREADY_EXISTS = 36


class Broker(Protocol):
    """What a test or the demo needs of a broker: its address, and a ``with`` block around its life."""

    @property
    def bootstrap_servers(self) -> str:
        """The ``host:port`` clients bootstrap from."""
        ...

    def __enter__(self) -> Broker: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class ExternalBroker(StartStop):
    """A broker somebody else runs: entering checks (bounded) that it answers; nothing is stopped."""

    def __init__(self, bootstrap_servers: str, *, timeout_s: float = 30.0) -> None:
        try:
            self._bootstrap_servers = bootstrap_address(bootstrap_servers)
        except ValueError as exc:
            raise BrokerConfigError(f"{ENV_VAR}={bootstrap_servers!r}: {exc}") from None
        self._timeout = timeout_s

    @property
    def bootstrap_servers(self) -> str:
        """The address as given (whitespace trimmed)."""
        return self._bootstrap_servers

    def start(self) -> Self:
        """Wait (bounded) until the broker answers a metadata request.

        :raises BrokerStartError: when it does not answer within the timeout.
        """
        wait_until_answering(
            self._bootstrap_servers, timeout=self._timeout, what=f"the broker at {self._bootstrap_servers}"
        )
        return self

    def stop(self) -> None:
        """Nothing to do: the broker is not ours."""

    def __repr__(self) -> str:
        return f"ExternalBroker({self._bootstrap_servers})"


def broker_for(spec: str, *, log_dir: Path | None = None) -> Broker:
    """The broker `spec` names -- ``embedded``, ``kafka`` or ``host:port[,host:port...]`` (the setting
    ``broker``) -- not yet started: use it in ``with``. An embedded broker logs to `log_dir` (default: a
    temporary directory removed when it stops).

    :raises BrokerConfigError: when `spec` is neither a broker kind nor an address.
    """
    value = spec.strip()
    kind = value.lower()
    if kind in ("", "embedded"):
        from infra.embedded import EmbeddedBroker

        return EmbeddedBroker(log_dir=log_dir)
    if kind == "kafka":
        from infra.kafka import ApacheKafkaBroker

        return ApacheKafkaBroker()
    return ExternalBroker(value)


def broker_from_env(environ: Mapping[str, str] | None = None) -> Broker:
    """The broker chosen by ``PREFLIGHT_BROKER`` (see the module doc; read through the one settings model,
    `preflight_settings`), not yet started: use it in ``with``.

    :param environ: the environment to read (default: the process environment).
    :raises BrokerConfigError: when the value is neither a broker kind nor an address.
    """
    try:
        given = given_settings(environ, "broker")
    except SettingValueError as exc:
        raise BrokerConfigError(str(exc)) from None
    return broker_for(given.get("broker", "embedded"))


async def _metadata(client: Any) -> dict[str, dict[str, Any]]:
    """All topics the broker lists, by name (a request for all topics never creates one implicitly)."""
    response = await client.send(client.get_random_node(), MetadataRequest(None))
    topics: list[dict[str, Any]] = response.to_object()["topics"]
    return {topic["topic"]: topic for topic in topics}


def _ready(topic: dict[str, Any]) -> bool:
    partitions: list[dict[str, Any]] = topic["partitions"]
    return topic["error_code"] == 0 and bool(partitions) and all(p["leader"] >= 0 for p in partitions)


@asynccontextmanager
async def _admin_session(
    bootstrap: str, timeout_s: float, late: str
) -> AsyncIterator[tuple[AIOKafkaAdminClient, AIOKafkaClient]]:
    """An admin client and a metadata client of `bootstrap`, started; the block runs within `timeout_s` s
    (counted from before they start) and both are closed after it.

    :raises TopicAdminError: with the message `late` when the time runs out.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            await client.bootstrap()
            yield admin, client
    except TimeoutError as exc:
        raise TopicAdminError(late) from exc
    finally:
        await client.close()
        await admin.close()


async def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    *,
    replication_factor: int = 1,
    timeout_s: float = 30.0,
) -> None:
    """Create the topics, and return once every partition of each has a leader.

    Idempotent: a topic that already exists with ``partitions`` partitions is fine (its config is left
    as it is).

    :raises TopicAdminError: when the broker refuses a topic, an existing one has another partition
        count, or the topics are not ready within ``timeout_s`` s.
    """
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return
    late = f"topics {wanted} were not ready within {timeout_s:g} s"
    async with _admin_session(bootstrap, timeout_s, late) as (admin, client):
        new_topics = [
            NewTopic(name, partitions, replication_factor, topic_configs=dict(config or {})) for name in wanted
        ]
        response = await admin.create_topics(new_topics, timeout_ms=int(timeout_s * 1000))
        existing: set[str] = set()
        for result in response.to_object()["topic_errors"]:
            code: int = result["error_code"]
            if code == _TOPIC_ALREADY_EXISTS:
                existing.add(result["topic"])
            elif code != 0:
                raise TopicAdminError(
                    f"creating topic {result['topic']!r} failed: error {code} {result.get('error_message')}"
                )
        while True:
            listed = await _metadata(client)
            for name in existing & listed.keys():
                count = len(listed[name]["partitions"])
                if count != partitions:
                    raise TopicAdminError(f"topic {name!r} already exists with {count} partitions, not {partitions}")
            if all(name in listed and _ready(listed[name]) for name in wanted):
                return
            await asyncio.sleep(0.1)


async def delete_topics(bootstrap: str, names: Iterable[str], *, timeout_s: float = 30.0) -> None:
    """Delete the topics, and return once the broker no longer lists them. A missing topic is fine.

    :raises TopicAdminError: when the broker refuses, or still lists a topic after ``timeout_s`` s.
    """
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return
    late = f"topics {wanted} were still listed after {timeout_s:g} s"
    async with _admin_session(bootstrap, timeout_s, late) as (admin, client):
        response = await admin.delete_topics(wanted, timeout_ms=int(timeout_s * 1000))
        for result in response.to_object()["topic_error_codes"]:
            code: int = result["error_code"]
            if code not in (0, _UNKNOWN_TOPIC_OR_PARTITION):
                raise TopicAdminError(f"deleting topic {result['topic']!r} failed: error {code}")
        while True:  # deletion completes asynchronously in Kafka: poll the metadata
            if not (await _metadata(client)).keys() & set(wanted):
                return
            await asyncio.sleep(0.1)


async def publish_messages(
    bootstrap_servers: str, topic: str, messages: Sequence[tuple[bytes, bytes]], window: int = 5000
) -> dict[int, int]:
    """Publish pre-encoded `(key, value)` messages with acks=all, at most `window` unacknowledged at a
    time, and return each partition's end offset after them (for benchmarks and loads)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers,
        acks="all",
        linger_ms=20,
        max_batch_size=1 << 20,
        max_request_size=4 << 20,
    )
    await producer.start()
    ends: dict[int, int] = {}

    async def settle(pending: list[Any]) -> None:
        for metadata in await asyncio.gather(*pending):
            ends[metadata.partition] = max(ends.get(metadata.partition, 0), metadata.offset + 1)

    try:
        pending: list[Any] = []
        for key, value in messages:
            pending.append(await producer.send(topic, key=key, value=value))
            if len(pending) >= window:
                await settle(pending)
                pending = []
        await settle(pending)
    finally:
        await producer.stop()
    return ends
