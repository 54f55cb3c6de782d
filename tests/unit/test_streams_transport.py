"""`streams.transport`: the worker's Faust consumer asks the broker to hold an empty fetch for at most
`FETCH_MAX_WAIT_MS`, where Faust's own asks for 1,500 ms. Built without a broker (nothing connects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faust

from streams import transport
from streams.app import create_app
from streams.settings import WorkerSettings


async def _fetch_wait_ms(app: faust.App) -> int:
    """The fetch wait of the aiokafka consumer `app`'s Faust consumer would start (built, never started)."""
    faust_consumer: Any = app.consumer
    consumer: Any = faust_consumer._thread._create_worker_consumer(app.transport)
    try:
        wait: int = consumer._fetch_max_wait_ms
        return wait
    finally:
        await consumer.stop()


async def test_the_worker_holds_an_empty_fetch_for_at_most_the_bound(tmp_path: Path) -> None:
    app = create_app(WorkerSettings(data_dir=tmp_path, app_id="test-fetch-wait", partitions=2))
    assert isinstance(app.transport, transport.Transport)
    assert await _fetch_wait_ms(app) == transport.FETCH_MAX_WAIT_MS


async def test_fausts_own_consumer_holds_it_longer(tmp_path: Path) -> None:
    """What the bound replaces (if Faust's default ever comes down to it, the transport has no reason left)."""
    plain = faust.App("test-fetch-wait-plain", broker="kafka://127.0.0.1:9092", datadir=str(tmp_path))
    assert await _fetch_wait_ms(plain) > transport.FETCH_MAX_WAIT_MS
    installed = faust.App("test-fetch-wait-installed", broker="kafka://127.0.0.1:9092", datadir=str(tmp_path))
    transport.install(installed)  # as `bench/faust_floor.py` does
    assert await _fetch_wait_ms(installed) == transport.FETCH_MAX_WAIT_MS
