"""The floor of a Faust worker on this topic: an agent that takes batches and only counts them.

Started by `bench/fold.py` as ``python bench/faust_floor.py worker -l info --web-port P`` with the
topic and broker in ``FLOOR_*`` variables; ``GET /floor`` answers the messages counted per partition
and the wall-clock window between the first and the last batch. No table, no decode, no fold: what
is left is Faust's own cost per message (consumer, conductor, stream, acks), the ceiling for any
worker built on it.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import faust
from faust.web import Request, Response, View

from streams import transport

app = faust.App(
    os.environ.get("FLOOR_APP_ID", "bench-faust-floor"),
    broker=f"kafka://{os.environ.get('FLOOR_BROKER', '127.0.0.1:9092')}",
    store="memory://",
    datadir=os.environ.get("FLOOR_DATA_DIR", "var/floor"),
    autodiscover=False,
    broker_session_timeout=10,
    topic_partitions=int(os.environ.get("FLOOR_PARTITIONS", "1")),
    topic_replication_factor=1,
    consumer_auto_offset_reset="earliest",
)
transport.install(app)  # the worker's consumer (`streams.transport`): measured on the same fetches
topic = app.topic(
    os.environ.get("FLOOR_TOPIC", "bench.floor"),
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
counted: Counter[int] = Counter()
window: dict[str, float] = {}


@app.agent(topic, name="count")
async def count(stream: Any) -> None:
    async for batch in stream.take_events(5000, within=0.2):
        now = time.time()
        window.setdefault("first", now)
        for event in batch:
            counted[event.message.partition] += 1
        window["last"] = now


@app.page("/floor")
class Floor(View):
    async def get(self, request: Request) -> Response:
        return self.json({"counted": {str(p): n for p, n in counted.items()}, **window})


if __name__ == "__main__":
    app.main()
