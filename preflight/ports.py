"""The engine's ports: where records are kept and where events go. Adapters live elsewhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from preflight.events import PreflightEvent
from preflight.records import ExecutionRecord


@runtime_checkable
class Storage(Protocol):
    """Append-only record store keyed by `action_key`.

    `persist` appends; `load` returns the latest record under the key whose decision is `executed`
    (the tier-4 baseline), or None. Nothing else may ever be returned as a baseline.
    """

    async def persist(self, key: str, record: ExecutionRecord) -> None: ...

    async def load(self, key: str) -> ExecutionRecord | None: ...


@runtime_checkable
class EventSink(Protocol):
    """Where a run's events go. `publish` returns only once every event is durable, in order;
    if it cannot guarantee that it must raise, and the caller treats the run as not recorded."""

    async def publish(self, events: Sequence[PreflightEvent]) -> None: ...
