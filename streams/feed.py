"""The worker's own reader of the events partitions it owns: the log in batches, not Faust's stream.

Faust's consumer hands an agent one message at a time (its consumer thread's fetcher, the conductor, a
stream, an acknowledgement each): in `bench/fold.py` that costs the worker about as much CPU an event as a
bare Faust agent costs in all. Once an assignment is caught up, the worker pauses its events partitions
in Faust's consumer and reads them with this group-less aiokafka consumer instead, from where its table
has folded them, a fetch's records at a time (`Folder.follow`). Faust keeps what it is there for: the
group's membership and assignments, the table and its changelog, and the consumer through which the
worker commits what it has stored.

The reader decides nothing: the worker folds what it returns exactly as it folds what Faust delivers
(`Folder._fold_partition`): a record at or below the watermark is skipped, offsets it did not return are
read back from the log (`streams.backfill`) before anything past them is folded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.batch import Incoming
from streams.transport import FETCH_MAX_WAIT_MS


class Feed:
    """A group-less consumer of some partitions of one topic, started at given offsets."""

    def __init__(self, bootstrap_servers: str, topic: str, *, max_records: int, client_id: str) -> None:
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._max_records = max_records
        self._client_id = client_id
        self._consumer: Any = None

    @property
    def started(self) -> bool:
        return self._consumer is not None

    async def start(self, positions: Mapping[int, int]) -> None:
        """Read `positions` (partition -> the next offset to read) from there on."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # an offset the log no longer holds: its first (the fold names the gap)
            client_id=self._client_id,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        )
        await consumer.start()
        self._consumer = consumer
        try:
            consumer.assign([TopicPartition(self._topic, p) for p in positions])
            for partition, offset in positions.items():
                self.seek(partition, offset)
        except BaseException:
            await self.stop()
            raise

    def seek(self, partition: int, offset: int) -> None:
        """Read `partition` from `offset` on (its records already fetched are dropped)."""
        self._consumer.seek(TopicPartition(self._topic, partition), offset)

    async def next(self, timeout_s: float) -> dict[int, list[Incoming]]:
        """The records fetched since the last call (at most `max_records`), by partition in offset order;
        waits up to `timeout_s` when none are."""
        batches = await self._consumer.getmany(timeout_ms=int(timeout_s * 1000), max_records=self._max_records)
        return {
            tp.partition: [Incoming(tp.partition, r.offset, r.key, r.value) for r in records]
            for tp, records in batches.items()
            if records
        }

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
