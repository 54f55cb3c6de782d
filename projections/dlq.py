"""The projector's dead-letter topic: every message it cannot project, also published to Kafka.

A dead letter is first a row in `dead_letters` (`projections.store`); the projector also publishes it
to a topic (default ``<events topic>.projector.dlq``, one partition, declared at start if missing) as
the fold worker publishes its own: a JSON record with the original key and value in base64, the reason
and where the message was read (`record`; the same shape as `streams.batch.DeadLetter.record`, copied
here so the projections never import the worker). The reason starts with the projector's code
(``event_id_reused: ...``), which also travels as the header ``dead_letter_code``.

Ordering: the writer inserts a batch's dead letters, publishes the ones the table did not hold yet
(``INSERT ... RETURNING``), waits for the broker's acknowledgement (acks=all), and only then writes the
offsets and commits. So an acknowledged record always precedes the commit that covers its message;
a crash in between loses nothing and the message is dead-lettered again after the restart, which
publishes it a second time: the topic is at least once. A consumer deduplicates by
(``topic``, ``partition``, ``offset``). A message read again after its dead letter was committed
(`reset_offsets`, a second projection name) finds its row and is not published again.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from projections.errors import BrokerError

__all__ = ["DEAD_LETTER_VERSION", "DeadLetter", "DeadLetterPublisher", "default_dead_letter_topic"]

#: The record's version, as the fold worker's (`streams.batch.DEAD_LETTER_VERSION`).
DEAD_LETTER_VERSION: Final = 1
#: Kafka's error code for a topic that already exists.
_TOPIC_ALREADY_EXISTS: Final = 36


def default_dead_letter_topic(events_topic: str) -> str:
    """The projector's dead-letter topic for `events_topic` when none is configured."""
    return f"{events_topic}.projector.dlq"


class DeadLetter(NamedTuple):
    """A dead-lettered message as the writer reads it back from `dead_letters` (RETURNING)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    code: str
    reason: str

    def record(self) -> dict[str, Any]:
        """The dead-letter topic's JSON record: the original bytes in base64, the reason, the source."""
        key_text: str | None
        try:
            key_text = self.key.decode("utf-8") if self.key is not None else None
        except UnicodeDecodeError:
            key_text = None
        return {
            "dead_letter_version": DEAD_LETTER_VERSION,
            "reason": f"{self.code}: {self.reason}",
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "end_offset": None,
            "key": key_text,
            "key_b64": base64.b64encode(self.key).decode("ascii") if self.key is not None else None,
            "value_b64": base64.b64encode(self.value).decode("ascii") if self.value is not None else None,
        }

    def encode(self) -> bytes:
        return json.dumps(self.record(), sort_keys=True, separators=(",", ":")).encode()


class DeadLetterPublisher:
    """Publishes dead letters to one topic with acks=all; `publish` returns once every one is acknowledged.

    Tansu refuses idempotent producers (SPEC §7), so a retried send may duplicate a record; so may a crash
    between the acknowledgement and the commit. Records are keyed by the original message's key.
    """

    def __init__(self, bootstrap_servers: str, topic: str, *, timeout_s: float = 30.0) -> None:
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._timeout_s = timeout_s
        self._producer: AIOKafkaProducer | None = None

    @property
    def topic(self) -> str:
        return self._topic

    async def start(self) -> None:
        """Declare the topic (one partition) if the broker does not list it, and connect.

        :raises BrokerError: when the broker does not answer or refuses the topic.
        """
        producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap,
            acks="all",
            enable_idempotence=False,
            request_timeout_ms=int(self._timeout_s * 1000),
        )
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._declare()
                await producer.start()
        except BaseException as exc:
            await producer.stop()
            if isinstance(exc, (TimeoutError, KafkaError)):
                raise BrokerError(f"cannot publish to the dead-letter topic {self._topic!r}: {exc!r}") from exc
            raise
        self._producer = producer

    async def _declare(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap, request_timeout_ms=int(self._timeout_s * 1000))
        await admin.start()
        try:
            if self._topic in set(await admin.list_topics()):
                return
            response = await admin.create_topics([NewTopic(self._topic, 1, 1)])
            for result in response.to_object()["topic_errors"]:
                code: int = result["error_code"]
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise BrokerError(
                        f"creating the dead-letter topic {self._topic!r} failed: error {code}"
                        f" {result.get('error_message')}; create it (one partition) and start again"
                    )
        finally:
            await admin.close()

    async def publish(self, letters: Sequence[DeadLetter]) -> None:
        """Send every letter and wait until the broker has acknowledged each.

        :raises BrokerError: when a send fails or is not acknowledged within the timeout.
        """
        producer = self._producer
        if producer is None:
            raise RuntimeError("the dead-letter publisher is not started")
        try:
            async with asyncio.timeout(self._timeout_s):
                sent = [
                    await producer.send(
                        self._topic,
                        key=letter.key,
                        value=letter.encode(),
                        headers=[("dead_letter_code", letter.code.encode())],
                    )
                    for letter in letters
                ]
                await asyncio.gather(*sent)
        except (TimeoutError, KafkaError) as exc:
            raise BrokerError(
                f"publishing {len(letters)} dead letter(s) to {self._topic!r} failed ({exc!r});"
                " the batch was rolled back: start the projector again once the broker answers"
            ) from exc

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
