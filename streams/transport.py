"""The Faust transport the worker consumes through: Faust's aiokafka transport with a bounded fetch wait.

Faust's aiokafka consumer asks the broker to hold a fetch for up to 1,500 ms when the fetch finds no new
records. aiokafka keeps one fetch per broker in flight and sends the next one for every partition with no
records buffered, so once the records of one partition have waited a moment to be taken (the fold, or
Faust's own per-message path, is busy), a fetch goes out for the other partitions alone -- the group's
leader partition (``<app>-__assignor-__leader``, always empty) or a partition at its end -- and the broker
holds it: every partition of that broker, backlog or not, then gets nothing for up to 1.5 s. Measured on
the embedded broker (`bench/fold.py`), those stalls were most of the worker's wait for its batches and the
reason a bare Faust agent swung between 8k and 42k events/s. `FETCH_MAX_WAIT_MS` bounds them.

`install(app)` gives an app this transport; the worker (`streams.app.create_app`) and the bench's bare
Faust agent (`bench/faust_floor.py`) both use it, so they are measured on the same consumer.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

#: The longest the broker may hold a fetch that finds nothing new: how long partitions with a backlog can
#: wait behind a fetch of partitions without one. An idle consumer then asks about ten times a second.
FETCH_MAX_WAIT_MS = 100


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Faust passes a fixed 1,500 ms and has no setting for it; aiokafka reads it when the consumer starts.
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    """Faust's aiokafka transport whose consumer waits at most `FETCH_MAX_WAIT_MS` for a fetch."""

    Consumer = _Consumer


def install(app: faust.App) -> None:
    """Make `app` consume through `Transport` (before anything has started its consumer)."""
    app.transport = Transport(app.conf.broker_consumer, app)
