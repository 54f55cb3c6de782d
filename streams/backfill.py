"""Read back offsets the worker's consumer skipped, so that the fold never folds past a hole.

Faust's consumer decides where a partition resumes from its committed offsets, and after a restart
those were seen to skip messages (SPEC §7). The fold keeps its own watermark per partition; when the
next message Faust delivers is beyond the watermark + 1, the worker reads the hole back with this
standalone consumer (no group, no commits) before folding on. Offsets the log no longer holds (deleted
by retention, compacted away, transaction markers) come back as `Missing`, never silently dropped.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.client import AIOKafkaClient

from streams.batch import Incoming, Missing
from streams.errors import BackfillError, TopologyError


class Backfill:
    """A lazily started, group-less consumer of the events topic, for reading offset ranges back."""

    def __init__(self, bootstrap_servers: str, topic: str, *, timeout_s: float = 30.0) -> None:
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._timeout = timeout_s
        self._consumer: Any = None
        self._lock = asyncio.Lock()

    async def _started(self) -> Any:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self._bootstrap,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                client_id=f"{self._topic}-backfill",
                request_timeout_ms=int(self._timeout * 1000),
                fetch_max_wait_ms=100,
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def partition_count(self) -> int | None:
        """The events topic's partition count, or None when the broker does not list the topic.

        Asks for the metadata of all topics: a request naming the topic could create it implicitly."""
        client = AIOKafkaClient(bootstrap_servers=self._bootstrap, request_timeout_ms=int(self._timeout * 1000))
        try:
            async with asyncio.timeout(self._timeout):
                await client.bootstrap()
                cluster = await client.fetch_all_metadata()
        finally:
            await client.close()
        partitions = cluster.partitions_for_topic(self._topic)
        return len(partitions) if partitions else None

    async def check_partitions(self, expected: int) -> None:
        """Raise `TopologyError` unless the events topic exists with `expected` partitions."""
        count = await self.partition_count()
        if count is None:
            raise TopologyError(f"the events topic {self._topic!r} does not exist: create it explicitly")
        if count != expected:
            raise TopologyError(
                f"the events topic {self._topic!r} has {count} partitions but the worker is set for {expected}"
                " (PREFLIGHT_EVENTS_PARTITIONS): the changelog must match the source topic"
            )

    async def end_offsets(self, partitions: int) -> dict[int, int]:
        """Each partition's log end offset (one past the last record), from a fetch's high watermark.

        Not from ListOffsets: Tansu 0.6 answers it with the base offset of the partition's last batch,
        short of the real end (this also makes Faust's table recovery stop before a changelog's last batch).
        """
        async with self._lock:
            consumer = await self._started()
            tps = [TopicPartition(self._topic, p) for p in range(partitions)]
            async with asyncio.timeout(self._timeout):
                consumer.assign(tps)
                listed = await consumer.end_offsets(tps)
                for tp in tps:
                    consumer.seek(tp, listed[tp])  # at or before the real end on every broker seen
                while any(consumer.highwater(tp) is None for tp in tps):
                    await consumer.getmany(*tps, timeout_ms=200)
                return {tp.partition: int(consumer.highwater(tp)) for tp in tps}

    async def read(self, partition: int, start: int, end: int) -> list[Incoming | Missing]:
        """Every offset in [start, end) of `partition`, as `Incoming` records or `Missing` ranges.

        :raises BackfillError: when the range cannot be read completely within the timeout.
        """
        if end <= start:
            return []
        async with self._lock:
            consumer = await self._started()
            tp = TopicPartition(self._topic, partition)
            items: list[Incoming | Missing] = []
            cursor = start
            try:
                async with asyncio.timeout(self._timeout):
                    consumer.assign([tp])
                    first = (await consumer.beginning_offsets([tp]))[tp]
                    if first > start:
                        items.append(Missing(partition, start, min(first, end)))
                        cursor = min(first, end)
                    if cursor < end:
                        consumer.seek(tp, cursor)
                    while cursor < end:
                        batches = await consumer.getmany(tp, timeout_ms=200, max_records=5000)
                        for record in batches.get(tp, ()):
                            if record.offset >= end:
                                break
                            if record.offset < cursor:
                                continue
                            if record.offset > cursor:
                                items.append(Missing(partition, cursor, record.offset))
                            items.append(Incoming(partition, record.offset, record.key, record.value))
                            cursor = record.offset + 1
                        if cursor < end:
                            position = await consumer.position(tp)
                            if position >= end:  # the rest of the range holds no records
                                items.append(Missing(partition, cursor, end))
                                cursor = end
            except TimeoutError as exc:
                raise BackfillError(
                    f"offsets {start}..{end - 1} of {self._topic}[{partition}] could not be read back within"
                    f" {self._timeout:g} s (read up to {cursor - 1})"
                ) from exc
            return items

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
