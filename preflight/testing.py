"""In-memory adapters for the engine's ports: for tests, demos and single-process use."""

from __future__ import annotations

from collections.abc import Sequence

from preflight.events import PreflightEvent, encode_event
from preflight.records import ExecutionRecord


class MemoryStorage:
    """Append-only records per key; `load` returns only the latest `executed` one."""

    def __init__(self) -> None:
        self._records: dict[str, list[ExecutionRecord]] = {}

    async def persist(self, key: str, record: ExecutionRecord) -> None:
        if not isinstance(record, ExecutionRecord):
            raise TypeError(f"persist expects an ExecutionRecord, got {type(record).__name__}")
        self._records.setdefault(key, []).append(record)

    async def load(self, key: str) -> ExecutionRecord | None:
        for record in reversed(self._records.get(key, [])):
            if record.execution_decision == "executed":
                return record
        return None

    def history(self, key: str) -> list[ExecutionRecord]:
        """Every record under `key`, oldest first (blocks included)."""
        return list(self._records.get(key, []))

    def keys(self) -> list[str]:
        return list(self._records)


class MemoryEventSink:
    """Keeps published events in order, as their encoded bytes would be on the wire."""

    def __init__(self) -> None:
        self.events: list[PreflightEvent] = []
        self.published: list[bytes] = []

    async def publish(self, events: Sequence[PreflightEvent]) -> None:
        encoded = [encode_event(e) for e in events]
        self.events.extend(events)
        self.published.extend(encoded)

    def run(self, run_id: str) -> list[PreflightEvent]:
        return [e for e in self.events if e.run_id == run_id]


class FailingEventSink:
    """A sink that refuses every publish, as a broker that is down would."""

    def __init__(self, message: str = "event log unavailable") -> None:
        self.message = message
        self.attempts = 0

    async def publish(self, events: Sequence[PreflightEvent]) -> None:
        self.attempts += 1
        raise ConnectionError(self.message)
