"""Contract suites for the engine's ports, run against every adapter (in-memory now, real ones later).

An adapter's test module subclasses a suite and provides the fixture it names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from preflight import ExecutionRecord, MemoryStorage, Preflight, create_preflight
from preflight import scenario as sc
from preflight.events import PreflightEvent, verify_run
from preflight.ports import EventSink, Storage

ReadBack = Callable[[], Awaitable[Sequence[PreflightEvent]]]


async def _records(pf: Preflight) -> dict[str, ExecutionRecord]:
    """An ask, an execute that is executed, and a failed execution, all for one key, via the engine."""
    asked = await pf.run_and_record(sc.transfer())
    ready = await pf.run_and_record(sc.transfer(user_answers={"to_account": "2200119"}))
    executed = (await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda n, a: "ok")).state
    again = await pf.run_and_record(sc.transfer(user_answers={"to_account": "3300228"}))

    def boom(name: str, args: dict[str, Any]) -> Any:
        raise RuntimeError("provider error")

    failed = (await pf.execute_if_ready(again, sc.BANK_TOOL, boom)).state
    return {"asked": asked, "executed": executed, "failed": failed}


class StorageContract:
    """`persist` appends; `load` returns the latest executed record of a key, nothing else.

    `engine` builds the engine the suite drives; an adapter whose records travel through a sink (the
    worker's baseline view) overrides it to pass that sink too.
    """

    def engine(self, storage: Storage) -> Preflight:
        return create_preflight(hooks=sc.hooks(), storage=storage)

    async def test_load_of_an_unknown_key_is_none(self, storage: Storage) -> None:
        assert await storage.load("nobody:nothing") is None

    async def test_load_returns_the_latest_executed_record_only(self, storage: Storage) -> None:
        records = await _records(self.engine(storage))
        loaded = await storage.load("u_01:bank.transfer")
        assert loaded is not None
        assert loaded.execution_decision == "executed"
        assert loaded.model_dump(mode="json") == records["executed"].model_dump(mode="json")

    async def test_blocks_never_become_a_baseline(self, storage: Storage) -> None:
        pf = self.engine(storage)
        await pf.run_and_record(sc.transfer(user_id="u_02"))
        await pf.run_and_record(sc.transfer(user_id="u_02", user_answers={"to_account": "1"}))
        assert await storage.load("u_02:bank.transfer") is None


class EventSinkContract:
    """`publish` keeps every event of a run, in order, intact (the chain verifies after reading back)."""

    async def test_published_runs_read_back_in_order(self, sink: EventSink, read_back: ReadBack) -> None:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), sink=sink)
        first = await pf.run_and_record(sc.transfer())
        second = await pf.run_and_record(sc.transfer(user_answers={"to_account": "1"}))
        await pf.execute_if_ready(second, sc.BANK_TOOL, lambda n, a: "ok")
        events = await read_back()
        for state in (first, second):
            assert state.run_ref is not None
            run = [e for e in events if e.run_id == state.run_ref.run_id]
            verify_run(run)
        assert events[-1].event_type == "executed"
