"""The port contracts run against the in-memory adapters."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from preflight import MemoryEventSink, MemoryStorage
from preflight.events import PreflightEvent
from tests.contract.storage_contract import EventSinkContract, ReadBack, StorageContract


class TestMemoryStorage(StorageContract):
    @pytest.fixture
    def storage(self) -> MemoryStorage:
        return MemoryStorage()


class TestMemoryEventSink(EventSinkContract):
    @pytest.fixture
    def sink(self) -> MemoryEventSink:
        return MemoryEventSink()

    @pytest.fixture
    def read_back(self, sink: MemoryEventSink) -> ReadBack:
        async def read() -> Sequence[PreflightEvent]:
            return list(sink.events)

        return read
